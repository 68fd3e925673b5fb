#!/usr/bin/env python3
"""Reference values for crates/luminal_nn layers, computed with numpy in float64.

    pip install numpy
    python3 scripts/gen_nn_fixtures.py   # writes crates/luminal_nn/tests/fixtures/layers.json

Each case: named inputs (parameters use the layer's parameter names) and the expected output.
RoPE follows Hugging Face's `rotate_half` (NeoX) and the interleaved (GPT-J / Meta) pairing;
Llama-3 scaling follows transformers' `_compute_llama3_parameters`, linear scaling
`_compute_linear_scaling_rope_parameters` (inverse frequencies / factor), YaRN
`_compute_yarn_parameters` (ramp between extrapolated and interpolated frequencies, cos/sin
times the attention factor 0.1 ln(factor) + 1). Sliding-window attention follows transformers'
`sliding_window_overlay`: query position i sees keys j with i - window < j <= i.
"""
import json
import math
import os

import numpy as np

rng = np.random.default_rng(20261122)
cases = {}


def arr(x):
    x = np.asarray(x, dtype=np.float32)
    return {"shape": list(x.shape), "data": [float(v) for v in x.reshape(-1)]}


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def f64(x):
    return np.asarray(x, dtype=np.float64)


def add(name, inputs, expected, atol=1e-5):
    cases[name] = {"inputs": {k: arr(v) for k, v in inputs.items()}, "expected": arr(expected), "atol": atol}


# Linear with and without bias, batched input.
x = randn(2, 3, 17)
w = randn(5, 17, scale=0.3)
b = randn(5)
add("linear_bias", {"x": x, "fc.weight": w, "fc.bias": b}, f64(x) @ f64(w).T + f64(b))
add("linear_nobias", {"x": x, "fc.weight": w}, f64(x) @ f64(w).T)

# Embedding.
table = randn(11, 4)
ids = np.array([[3, 0, 10], [7, 7, 1]])
cases["embedding"] = {
    "inputs": {"tok.weight": arr(table)},
    "ids": {"shape": [2, 3], "data": ids.reshape(-1).tolist()},
    "expected": arr(f64(table)[ids]),
    "atol": 0.0,
}

# Norms over the last dim.
x = randn(3, 4, 33, scale=2.0) + 0.5
g, beta = randn(33) + 1.0, randn(33)
mu = f64(x).mean(-1, keepdims=True)
var = ((f64(x) - mu) ** 2).mean(-1, keepdims=True)
add("layer_norm", {"x": x, "ln.weight": g, "ln.bias": beta}, (f64(x) - mu) / np.sqrt(var + 1e-5) * f64(g) + f64(beta))
ms = (f64(x) ** 2).mean(-1, keepdims=True)
add("rms_norm", {"x": x, "norm.weight": g}, f64(x) / np.sqrt(ms + 1e-6) * f64(g))

# SwiGLU MLP.
x = randn(2, 5, 8)
wg, wu, wd = randn(12, 8, scale=0.4), randn(12, 8, scale=0.4), randn(8, 12, scale=0.4)
gate = f64(x) @ f64(wg).T
silu = gate / (1.0 + np.exp(-gate))
add("swiglu", {"x": x, "mlp.gate_proj.weight": wg, "mlp.up_proj.weight": wu, "mlp.down_proj.weight": wd},
    (silu * (f64(x) @ f64(wu).T)) @ f64(wd).T, atol=2e-5)


def inv_freq(d, theta, scaling=None):
    inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if scaling is None:
        return inv
    factor, low, high, old = scaling
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return np.where(medium, smoothed, scaled)


def rope(x, start, theta, layout, scaling=None):
    x = f64(x)
    seq, d = x.shape[-2], x.shape[-1]
    ang = np.arange(start, start + seq, dtype=np.float64)[:, None] * inv_freq(d, theta, scaling)[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if layout == "neox":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    xe, xo = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = xe * cos - xo * sin
    out[..., 1::2] = xo * cos + xe * sin
    return out


x = randn(2, 3, 7, 16)  # [batch, heads, seq, head_dim]
add("rope_neox", {"x": x}, rope(x, 0, 10000.0, "neox"), atol=2e-5)
add("rope_interleaved_start5", {"x": x}, rope(x, 5, 10000.0, "interleaved"), atol=2e-5)
x = randn(1, 2, 5, 64)
llama3 = (8.0, 1.0, 4.0, 8192.0)
add("rope_llama3_start100", {"x": x}, rope(x, 100, 500000.0, "neox", llama3), atol=2e-4)
cases["inv_freq_llama3"] = {"inputs": {}, "expected": arr(inv_freq(64, 500000.0, llama3)), "atol": 0.0, "rtol": 2e-6}



def attention(q, k, v, window=None):
    """q [b, hq, s, d], k/v [b, hkv, t, d]; query i sits at position t - s + i. With a window,
    query position p sees keys j with p - window < j <= p."""
    q, k, v = f64(q), f64(k), f64(v)
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s, t, d = q.shape[2], k.shape[2], q.shape[3]
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    visible = np.arange(t)[None, :] <= (t - s + np.arange(s))[:, None]
    if window is not None:
        visible &= np.arange(t)[None, :] > (t - s + np.arange(s))[:, None] - window
    scores = np.where(visible, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


q, k, v = randn(2, 4, 3, 8), randn(2, 2, 5, 8), randn(2, 2, 5, 8)
add("attention_gqa_cached", {"q": q, "k": k, "v": v}, attention(q, k, v), atol=2e-5)


def rms(x, w, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * f64(w)


def block(x, p, pre, heads, kv_heads, head_dim, theta, bias):
    x = f64(x)
    b, s, dim = x.shape
    h = rms(x, p[pre + "input_layernorm.weight"], 1e-5)

    def proj(name, t):
        y = t @ f64(p[pre + f"self_attn.{name}.weight"]).T
        if bias and name != "o_proj":
            y = y + f64(p[pre + f"self_attn.{name}.bias"])
        return y

    def heads_of(t, n):
        return t.reshape(b, s, n, head_dim).transpose(0, 2, 1, 3)

    q = rope(heads_of(proj("q_proj", h), heads), 0, theta, "neox")
    kk = rope(heads_of(proj("k_proj", h), kv_heads), 0, theta, "neox")
    vv = heads_of(proj("v_proj", h), kv_heads)
    att = attention(q, kk, vv).transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim)
    x = x + att @ f64(p[pre + "self_attn.o_proj.weight"]).T
    h = rms(x, p[pre + "post_attention_layernorm.weight"], 1e-5)
    gate = h @ f64(p[pre + "mlp.gate_proj.weight"]).T
    up = h @ f64(p[pre + "mlp.up_proj.weight"]).T
    return x + (gate / (1 + np.exp(-gate)) * up) @ f64(p[pre + "mlp.down_proj.weight"]).T


for bias in (False, True):
    dim, hidden, heads, kv_heads, head_dim = 16, 24, 4, 2, 4
    pre = "layers.0."
    p = {
        pre + "input_layernorm.weight": randn(dim) * 0.1 + 1.0,
        pre + "post_attention_layernorm.weight": randn(dim) * 0.1 + 1.0,
        pre + "self_attn.q_proj.weight": randn(heads * head_dim, dim, scale=0.3),
        pre + "self_attn.k_proj.weight": randn(kv_heads * head_dim, dim, scale=0.3),
        pre + "self_attn.v_proj.weight": randn(kv_heads * head_dim, dim, scale=0.3),
        pre + "self_attn.o_proj.weight": randn(dim, heads * head_dim, scale=0.3),
        pre + "mlp.gate_proj.weight": randn(hidden, dim, scale=0.3),
        pre + "mlp.up_proj.weight": randn(hidden, dim, scale=0.3),
        pre + "mlp.down_proj.weight": randn(dim, hidden, scale=0.3),
    }
    if bias:
        for n, o in (("q_proj", heads), ("k_proj", kv_heads), ("v_proj", kv_heads)):
            p[pre + f"self_attn.{n}.bias"] = randn(o * head_dim, scale=0.1)
    x = randn(2, 6, dim)
    add("block_qkv_bias" if bias else "block", dict(p, x=x), block(x, p, pre, heads, kv_heads, head_dim, 10000.0, bias), atol=5e-5)

# RoPE scaling beyond Llama 3 (appended after the cases above so their random draws are unchanged).


def inv_freq_yarn(d, theta, factor, original, beta_fast=32.0, beta_slow=1.0):
    """transformers' YaRN: ramp over pair index i between low = floor(dim(beta_fast)) and
    high = ceil(dim(beta_slow)), dim(b) = d ln(original / (2 pi b)) / (2 ln theta); ramp 0 keeps
    theta^(-2i/d), ramp 1 divides it by factor."""
    def dim_of(turns):
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dim_of(beta_fast)), 0)
    high = min(math.ceil(dim_of(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    base = inv_freq(d, theta)
    return base * (1 - ramp) + base / factor * ramp


def rope_with(x, start, inv, layout, mscale=1.0):
    """rope() with given inverse frequencies and a cos/sin multiplier."""
    x = f64(x)
    seq, d = x.shape[-2], x.shape[-1]
    ang = np.arange(start, start + seq, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = mscale * np.cos(ang), mscale * np.sin(ang)
    if layout == "neox":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    xe, xo = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = xe * cos - xo * sin
    out[..., 1::2] = xo * cos + xe * sin
    return out


# d 32, theta 1e4, original context 4096: low 5, high 12 (pairs 0-5 kept, 6-11 blended,
# 12-15 divided by the factor).
yarn_inv = inv_freq_yarn(32, 10000.0, 8.0, 4096.0)
cases["inv_freq_yarn"] = {"inputs": {}, "expected": arr(yarn_inv), "atol": 0.0, "rtol": 5e-6}
x = randn(1, 2, 5, 32)
add("rope_yarn_start50", {"x": x}, rope_with(x, 50, yarn_inv, "neox", 0.1 * math.log(8.0) + 1.0), atol=2e-4)
linear_inv = inv_freq(16, 10000.0) / 4.0
cases["inv_freq_linear"] = {"inputs": {}, "expected": arr(linear_inv), "atol": 0.0, "rtol": 2e-6}
x = randn(2, 3, 7, 16)
add("rope_linear_interleaved_start9", {"x": x}, rope_with(x, 9, linear_inv, "interleaved"), atol=2e-5)

# Sliding-window attention: decoding with 4 cached keys (t 7, s 3), and a prefill (t = s 6),
# both with window 3.
q, k, v = randn(2, 4, 3, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 8)
add("attention_swa_cached", {"q": q, "k": k, "v": v}, attention(q, k, v, window=3), atol=2e-5)
q, k, v = randn(1, 2, 6, 8), randn(1, 1, 6, 8), randn(1, 1, 6, 8)
add("attention_swa_prefill", {"q": q, "k": k, "v": v}, attention(q, k, v, window=3), atol=2e-5)

out = os.path.join(os.path.dirname(__file__), "..", "crates", "luminal_nn", "tests", "fixtures", "layers.json")
with open(out, "w") as f:
    json.dump(cases, f)
print(f"wrote {len(cases)} cases to {os.path.normpath(out)}")
