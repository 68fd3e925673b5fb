#!/usr/bin/env python3
"""Training step time: PyTorch CPU vs luminal (CPU backend) on scikit-learn's digits and on
the character-level GPT of examples/tiny_gpt.rs (GPL-3 text, same model and batch; the
learning-rate schedule differs: PyTorch runs a constant 3e-3, which does not change a step's
cost).

Same models (MLP 64-128-10; CNN conv3x3 1->16 pad 1, conv3x3 16->32 stride 2 pad 1,
linear 512->10; ReLU), batch (64), optimizer (Adam, lr 3e-3), step count, data split
sizes and thread count on both sides; each prints its mean wall time per step (batch upload,
forward, backward, update; the first 10 steps excluded) and its test accuracy. Prints one
markdown table.

Usage:
    pip install torch numpy     # CPU torch from PyPI
    python3 scripts/bench_training.py [--threads 2] [--steps 600] [--repeats 3] [--models mlp,cnn,gpt]

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


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    """The model of examples/tiny_gpt.rs (2 layers, dim 64, 4 heads, ctx 64)."""

    def __init__(self, vocab, d=64, heads=4, layers=2, ctx=64):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Parameter(torch.zeros(ctx, d))
        self.blocks = torch.nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def torch_gpt(steps, threads, batch=16, ctx=64, seed=0):
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    text = open("/usr/share/common-licenses/GPL-3").read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    model = Gpt(len(chars))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    timed = 0.0
    for s in range(steps):
        t0 = time.perf_counter()
        at = torch.from_numpy(rng.integers(0, len(data) - ctx - 1, size=batch))
        idx = at[:, None] + torch.arange(ctx)
        x, y = data[idx], data[idx + 1]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if s >= 5:
            timed += time.perf_counter() - t0
    return timed / (steps - 5) * 1e6, float(loss)


def luminal_gpt(steps, threads):
    out = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "--example", "tiny_gpt", "--",
         "--steps", str(steps), "--threads", str(threads)],
        cwd=ROOT, capture_output=True, text=True, check=True)
    m = re.search(r"final loss ([0-9.]+) .*; ([0-9.]+) ms/step", out.stderr)
    return float(m.group(2)) * 1e3, float(m.group(1))


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


def best_alternating(first, second, repeats):
    """The fastest of `repeats` runs of each, `first` and `second` taking turns."""
    a, b = [], []
    for _ in range(repeats):
        a.append(first())
        b.append(second())
    return min(a, key=lambda r: r[0]), min(b, key=lambda r: r[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--gpt-steps", type=int, default=60)
    a = ap.parse_args()
    x, y = load_digits()
    print(f"digits, batch 64, Adam, {a.steps} steps, {a.threads} threads, best of {a.repeats} "
          f"(mean µs per step); torch {torch.__version__}\n")
    print("| model | PyTorch µs/step | luminal µs/step | luminal / PyTorch | PyTorch acc | luminal acc |")
    print("|---|---|---|---|---|---|")
    for arch in [m for m in a.models.split(",") if m != "gpt"]:
        # Best of `repeats` for both, the runs alternating (the machine may be shared, and
        # its speed drifts: runs of one side back to back would see a different machine).
        pt, lu = best_alternating(lambda: torch_run(arch, x, y, a.steps, a.threads),
                                  lambda: luminal_run(arch, a.steps, a.threads), a.repeats)
        print(f"| {arch.upper()} | {pt[0]:.0f} | {lu[0]:.0f} | {lu[0] / pt[0]:.2f} | "
              f"{pt[1]:.4f} | {lu[1]:.4f} |", flush=True)
    if "gpt" in a.models.split(","):
        steps = a.gpt_steps
        pt, lu = best_alternating(lambda: torch_gpt(steps, a.threads),
                                  lambda: luminal_gpt(steps, a.threads), a.repeats)
        print(f"\ntiny GPT (2 layers, dim 64, ctx 64, batch 16, AdamW, clip 1.0), {steps} steps:\n")
        print("| model | PyTorch µs/step | luminal µs/step | luminal / PyTorch | PyTorch final loss | luminal final loss |")
        print("|---|---|---|---|---|---|")
        print(f"| GPT | {pt[0]:.0f} | {lu[0]:.0f} | {lu[0] / pt[0]:.2f} | {pt[1]:.3f} | {lu[1]:.3f} |")

if __name__ == "__main__":
    main()
