#!/usr/bin/python3
"""PyTorch reference for bench-gpt: the same GPT (tests/gpt-reference.py's
model: token + position embedding, pre-LN blocks with causal attention and
a tanh-GELU MLP, final LayerNorm, untied head), the same batch shape and
AdamW, trained on CPU; prints tokens/s of whole training steps (forward,
cross-entropy over every position, backward, AdamW):

    RESULT tokens_per_sec=<median over the timed steps> steps=<n>

    torch-gpt.py --vocab 256 --context 128 --layers 4 --heads 4 --dim 128 \\
                 --batch 8 --steps 10 --threads 2

Run it with Debian's /usr/bin/python3 (python3-torch).
"""
import argparse
import importlib.util
import os
import sys
import time

import torch
import torch.nn.functional as F


def load_reference():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt-reference.py")
    spec = importlib.util.spec_from_file_location("gpt_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--foreach", action="store_true", help="AdamW's multi-tensor path")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    ref = load_reference()
    model = ref.GPT(a.vocab, a.context, a.dim, a.layers, a.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1,
                            foreach=True if a.foreach else None)
    g = torch.Generator().manual_seed(a.seed)
    seq = torch.randint(0, a.vocab, (a.batch, a.context + 1), generator=g)
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    rates = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, a.vocab), y.view(-1))
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            rates.append(a.batch * a.context / dt)
        print(f"step {step + 1}: loss {loss.item():.4f}, {a.batch * a.context / dt:.0f} tokens/s",
              file=sys.stderr, flush=True)
    rates.sort()
    print(f"RESULT tokens_per_sec={rates[len(rates) // 2]:.1f} steps={a.steps}", flush=True)


if __name__ == "__main__":
    main()
