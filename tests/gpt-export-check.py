#!/usr/bin/python3
"""Load a GPT that `ravnestctl export` wrote as safetensors into the PyTorch
model of tests/gpt-reference.py and print the logits of the byte after a
prompt, one per line, as `ravnestctl generate --logits` prints them.

    gpt-export-check.py MODEL.safetensors CONTEXT HEADS PROMPT

The file is read by hand (an 8-byte little-endian header length, a JSON
header, the tensors' bytes), so the check does not need the safetensors
package, only what the format says.
"""
import importlib.util
import json
import os
import struct
import sys

import numpy as np
import torch


def load_reference():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("gpt_reference", os.path.join(here, "gpt-reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", name
        b, e = t["data_offsets"]
        tensors[name] = torch.from_numpy(np.frombuffer(body[b:e], dtype="<f4").copy()).view(*t["shape"])
    return tensors


def main():
    path, T, NH, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
    w = read_safetensors(path)
    V, C = w["wte.weight"].shape
    L = sum(1 for k in w if k.endswith(".ln_1.weight"))
    model = load_reference().GPT(V, T, C, L, NH)
    with torch.no_grad():
        model.wte.weight.copy_(w["wte.weight"])
        model.wpe.weight.copy_(w["wpe.weight"])
        for i, b in enumerate(model.blocks):
            h = "h.%d." % i
            pairs = [(b.ln1, "ln_1"), (b.c_attn, "attn.c_attn"), (b.c_proj, "attn.c_proj"), (b.ln2, "ln_2"),
                     (b.c_fc, "mlp.c_fc"), (b.c_fcproj, "mlp.c_proj")]
            for mod, name in pairs:
                mod.weight.copy_(w[h + name + ".weight"])
                mod.bias.copy_(w[h + name + ".bias"])
        model.lnf.weight.copy_(w["ln_f.weight"])
        model.lnf.bias.copy_(w["ln_f.bias"])
        model.head.weight.copy_(w["lm_head.weight"])
        ids = list(prompt[-T:])
        logits = model(torch.tensor([ids], dtype=torch.long))[0, len(ids) - 1]
    for v in logits.tolist():
        print("%.9g" % v)


if __name__ == "__main__":
    main()
