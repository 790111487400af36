#!/usr/bin/python3
"""Train the GPT of a ravnest job in PyTorch the way ravnestd trains it on one
node, and print the validation loss after each epoch: the reference that
tests/integration/test-gpt.c holds ravnest's validation loss against.

    gpt-train-reference.py CORPUS CONTEXT LAYERS HEADS DIM BATCH EPOCHS LR WD SCHEDULE SEED [THREADS [WARMUP]]

The same data as ravnest's text datasets (data/text.c): the corpus's bytes,
the last 5 % the validation split; a sample is the window of CONTEXT bytes
at a multiple of CONTEXT, its targets the next bytes; every epoch visits
every training window once in a new random order, in batches of BATCH (the
last one smaller). The same model (tests/gpt-reference.py: GPT-2's
pre-LayerNorm blocks, untied head), initialized as ravnest does (normal,
std 0.02; residual projections scaled by 1/sqrt(2 LAYERS); biases 0,
LayerNorm 1 and 0), the same AdamW (betas 0.9, 0.999, eps 1e-8, the same
decay on every parameter), the same schedule (the rate rising linearly to
LR over the first WARMUP steps, default 0, then constant, or cosine from LR
to 0 over the steps left). Only the random numbers differ.
"""
import importlib.util
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def reference():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("gpt_reference", os.path.join(here, "gpt-reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def read_corpus(path):
    if os.path.isdir(path):  # as data/text.c: regular text files by name
        data = b""
        for name in sorted(os.listdir(path)):
            p = os.path.join(path, name)
            if name.startswith(".") or os.path.islink(p) or not os.path.isfile(p):
                continue
            b = open(p, "rb").read()
            try:
                if b and b"\0" not in b:
                    b.decode("utf-8")
                    data += b
            except UnicodeDecodeError:
                pass
        return data
    return open(path, "rb").read()


def windows(data, T):
    n = (len(data) - 1) // T
    a = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    x = np.stack([a[i * T:(i + 1) * T] for i in range(n)])
    y = np.stack([a[i * T + 1:(i + 1) * T + 1] for i in range(n)])
    return torch.from_numpy(x), torch.from_numpy(y)


def init(model, L):
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.zeros_(p)
        elif "ln" in name:
            torch.nn.init.ones_(p)
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "c_fcproj.weight")) else 0.02
            torch.nn.init.normal_(p, 0.0, std)


def rate(lr, schedule, warmup, t, total):
    """The learning rate of step t (0-based), as optim.c's lr_schedule_at()."""
    if t < warmup:
        return lr * (t + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return lr
    return 0.5 * lr * (1 + math.cos(math.pi * (min(t, total) - warmup) / (total - warmup)))


def main():
    a = sys.argv[1:]
    corpus, T, L, NH, C, B, epochs = a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6])
    lr, wd, schedule, seed = float(a[7]), float(a[8]), a[9], int(a[10])
    torch.set_num_threads(int(a[11]) if len(a) > 11 else 2)
    warmup = int(a[12]) if len(a) > 12 else 0
    torch.manual_seed(seed)
    data = read_corpus(corpus)
    valid = len(data) // 20
    xt, yt = windows(data[:len(data) - valid], T)
    xv, yv = windows(data[len(data) - valid:], T)
    model = reference().GPT(256, T, C, L, NH)
    init(model, L)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    steps = (len(xt) + B - 1) // B
    total = steps * epochs
    for epoch in range(epochs):
        order = torch.randperm(len(xt))
        model.train()
        for s in range(steps):
            t = epoch * steps + s
            for g in opt.param_groups:
                g["lr"] = rate(lr, schedule, warmup, t, total)
            idx = order[s * B:(s + 1) * B]
            loss = F.cross_entropy(model(xt[idx]).view(-1, 256), yt[idx].view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            vl = sum(F.cross_entropy(model(xv[i:i + B]).view(-1, 256), yv[i:i + B].view(-1)).item() * len(xv[i:i + B])
                     for i in range(0, len(xv), B)) / len(xv)
        print("epoch %d validation loss %.4f" % (epoch + 1, vl), flush=True)


if __name__ == "__main__":
    main()
