#!/usr/bin/python3
"""PyTorch reference for tests/unit/test-gpt.c, in the manner of llm.c's
test_gpt2: the C test writes a GPT's weights (ravnest's slab, initialized by
ravnest) and a batch; this script builds the same model in PyTorch, loads the
weights, and writes back the logits, the loss, every gradient, and the losses
of a few AdamW steps on the same batch.

    gpt-reference.py IN OUT

IN (native byte order, int32 and float32):
    int32  magic 0x47505431 ("GPT1"), V, T, C, L (blocks), NH, B, steps
    float  lr, beta1, beta2, eps, weight_decay
    float  params   ravnest's slab: embed wte (V,C), wpe (T,C); per block ln1w,
                    ln1b, qkvw (3C,C), qkvb, attprojw (C,C), attprojb, ln2w,
                    ln2b, fcw (4C,C), fcb, fcprojw (C,4C), fcprojb; lm_head
                    lnfw, lnfb, W (V,C)
    int32  ids (B,T), targets (B,T)
OUT:
    float  logits (B,T,V), loss, grads (same order as params), losses (steps)
           where losses[i] is the loss before AdamW step i + 1.

AdamW is torch.optim.AdamW with the same decay on every parameter.
"""
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_fcproj = nn.Linear(4 * C, C)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.c_fcproj(self.gelu(self.c_fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, V, T, C, L, NH):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))

    def slab_order(self):
        """The parameters in ravnest's slab order."""
        out = [self.wte.weight, self.wpe.weight]
        for b in self.blocks:
            out += [b.ln1.weight, b.ln1.bias, b.c_attn.weight, b.c_attn.bias, b.c_proj.weight,
                    b.c_proj.bias, b.ln2.weight, b.ln2.bias, b.c_fc.weight, b.c_fc.bias,
                    b.c_fcproj.weight, b.c_fcproj.bias]
        return out + [self.lnf.weight, self.lnf.bias, self.head.weight]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    data = open(src, "rb").read()
    magic, V, T, C, L, NH, B, steps = struct.unpack("=8i", data[:32])
    if magic != 0x47505431:
        raise SystemExit(f"{src}: bad magic {magic:#x}")
    lr, beta1, beta2, eps, wd = struct.unpack("=5f", data[32:52])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(V, T, C, L, NH)
    params = model.slab_order()
    n = sum(p.numel() for p in params)
    off = 52
    slab = np.frombuffer(data, dtype=np.float32, count=n, offset=off)
    off += 4 * n
    ids = np.frombuffer(data, dtype=np.int32, count=B * T, offset=off).reshape(B, T)
    off += 4 * B * T
    targets = np.frombuffer(data, dtype=np.int32, count=B * T, offset=off).reshape(B, T)
    with torch.no_grad():
        k = 0
        for p in params:
            p.copy_(torch.from_numpy(slab[k:k + p.numel()].copy()).view_as(p))
            k += p.numel()
    x = torch.from_numpy(ids.astype(np.int64))
    y = torch.from_numpy(targets.astype(np.int64))

    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    first = (logits.detach(), loss.item(), grads.detach())

    opt = torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).view(-1, V), y.view(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())

    with open(dst, "wb") as f:
        f.write(first[0].numpy().astype(np.float32).tobytes())
        f.write(struct.pack("=f", first[1]))
        f.write(first[2].numpy().astype(np.float32).tobytes())
        f.write(np.array(losses, dtype=np.float32).tobytes())


if __name__ == "__main__":
    main()
