#!/usr/bin/env python3
"""Causal prefill attention with torch.nn.functional.scaled_dot_product_attention
(is_causal=True), at the shapes of luminal's `attention_bench` example: batch 1, 32 heads,
head dim 128, s = t. Times each call with CUDA events (best and mean of REPS after warm-up)
in f32, f16 and bf16 and prints the same rows:

    attention | seq | runner | best ms | mean ms | TFLOP/s     (FLOPs 4*s*t*d*heads/2)

Usage: python3 scripts/torch_attention_bench.py [SEQ ...]   (default 1024 2048 4096 8192)
"""
import os
import sys

import torch
import torch.nn.functional as F

HEADS, D = 32, 128


def bench(s, dtype, reps):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.rand((1, HEADS, s, D), generator=g, device="cuda", dtype=torch.float32)
        .sub_(0.5)
        .to(dtype)
        for _ in range(3)
    )
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    best, mean = min(times), sum(times) / len(times)
    flops = 4.0 * s * s * D * HEADS / 2
    name = str(dtype).replace("torch.", "")
    print(f"attention | {s} | torch sdpa {name} | {best:.3f} | {mean:.3f} | {flops / best / 1e9:.2f}")


def main():
    if not torch.cuda.is_available():
        sys.exit("torch_attention_bench.py needs a CUDA GPU")
    seqs = [int(a) for a in sys.argv[1:]] or [1024, 2048, 4096, 8192]
    reps = int(os.environ.get("REPS", "10"))
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, batch 1, {HEADS} heads, d {D}, causal s = t", file=sys.stderr)
    print("attention | seq | runner | best ms | mean ms | TFLOP/s")
    for s in seqs:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            bench(s, dtype, reps)


if __name__ == "__main__":
    main()
