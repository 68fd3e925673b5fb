#!/usr/bin/env python3
"""PyTorch reference values for the encoder-side layers of crates/luminal_nn (BERT, Whisper):
GELU (erf and tanh) and erf, LayerNorm with and without affine weight/bias, bidirectional and
cross attention with a key padding mask, MultiHeadAttention, learned and sinusoidal position
embeddings, Conv1d with PyTorch's options, the GELU feed-forward block.

    pip install torch
    python3 scripts/gen_nn_torch_fixtures.py  # writes crates/luminal_nn/tests/fixtures/torch_layers.json

Inputs are float32; the references are computed by torch in float64 from those float32 values
(so they carry no float32 rounding of their own). Each case: named inputs (parameters under the
layer's parameter names), the expected output, and the tolerance the test applies.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(20261124)
cases = {}


def arr(x):
    # 9 significant digits: exact for float32 inputs, far below every tolerance for outputs.
    x = torch.as_tensor(x)
    return {"shape": list(x.shape), "data": [float(f"{v:.9g}") for v in x.detach().double().reshape(-1).tolist()]}


def randn(*shape, scale=1.0):
    return (torch.randn(*shape, dtype=torch.float64) * scale).float()


def add(name, inputs, expected, atol=1e-5, rtol=1e-5, **extra):
    cases[name] = {
        "inputs": {k: arr(v) for k, v in inputs.items()},
        "expected": arr(expected),
        "atol": atol,
        "rtol": rtol,
        **extra,
    }


d = lambda t: t.double()

# Activations over a wide range (tails and the region around 0).
x = torch.cat([torch.linspace(-9, 9, 361), randn(64, scale=3.0)]).float()
add("erf", {"x": x}, torch.erf(d(x)), atol=3e-7, rtol=0.0)
add("gelu_erf", {"x": x}, F.gelu(d(x)), atol=1e-6, rtol=1e-6)
add("gelu_tanh", {"x": x}, F.gelu(d(x), approximate="tanh"), atol=1e-6, rtol=1e-6)

# LayerNorm: BERT's eps 1e-12, with weight and bias, weight only, neither.
x = randn(2, 5, 48, scale=3.0) + 1.5
for name, affine, bias in [("ln_affine", True, True), ("ln_weight_only", True, False), ("ln_plain", False, False)]:
    ln = torch.nn.LayerNorm(48, eps=1e-12, elementwise_affine=affine, bias=bias, dtype=torch.float64)
    inputs = {"x": x}
    if affine:
        with torch.no_grad():
            ln.weight.copy_(d(randn(48) * 0.5 + 1.0).float())
            inputs["ln.weight"] = ln.weight.float()
            if bias:
                ln.bias.copy_(d(randn(48)).float())
                inputs["ln.bias"] = ln.bias.float()
    add(name, inputs, ln(d(x)))


def key_mask(lengths, t):
    return torch.tensor([[1.0 if j < n else 0.0 for j in range(t)] for n in lengths])


# Bidirectional attention with a key padding mask (self: s = t; cross: s != t).
for name, (b, h, s, t, dh, lengths) in {
    "attention_self_masked": (2, 3, 6, 6, 8, [6, 2]),
    "attention_cross_masked": (2, 2, 3, 7, 16, [7, 4]),
}.items():
    q, k, v = randn(b, h, s, dh), randn(b, h, t, dh), randn(b, h, t, dh)
    mask = key_mask(lengths, t)
    want = F.scaled_dot_product_attention(d(q), d(k), d(v), attn_mask=mask.bool()[:, None, None, :])
    add(name, {"q": q, "k": k, "v": v, "mask": mask}, want)
q, k, v = randn(1, 2, 4, 8), randn(1, 2, 5, 8), randn(1, 2, 5, 8)
add("attention_unmasked", {"q": q, "k": k, "v": v}, F.scaled_dot_product_attention(d(q), d(k), d(v)))

# MultiHeadAttention (q/k/v/out projections with biases, 4 heads of 6).
dim, heads = 24, 4
params = {}
for p in ["q_proj", "k_proj", "v_proj", "out_proj"]:
    params[f"mha.{p}.weight"] = randn(dim, dim, scale=0.2)
    params[f"mha.{p}.bias"] = randn(dim, scale=0.1)


def mha(x, mem, mask):
    lin = lambda t, p: d(t) @ d(params[f"mha.{p}.weight"]).T + d(params[f"mha.{p}.bias"])
    split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, dim // heads).transpose(1, 2)
    qh, kh, vh = split(lin(x, "q_proj")), split(lin(mem, "k_proj")), split(lin(mem, "v_proj"))
    am = None if mask is None else mask.bool()[:, None, None, :]
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=am)
    o = o.transpose(1, 2).reshape(x.shape[0], x.shape[1], dim)
    return o @ d(params["mha.out_proj.weight"]).T + d(params["mha.out_proj.bias"])


x = randn(2, 5, dim)
mask = key_mask([5, 3], 5)
add("mha_self_masked", {**params, "x": x, "mask": mask}, mha(x, x, mask))
mem = randn(2, 9, dim)
mem_mask = key_mask([4, 9], 9)
add("mha_cross_masked", {**params, "x": x, "memory": mem, "mask": mem_mask}, mha(x, mem, mem_mask))

# Learned positions: x + table[:s].
table = randn(10, 6)
x = randn(2, 7, 6)
emb = torch.nn.Embedding.from_pretrained(d(table))
add("position_learned", {"pos.weight": table, "x": x}, d(x) + emb(torch.arange(7))[None])
add("position_rows_3_to_8", {"pos.weight": table}, emb(torch.arange(3, 8)), atol=0.0, rtol=0.0)


# Whisper's sinusoids (openai-whisper `sinusoids(length, channels, max_timescale=10000)`).
def sinusoids(length, channels, max_timescale=10000):
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2, dtype=torch.float64))
    t = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


# Angles up to 199 rad: float32 holds them to ~1e-5, which bounds any float32 implementation.
add("sinusoids_200x32", {}, sinusoids(200, 32), atol=6e-5, rtol=0.0)

# Conv1d with PyTorch's defaults and options.
for name, (cin, cout, k, kw, batched) in {
    "conv1d_default": (4, 6, 3, {}, True),
    "conv1d_stride2_pad1": (4, 6, 3, {"stride": 2, "padding": 1}, True),
    "conv1d_groups2_dilation2_nobias": (4, 6, 3, {"groups": 2, "dilation": 2, "bias": False}, True),
    "conv1d_unbatched": (3, 5, 2, {}, False),
}.items():
    conv = torch.nn.Conv1d(cin, cout, k, dtype=torch.float64, **kw)
    with torch.no_grad():
        conv.weight.copy_(d(conv.weight.float()))
        if conv.bias is not None:
            conv.bias.copy_(d(conv.bias.float()))
    x = randn(2, cin, 11) if batched else randn(cin, 11)
    inputs = {"x": x, "conv.weight": conv.weight.float()}
    if conv.bias is not None:
        inputs["conv.bias"] = conv.bias.float()
    add(name, inputs, conv(d(x)), options={"in": cin, "out": cout, "kernel": k, **kw})

# Conv2d with PyTorch's defaults and options (square kernels).
for name, (cin, cout, k, kw, batched) in {
    "conv2d_default": (3, 4, 3, {}, True),
    "conv2d_stride2_pad1_groups": (4, 6, 3, {"stride": 2, "padding": 1, "groups": 2}, True),
    "conv2d_unbatched_nobias": (2, 3, 2, {"bias": False, "dilation": 2}, False),
}.items():
    conv = torch.nn.Conv2d(cin, cout, k, dtype=torch.float64, **kw)
    with torch.no_grad():
        conv.weight.copy_(d(conv.weight.float()))
        if conv.bias is not None:
            conv.bias.copy_(d(conv.bias.float()))
    x = randn(2, cin, 7, 6) if batched else randn(cin, 7, 6)
    inputs = {"x": x, "conv.weight": conv.weight.float()}
    if conv.bias is not None:
        inputs["conv.bias"] = conv.bias.float()
    add(name, inputs, conv(d(x)), options={"in": cin, "out": cout, "kernel": k, **kw})

# RMSNorm with and without a learned weight (torch.nn.RMSNorm).
x = randn(3, 40, scale=2.0)
for name, affine in [("rms_weight", True), ("rms_plain", False)]:
    rms = torch.nn.RMSNorm(40, eps=1e-6, elementwise_affine=affine, dtype=torch.float64)
    inputs = {"x": x}
    if affine:
        with torch.no_grad():
            rms.weight.copy_(d(randn(40) * 0.5 + 1.0))
        inputs["rms.weight"] = rms.weight.float()
    add(name, inputs, rms(d(x)))

# GELU feed-forward (fc1 → gelu → fc2, with biases).
fc1_w, fc1_b, fc2_w, fc2_b = randn(20, 8, scale=0.4), randn(20), randn(8, 20, scale=0.3), randn(8)
x = randn(2, 3, 8)
want = F.gelu(d(x) @ d(fc1_w).T + d(fc1_b)) @ d(fc2_w).T + d(fc2_b)
add("feed_forward_gelu", {"x": x, "ff.fc1.weight": fc1_w, "ff.fc1.bias": fc1_b,
                          "ff.fc2.weight": fc2_w, "ff.fc2.bias": fc2_b}, want)

out = os.path.join(os.path.dirname(__file__), "..", "crates", "luminal_nn", "tests", "fixtures", "torch_layers.json")
with open(out, "w") as f:
    json.dump(cases, f, separators=(",", ":"))
print(f"wrote {out}: {len(cases)} cases, torch {torch.__version__}")
