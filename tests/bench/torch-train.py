#!/usr/bin/python3
"""PyTorch reference for bench-train: the same model, data, optimizer, seed
policy and schedule as a ravnest job, trained on CPU.

Reads the job's essentials from the command line (bench-train passes them),
loads the same IDX files, normalizes the same way, and prints one line:

    RESULT samples_per_sec=<median over epochs> test_acc=<after last epoch> epochs=<n>

Run it with Debian's /usr/bin/python3 (python3-torch).
"""
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(dir_, split, what):
    p = os.path.join(dir_, f"{split}-{what}")
    return p + ".gz" if os.path.exists(p + ".gz") else p


def load(dir_, split, mean, std):
    x = read_idx(find(dir_, split, "images-idx3-ubyte")).astype(np.float32) / 255.0
    y = read_idx(find(dir_, split, "labels-idx1-ubyte")).astype(np.int64)
    x = (x - mean) / std
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


def build(layers):
    """layers: comma list like flatten,linear:1024,relu,conv2d:16:3:1:1,maxpool2d:2"""
    mods, shape = [], (1, 28, 28)
    for spec in layers.split(","):
        kind, *args = spec.split(":")
        args = [int(a) for a in args]
        if kind == "flatten":
            mods.append(nn.Flatten())
            shape = (shape[0] * shape[1] * shape[2], 1, 1)
        elif kind == "linear":
            mods.append(nn.Linear(shape[0], args[0]))
            shape = (args[0], 1, 1)
        elif kind == "relu":
            mods.append(nn.ReLU())
        elif kind == "gelu":
            mods.append(nn.GELU())
        elif kind == "conv2d":
            out, k, s, p = args
            mods.append(nn.Conv2d(shape[0], out, k, s, p))
            shape = (out, (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1)
        elif kind == "maxpool2d":
            k, s = args[0], args[1] if len(args) > 1 else args[0]
            mods.append(nn.MaxPool2d(k, s))
            shape = (shape[0], (shape[1] - k) // s + 1, (shape[2] - k) // s + 1)
        else:
            raise SystemExit(f"unknown layer {kind}")
    return nn.Sequential(*mods)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mean", type=float, default=0.0)
    ap.add_argument("--std", type=float, default=1.0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data_dir, "train", a.mean, a.std)
    xte, yte = load(a.data_dir, "t10k", a.mean, a.std)
    model = build(a.layers)
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                              weight_decay=a.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = (xtr.shape[0] + a.batch - 1) // a.batch
    sched = None
    if a.schedule == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs * steps_per_epoch)

    rates, acc = [], 0.0
    n = xtr.shape[0]
    for epoch in range(a.epochs):
        model.train()
        perm = torch.randperm(n)
        busy = 0.0
        for i in range(0, n, a.batch):
            t0 = time.perf_counter()
            idx = perm[i : i + a.batch]
            x, y = xtr[idx], ytr[idx]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if sched:
                sched.step()
            busy += time.perf_counter() - t0
        rates.append(n / busy)
        model.eval()
        with torch.no_grad():
            correct = 0
            for i in range(0, xte.shape[0], 1000):
                correct += (model(xte[i : i + 1000]).argmax(1) == yte[i : i + 1000]).sum().item()
        acc = correct / xte.shape[0]
        print(f"epoch {epoch + 1}: {rates[-1]:.0f} samples/s, test acc {100 * acc:.2f}%",
              file=sys.stderr, flush=True)
    rates.sort()
    print(f"RESULT samples_per_sec={rates[len(rates) // 2]:.1f} test_acc={acc:.4f} epochs={a.epochs}",
          flush=True)


if __name__ == "__main__":
    main()
