#!/usr/bin/env python3
"""PyTorch reference values for the core API additions of issue 15 (tests/api.rs of
crates/luminal): pow with a tensor exponent, rsqrt, conv/pool with PyTorch's default keyword
arguments, F.pad's last-dim-first order against `pad` / `pad_axis`, negative permute axes.

    pip install torch
    python3 scripts/gen_api_fixtures.py   # writes crates/luminal/tests/fixtures/api_torch.json

Inputs are float32, references computed by torch in float64. Non-finite values are written
as the strings "nan", "inf" and "-inf" (JSON has no literal for them).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(7)
cases = {}


def num(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return float(f"{v:.9g}")


def arr(x):
    x = torch.as_tensor(x)
    return {"shape": list(x.shape), "data": [num(v) for v in x.double().reshape(-1).tolist()]}


def randn(*shape):
    return torch.randn(*shape).float()


def add(name, inputs, expected, **extra):
    cases[name] = {"inputs": {k: arr(v) for k, v in inputs.items()}, "expected": arr(expected), **extra}


d = lambda t: t.double()

# pow with a tensor exponent: negative bases (integer / fractional exponents), zero bases,
# zero exponents (also of NaN), infinities.
x = torch.tensor([-2, -2, -2, -1.5, 0, 0, 0, 2, 3, float("nan"), float("-inf"), 4.5, -3, 0.5])
p = torch.tensor([3, 2, 0.5, 2, 2, -1, 0, 0.5, -2, 0, 3, 1.3, -3, 10])
add("pow_tensor", {"x": x, "p": p}, torch.pow(d(x), d(p)))
x = torch.rand(2, 3) * 3 + 0.1
p = torch.tensor([0.5, -1.25, 2.0])
add("pow_broadcast", {"x": x, "p": p}, torch.pow(d(x), d(p)))
x = torch.rand(17) * 10 + 0.01
add("rsqrt", {"x": x}, torch.rsqrt(d(x)))

# Conv / pool with PyTorch's keyword defaults.
x, w = randn(2, 4, 11), randn(6, 4, 3)
add("conv1d_default", {"x": x, "w": w}, F.conv1d(d(x), d(w)))
add("conv1d_stride2_pad1", {"x": x, "w": w}, F.conv1d(d(x), d(w), stride=2, padding=1))
x, w = randn(1, 4, 7, 6), randn(6, 2, 3, 3)
add("conv2d_pad1_groups2", {"x": x, "w": w}, F.conv2d(d(x), d(w), padding=1, groups=2))
x = randn(2, 3, 9)
add("max_pool1d_k2", {"x": x}, F.max_pool1d(d(x), 2))
add("avg_pool1d_k3", {"x": x}, F.avg_pool1d(d(x), 3))
x = randn(1, 2, 6, 7)
add("avg_pool2d_k2", {"x": x}, F.avg_pool2d(d(x), 2))
add("max_pool2d_k3_s1_p1", {"x": x}, F.max_pool2d(d(x), 3, stride=1, padding=1))

# F.pad lists the last dim first: (1, 2) pads dim -1, (0, 1) dim -2.
x = randn(2, 3, 4)
add("f_pad_last_first", {"x": x}, F.pad(d(x), (1, 2, 0, 1)))
add("f_pad_value", {"x": x}, F.pad(d(x), (0, 0, 2, 0), value=-1.5))
add("permute_negative", {"x": x}, d(x).permute(-1, 0, -2))

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "luminal", "tests", "fixtures", "api_torch.json")
with open(out, "w") as f:
    json.dump(cases, f, separators=(",", ":"))
print(f"wrote {out}: {len(cases)} cases, torch {torch.__version__}")
