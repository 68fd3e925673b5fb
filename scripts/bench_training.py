#!/usr/bin/env python3
"""Training step time: PyTorch CPU vs luminal (CPU backend) on scikit-learn's digits.

Same models (MLP 64-128-10; CNN conv3x3 1->16 pad 1, conv3x3 16->32 stride 2 pad 1,
linear 512->10; ReLU), batch (64), optimizer (Adam, lr 3e-3), step count, data split
sizes and thread count on both sides; each prints its mean wall time per step (batch upload,
forward, backward, update; the first 10 steps excluded) and its test accuracy. Prints one
markdown table.

Usage:
    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch numpy
    /tmp/torchenv/bin/python scripts/bench_training.py [--threads 2] [--steps 600] [--repeats 3] [--models mlp,cnn]

luminal is run through `cargo run --release --example digits -- mlp|cnn`, which needs
models/digits.csv (scripts/fetch-digits.sh; run here when missing).
"""
import argparse
import os
import re
import subprocess
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def load_digits():
    path = os.path.join(ROOT, "models", "digits.csv")
    if not os.path.exists(path):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch-digits.sh")], check=True)
    d = np.loadtxt(path, delimiter=",", dtype=np.float32)
    return d[:, :64] / 16.0, d[:, 64].astype(np.int64)


def torch_model(arch):
    if arch == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 8, 8)),
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(512, 10))


def torch_run(arch, x, y, steps, threads, seed=0):
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(y))
    n_test = round(len(y) * 0.2)
    test, train = idx[:n_test], idx[n_test:]
    xtr, ytr = torch.tensor(x[train]), torch.tensor(y[train])
    xte, yte = torch.tensor(x[test]), torch.tensor(y[test])
    model = torch_model(arch)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    order, at, timed = np.arange(len(train)), len(train), 0.0
    for s in range(steps):
        t0 = time.perf_counter()
        if at + 64 > len(order):
            rng.shuffle(order)
            at = 0
        b = torch.from_numpy(order[at:at + 64])
        at += 64
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xtr[b]), ytr[b])
        loss.backward()
        opt.step()
        if s >= 10:
            timed += time.perf_counter() - t0
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    return timed / (steps - 10) * 1e6, acc


def luminal_run(arch, steps, threads):
    out = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "--example", "digits", "--", arch,
         "--steps", str(steps), "--threads", str(threads)],
        cwd=ROOT, capture_output=True, text=True, check=True)
    us = float(re.search(r"([0-9.]+) µs/step", out.stderr).group(1))
    acc = float(re.search(r"test accuracy ([0-9.]+)", out.stdout).group(1))
    return us, acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn")
    a = ap.parse_args()
    x, y = load_digits()
    print(f"digits, batch 64, Adam, {a.steps} steps, {a.threads} threads, best of {a.repeats} "
          f"(mean µs per step); torch {torch.__version__}\n")
    print("| model | PyTorch µs/step | luminal µs/step | luminal / PyTorch | PyTorch acc | luminal acc |")
    print("|---|---|---|---|---|---|")
    for arch in a.models.split(","):
        # Best of `repeats` for both (the machine may be shared).
        pt = min((torch_run(arch, x, y, a.steps, a.threads) for _ in range(a.repeats)),
                 key=lambda r: r[0])
        lu = min((luminal_run(arch, a.steps, a.threads) for _ in range(a.repeats)),
                 key=lambda r: r[0])
        print(f"| {arch.upper()} | {pt[0]:.0f} | {lu[0]:.0f} | {lu[0] / pt[0]:.2f} | "
              f"{pt[1]:.4f} | {lu[1]:.4f} |", flush=True)

if __name__ == "__main__":
    main()
