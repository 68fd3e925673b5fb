#!/usr/bin/env python3
"""Generate the fixture of luminal's backend-generic op suite.

    pip install numpy ml_dtypes          # numpy >= 1.24, ml_dtypes >= 0.3 (for bfloat16)
    python3 scripts/gen_op_fixtures.py   # writes crates/luminal/src/testing/fixtures/ops.json
    python3 scripts/gen_op_fixtures.py --check   # fails if the checked-in file is stale

The expected values come from numpy (an independent reference: nothing here runs luminal).
Everything is deterministic: each case draws its inputs from a generator seeded with a CRC of
the case name, so adding a case never changes the data of another one.

Every case here must have a builder of the same name in crates/luminal/src/testing/cases_*.rs
(the family below is the file); `cargo test` checks both directions.

Fixture format (one JSON object, one case per line, sorted by name):

    "case": {"family": "unary", "atol": 1e-5, "rtol": 1e-5,
             "inputs":   [{"dtype": "f32", "shape": [3, "seq"], "data": [...]}, ...],
             "expected": [{"dtype": "f32", "shape": [3, 17],    "data": [...]}, ...],
             "dims": {"seq": 17},                                      # optional
             "reruns": [{"dims": {...}, "inputs": [...], "expected": [...]}]}   # optional

* Inputs are created by the harness in order (names in0, in1, ...); a string in an input
  shape is a dynamic dim, bound from "dims" with set_dim before the run.  "reruns" are run
  afterwards on the same compiled runtime with new dims and data.
* data is row-major and flat.  f32/f16/bf16 values are exact values of the dtype written as
  the shortest decimal that parses (as f64, then rounded to the dtype) back to them;
  non-finite floats are the strings "nan", "inf", "-inf".  i32 are ints, bool true/false.
* Comparison: |got - want| <= atol + rtol * |want| for finite floats (NaN must be NaN, inf
  must match exactly); ints and bools exact.  Default tolerances per output dtype are in
  DEFAULT_TOL; a case may loosen them.
* Reference semantics: computed in float64 from the exact input values, rounded to the
  output dtype once at the end (so f16/bf16 cases are "compute wide, round at the end").
"""

import argparse
import json
import math
import os
import sys
import zlib

import numpy as np
import ml_dtypes

BF16 = ml_dtypes.bfloat16
NP_DT = {"f32": np.float32, "f16": np.float16, "bf16": BF16, "i32": np.int32, "bool": np.bool_}
FLOATS = ("f32", "f16", "bf16")
DEFAULT_TOL = {"f32": (1e-5, 1e-5), "f16": (1e-2, 1e-2), "bf16": (2e-2, 2e-2)}
OUT_PATH = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "luminal",
                        "src", "testing", "fixtures", "ops.json"))
FAMILIES = ("unary", "binary", "reduce", "movement", "nn", "conv", "index", "dtype", "dynamic")

# Tolerances for results that must be exact (selection, exact arithmetic such as fmod or
# casts) or within one rounding of the low-precision dtype (one correctly rounded op).
EXACT = dict(atol=0.0, rtol=0.0)
ULP_F16 = dict(atol=1e-7, rtol=2.0**-10)
ULP_BF16 = dict(atol=1e-7, rtol=2.0**-7)

inf = math.inf
nan = math.nan

# --------------------------------------------------------------------------------------------
# Input specs (materialised lazily with the case's own generator)
# --------------------------------------------------------------------------------------------


class In:
    def __init__(self, gen, dtype="f32", decl=None):
        self.gen = gen          # callable(rng) -> array-like
        self.dtype = dtype
        self.decl = decl        # declared shape (may contain dim names); default: concrete

    def materialize(self, rng):
        v = np.asarray(self.gen(rng) if callable(self.gen) else self.gen)
        if self.dtype in FLOATS:
            return v.astype(np.float64).astype(NP_DT[self.dtype])
        return v.astype(NP_DT[self.dtype])


def randn(*shape, dtype="f32", scale=1.0, shift=0.0, decl=None):
    return In(lambda r: r.standard_normal(shape) * scale + shift, dtype, decl)


def unif(lo, hi, *shape, dtype="f32", decl=None):
    return In(lambda r: r.uniform(lo, hi, shape), dtype, decl)


def away(lo, hi, *shape, dtype="f32", decl=None):
    """|x| in [lo, hi] with a random sign (divisors, reciprocals)."""
    return In(lambda r: r.uniform(lo, hi, shape) * r.choice([-1.0, 1.0], shape), dtype, decl)


def quant(*shape, step=0.5, lo=-2.0, hi=2.0, dtype="f32", decl=None):
    """Values on a coarse grid: plenty of exact ties and zeros."""
    n = int(round((hi - lo) / step)) + 1
    return In(lambda r: lo + step * r.integers(0, n, shape), dtype, decl)


def randint(lo, hi, *shape, decl=None):
    """i32 in [lo, hi)."""
    return In(lambda r: r.integers(lo, hi, shape), "i32", decl)


def randbool(*shape, decl=None):
    return In(lambda r: r.random(shape) < 0.5, "bool", decl)


def arr(values, dtype="f32", decl=None):
    return In(np.asarray(values, dtype=np.float64 if dtype in FLOATS else None), dtype, decl)


# --------------------------------------------------------------------------------------------
# Case registry
# --------------------------------------------------------------------------------------------

CASES = {}
_family = None


def family(name):
    global _family
    assert name in FAMILIES
    _family = name


def _wide(a, dtype):
    if dtype in FLOATS:
        return a.astype(np.float64)
    if dtype == "i32":
        return a.astype(np.int64)
    return a.astype(np.bool_)


def _finish(res, outs):
    if not isinstance(res, (list, tuple)):
        res = [res]
    assert len(res) == len(outs), (len(res), outs)
    done = []
    for r, d in zip(res, outs):
        r = np.asarray(r)
        if d in FLOATS:
            with np.errstate(over="ignore", invalid="ignore"):
                r = r.astype(np.float64).astype(NP_DT[d])
        elif d == "i32":
            assert np.all(np.asarray(r) == np.round(r)), "non-integral i32 result"
            r = r.astype(np.int64)
            assert np.all((r >= -2**31) & (r < 2**31))
            r = r.astype(np.int32)
        else:
            r = r.astype(np.bool_)
        done.append(r)
    return done


def case(name, inputs, fn, out=None, atol=None, rtol=None, dims=None, reruns=None,
         fn_dims=False):
    """Registers a case: `fn` gets the inputs widened (float64 / int64 / bool), plus
    `dims=` (the bound dynamic dims of the run) when fn_dims is set, and returns the expected
    output(s), which are rounded to `out` (default: the first input's dtype)."""
    assert _family is not None
    assert name not in CASES, f"duplicate case {name}"
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if out is None:
        out = inputs[0].dtype if inputs else "f32"
    outs = out if isinstance(out, list) else [out]
    float_outs = [d for d in outs if d in FLOATS]
    widest = "bf16" if "bf16" in float_outs else "f16" if "f16" in float_outs else "f32"
    d_atol, d_rtol = DEFAULT_TOL[widest]
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol

    def one_run(specs, run_dims):
        vals = [s.materialize(rng) for s in specs]
        for s, v in zip(specs, vals):
            if s.decl is not None:
                assert len(s.decl) == v.ndim, (name, s.decl, v.shape)
                for dd, n in zip(s.decl, v.shape):
                    want = run_dims[dd] if isinstance(dd, str) else dd
                    assert want == n, (name, s.decl, v.shape, run_dims)
        with np.errstate(all="ignore"):
            args = [_wide(v, s.dtype) for s, v in zip(specs, vals)]
            res = fn(*args, dims=run_dims) if fn_dims else fn(*args)
        return vals, _finish(res, outs)

    vals, expected = one_run(inputs, dims or {})
    entry = {
        "family": _family,
        "atol": atol,
        "rtol": rtol,
        "inputs": [enc(v, s.dtype, s.decl) for s, v in zip(inputs, vals)],
        "expected": [enc(e, d) for e, d in zip(expected, outs)],
    }
    if dims:
        entry["dims"] = dict(dims)
    if reruns:
        entry["reruns"] = []
        for rr in reruns:
            specs = rr["inputs"]
            assert len(specs) == len(inputs)
            for s0, s in zip(inputs, specs):
                assert s.dtype == s0.dtype
                s.decl = s0.decl
            v2, e2 = one_run(specs, rr["dims"])
            entry["reruns"].append({
                "dims": dict(rr["dims"]),
                "inputs": [enc(v, s.dtype, s.decl) for s, v in zip(specs, v2)],
                "expected": [enc(e, d) for e, d in zip(e2, outs)],
            })
    CASES[name] = entry


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _float_tokens(a, dtype):
    """Shortest decimal for each value that round-trips through f64 parsing + dtype rounding."""
    flat = np.asarray(a).reshape(-1)
    wide = flat.astype(np.float64)
    res = [None] * len(flat)
    todo = []
    for i, v in enumerate(wide):
        if math.isnan(v):
            res[i] = "nan"
        elif math.isinf(v):
            res[i] = "inf" if v > 0 else "-inf"
        elif v == 0.0:
            res[i] = -0.0 if math.copysign(1.0, v) < 0 else 0
        elif v == int(v) and abs(v) < 2**53:
            res[i] = int(v)
        else:
            todo.append(i)
    todo = np.asarray(todo, dtype=np.int64)
    for digits in range(1, 18):
        if len(todo) == 0:
            break
        cand = np.array([float("%.*g" % (digits, wide[i])) for i in todo])
        with np.errstate(over="ignore"):
            back = cand.astype(NP_DT[dtype])
        ok = back == flat[todo]
        for i, c in zip(todo[ok], cand[ok]):
            res[i] = float(c)
        todo = todo[~ok]
    for i in todo:  # not reached in practice: the exact value always works
        res[i] = float(wide[i])
    return res


def enc(v, dtype, decl=None):
    v = np.asarray(v)
    if dtype in FLOATS:
        data = _float_tokens(v, dtype)
    elif dtype == "i32":
        data = [int(x) for x in v.reshape(-1)]
    else:
        data = [bool(x) for x in v.reshape(-1)]
    shape = list(decl) if decl is not None else [int(s) for s in v.shape]
    return {"dtype": dtype, "shape": shape, "data": data}


# --------------------------------------------------------------------------------------------
# numpy references for the composite ops
# --------------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def layer_norm(x, axes, eps):
    axes = tuple(axes)
    mu = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def rms_norm(x, axes, eps):
    return x / np.sqrt(np.mean(x * x, axis=tuple(axes), keepdims=True) + eps)


def sl(x, axis, start, end):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, end)
    return x[tuple(idx)]


def pad(x, pads, value):
    return np.pad(x, pads, mode="constant", constant_values=value)


def expand(x, axis, size):
    y = np.expand_dims(x, axis)
    shape = list(y.shape)
    shape[axis] = size
    return np.broadcast_to(y, shape)


def unfold(x, axis, size, step):
    axis %= x.ndim
    n = (x.shape[axis] - size) // step + 1
    wins = [np.moveaxis(np.take(x, np.arange(i * step, i * step + size), axis=axis), axis, -1)
            for i in range(n)]
    return np.stack(wins, axis=axis)


def conv(x, w, stride, padding, dilation, groups):
    """Direct loop convolution (1-D or 2-D, NC[H]W, no bias), float64."""
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    n, c = x.shape[:2]
    o_ch = w.shape[0]
    cg, og = c // groups, o_ch // groups
    assert w.shape[1] == cg
    ks = w.shape[2:]
    out_sp = [(xp.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    out = np.zeros((n, o_ch, *out_sp))
    for o in range(o_ch):
        g = o // og
        for idx in np.ndindex(*out_sp):
            s = [slice(None), slice(g * cg, (g + 1) * cg)]
            for i in range(nd):
                st = idx[i] * stride[i]
                s.append(slice(st, st + dilation[i] * (ks[i] - 1) + 1, dilation[i]))
            patch = xp[tuple(s)]
            out[(slice(None), o) + idx] = np.sum(patch * w[o], axis=tuple(range(1, 2 + nd)))
    return out


def pool(x, kernel, stride, padding, mode):
    nd = len(kernel)
    val = 0.0 if mode == "avg" else -np.inf
    xp = np.pad(x, [(0, 0)] * (x.ndim - nd) + [(p, p) for p in padding], constant_values=val)
    out_sp = [(x.shape[x.ndim - nd + i] + 2 * padding[i] - kernel[i]) // stride[i] + 1
              for i in range(nd)]
    out = np.zeros(x.shape[:x.ndim - nd] + tuple(out_sp))
    for idx in np.ndindex(*out_sp):
        s = [slice(None)] * (x.ndim - nd)
        for i in range(nd):
            s.append(slice(idx[i] * stride[i], idx[i] * stride[i] + kernel[i]))
        win = xp[tuple(s)]
        ax = tuple(range(x.ndim - nd, x.ndim))
        r = np.sum(win, axis=ax) / np.prod(kernel) if mode == "avg" else np.max(win, axis=ax)
        out[(Ellipsis,) + idx] = r
    return out


def chunk_sizes(n, chunks):
    size = -(-n // chunks)
    out = []
    while n > 0:
        out.append(min(size, n))
        n -= size
    return out


def split(x, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def fmod(a, b):
    return np.fmod(a, b)


def causal_attention(q, k, v):
    s = q @ k.T / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    mask = np.triu(np.ones((s.shape[-2], n), dtype=bool), 1)
    s = np.where(mask, -np.inf, s)
    return softmax(s, -1) @ v


def attention(q, k, v):
    return softmax(q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]), -1) @ v


# ============================================================================================
# The cases.  Each family is one Rust file: crates/luminal/src/testing/cases_<family>.rs.
# Input order here is the order of `x[0], x[1], ...` in the Rust builders.
# ============================================================================================


def cases_unary():
    family("unary")
    # --- the unary primops on odd sizes and ranks --------------------------------------------
    prim = {
        "exp2": (np.exp2, lambda *s: randn(*s, scale=3.0)),
        "log2": (np.log2, lambda *s: unif(0.01, 100.0, *s)),
        "sin": (np.sin, lambda *s: unif(-10.0, 10.0, *s)),
        "sqrt": (np.sqrt, lambda *s: unif(0.0, 50.0, *s)),
        "recip": (lambda x: 1.0 / x, lambda *s: away(0.1, 10.0, *s)),
    }
    for op, (f, gen) in prim.items():
        case(f"{op}_3x17", [gen(3, 17)], f)
        case(f"{op}_1", [gen(1)], f)
        case(f"{op}_257", [gen(257)], f)
        case(f"{op}_scalar", [gen()], f)
        case(f"{op}_2x3x1x5", [gen(2, 3, 1, 5)], f)

    # --- composite unary ops -----------------------------------------------------------------
    case("exp_3x17", [randn(3, 17, scale=3.0)], np.exp)
    case("exp_257", [randn(257, scale=3.0)], np.exp)
    case("log_3x17", [unif(0.01, 100.0, 3, 17)], np.log)
    case("ln_17", [unif(0.01, 100.0, 17)], np.log)
    case("cos_3x17", [unif(-10.0, 10.0, 3, 17)], np.cos)
    case("tan_3x17", [unif(-1.2, 1.2, 3, 17)], np.tan, rtol=1e-4)
    case("tanh_3x17", [randn(3, 17, scale=2.0)], np.tanh)
    case("tanh_257", [randn(257, scale=2.0)], np.tanh)
    case("abs_3x17", [randn(3, 17)], np.abs)
    case("sign_3x17", [quant(3, 17)], np.sign)
    case("square_3x17", [randn(3, 17, scale=3.0)], np.square)
    case("neg_3x17", [randn(3, 17)], np.negative)
    case("relu_3x17", [randn(3, 17)], lambda x: np.maximum(x, 0.0))
    case("relu_257", [randn(257)], lambda x: np.maximum(x, 0.0))
    case("leaky_relu_0p1", [randn(3, 17)], lambda x: np.where(x >= 0, x, 0.1 * x))
    case("leaky_relu_0p01", [randn(257)], lambda x: np.where(x >= 0, x, 0.01 * x))
    case("sigmoid_3x17", [randn(3, 17, scale=4.0)], sigmoid)
    case("sigmoid_257", [randn(257, scale=4.0)], sigmoid)
    case("silu_3x17", [randn(3, 17, scale=3.0)], lambda x: x * sigmoid(x))
    case("swish_17", [randn(17, scale=3.0)], lambda x: x * sigmoid(x))
    case("gelu_3x17", [randn(3, 17, scale=2.0)], gelu, rtol=1e-4)
    case("gelu_257", [randn(257, scale=3.0)], gelu, rtol=1e-4)
    case("gelu_tanh_3x17", [randn(3, 17, scale=2.0)], gelu_tanh, rtol=1e-4)
    case("softplus_3x17", [randn(3, 17, scale=4.0)], lambda x: np.logaddexp(0.0, x))
    case("erf_3x17", [randn(3, 17)], _erf, atol=1e-5)
    case("floor_3x17", [randn(3, 17, scale=4.0)], np.floor)
    case("floor_exact", [arr([-2.0, -1.5, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, 2.75, -7.0])],
         np.floor)
    case("pow_2", [randn(3, 17)], lambda x: x**2)
    case("pow_3_negative_base", [randn(3, 17)], lambda x: x**3)
    case("pow_neg1", [unif(0.5, 4.0, 17)], lambda x: x**-1.0)
    case("pow_0", [randn(5)], lambda x: x**0.0)
    case("pow_half", [unif(0.0, 10.0, 3, 17)], lambda x: x**0.5)
    case("pow_1p7", [unif(0.1, 5.0, 3, 17)], lambda x: x**1.7, rtol=1e-4)
    case("pow_neg2p5", [unif(0.5, 3.0, 17)], lambda x: x**-2.5, rtol=1e-4)

    # --- non-finite inputs with clear IEEE / mathematical semantics ----------------------------
    case("relu_nonfinite", [arr([-inf, inf, -1.0, 0.0, 2.5])], lambda x: np.maximum(x, 0.0))
    case("exp_nonfinite", [arr([-inf, inf, 0.0, 100.0, -200.0, nan])], np.exp)
    case("exp2_nonfinite", [arr([-inf, inf, 0.0, 200.0, -200.0, nan])], np.exp2)
    case("log_nonfinite", [arr([0.0, inf, -1.0, 1.0, nan])], np.log)
    case("log2_nonfinite", [arr([0.0, inf, -1.0, 1.0, 0.5, nan])], np.log2)
    case("sqrt_nonfinite", [arr([0.0, inf, -1.0, 4.0, -inf, nan])], np.sqrt)
    case("recip_nonfinite", [arr([0.0, inf, -inf, 2.0, nan])], lambda x: 1.0 / x)
    case("sin_nonfinite", [arr([inf, -inf, 0.0, nan])], np.sin)
    case("sigmoid_nonfinite", [arr([-inf, inf, -100.0, 100.0, 0.0])], sigmoid)
    case("tanh_saturation", [arr([-inf, inf, -50.0, 50.0, -10.0, 10.0, 0.0])], np.tanh)
    case("abs_nonfinite", [arr([-inf, inf, -0.0, nan, -3.5])], np.abs)
    case("neg_nonfinite", [arr([-inf, inf, nan, 0.0])], np.negative)
    case("square_nonfinite", [arr([-inf, inf, nan])], np.square)
    case("softplus_extreme", [arr([-100.0, -30.0, 0.0, 30.0, 100.0, -inf, inf])],
         lambda x: np.logaddexp(0.0, x))
    case("sign_nonfinite", [arr([-inf, inf, -0.0, 0.0, 1e-30])], np.sign)

    # --- unary ops reading non-contiguous views ----------------------------------------------
    case("exp_permuted", [randn(17, 3)], lambda x: np.exp(x.T))
    case("log2_permuted_3d", [unif(0.1, 10.0, 2, 3, 4)], lambda x: np.log2(np.transpose(x, (2, 0, 1))))
    case("sin_sliced", [randn(5, 20)], lambda x: np.sin(sl(x, 1, 2, 19)))
    case("sqrt_padded", [unif(0.0, 9.0, 3, 5)], lambda x: np.sqrt(pad(x, [(1, 0), (2, 1)], 4.0)))
    case("recip_expanded", [away(0.5, 2.0, 3)], lambda x: 1.0 / expand(x, 0, 4))
    case("relu_sliced_padded", [randn(6, 7)],
         lambda x: np.maximum(pad(sl(x, 0, 1, 4), [(0, 0), (2, 2)], -1.0), 0.0))
    case("exp2_expand_to", [randn(1, 17)], lambda x: np.exp2(np.broadcast_to(x, (3, 17))))
    case("tanh_transposed", [randn(3, 4, 5)], lambda x: np.tanh(np.swapaxes(x, 0, 2)))


def cases_binary():
    family("binary")
    add, sub, mul, div = np.add, np.subtract, np.multiply, np.divide
    # --- same shape ---------------------------------------------------------------------------
    case("add_3x17", [randn(3, 17), randn(3, 17)], add)
    case("sub_3x17", [randn(3, 17), randn(3, 17)], sub)
    case("mul_3x17", [randn(3, 17), randn(3, 17)], mul)
    case("div_3x17", [randn(3, 17), away(0.2, 3.0, 3, 17)], div)
    case("mod_3x17", [randn(3, 17, scale=5.0), away(0.5, 3.0, 3, 17)], fmod)
    case("maximum_3x17", [quant(3, 17), quant(3, 17)], np.maximum)
    case("minimum_3x17", [quant(3, 17), quant(3, 17)], np.minimum)
    case("add_257", [randn(257), randn(257)], add)
    case("mul_1", [randn(1), randn(1)], mul)
    case("add_scalar_rank0", [randn(), randn()], add)
    case("mul_4d", [randn(2, 3, 1, 5), randn(2, 3, 1, 5)], mul)
    # --- numpy broadcasting -------------------------------------------------------------------
    case("add_bcast_row", [randn(3, 17), randn(17)], add)
    case("add_bcast_col_row", [randn(3, 1), randn(1, 17)], add)
    case("mul_bcast_3d", [randn(2, 1, 5), randn(3, 1)], mul)
    case("sub_bcast_rank0", [randn(3, 4), randn()], sub)
    case("sub_bcast_rank0_lhs", [randn(), randn(3, 4)], sub)
    case("div_bcast_1", [randn(257), away(0.5, 2.0, 1)], div)
    case("maximum_bcast", [randn(3, 1), randn(1, 4)], np.maximum)
    case("minimum_bcast_rank", [randn(2, 3, 4), randn(4)], np.minimum)
    case("mod_bcast", [randn(4, 5, scale=6.0), away(0.5, 3.0, 5)], fmod)
    case("add_bcast_4d", [randn(2, 1, 3, 1), randn(1, 4, 1, 5)], add)
    # --- scalars on either side ---------------------------------------------------------------
    case("add_f32_rhs", [randn(3, 17)], lambda a: a + np.float32(2.5))
    case("add_f32_lhs", [randn(3, 17)], lambda a: np.float32(2.5) + a)
    case("sub_f32_rhs", [randn(3, 17)], lambda a: a - 1.5)
    case("sub_f32_lhs", [randn(3, 17)], lambda a: 2.0 - a)
    case("mul_f32_rhs", [randn(3, 17)], lambda a: a * 3.0)
    case("mul_f32_lhs", [randn(3, 17)], lambda a: 3.0 * a)
    case("div_f32_rhs", [randn(3, 17)], lambda a: a / 4.0)
    case("div_f32_lhs", [away(0.2, 3.0, 3, 17)], lambda a: 1.0 / a)
    case("mod_f32_rhs", [randn(3, 17, scale=5.0)], lambda a: np.fmod(a, 2.5))
    case("mod_f32_lhs", [away(1.0, 4.0, 3, 17)], lambda a: np.fmod(7.5, a))
    case("mod_signs", [arr([-7.5, 7.5, -7.5, 7.5, 5.0, -5.0, 0.5, -0.5, 0.0, 6.25]),
                       arr([2.0, -2.0, -2.0, 2.0, 5.0, 5.0, 2.0, -2.0, 3.0, 0.5])], fmod)
    case("mod_large_quotient", [unif(0.0, 100.0, 257), unif(0.5, 3.0, 257)], fmod, atol=1e-4)
    case("mod_inf_divisor", [arr([1.5, -2.5, 0.0]), arr([inf, -inf, inf])], fmod)
    case("clamp_3x17", [randn(3, 17)], lambda a: np.clip(a, -0.5, 0.8))
    case("clamp_257", [randn(257, scale=3.0)], lambda a: np.clip(a, -1.0, 2.0))
    case("clamp_inf", [arr([-inf, inf, 0.3, -0.7])], lambda a: np.clip(a, -0.5, 0.5))
    case("maximum_f32", [randn(3, 17)], lambda a: np.maximum(a, 0.25))
    case("minimum_f32", [randn(3, 17)], lambda a: np.minimum(a, -0.25))
    # --- comparisons -> bool ------------------------------------------------------------------
    for op, f in [("lt", np.less), ("gt", np.greater), ("le", np.less_equal),
                  ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)]:
        case(f"{op}_tensor", [quant(3, 17), quant(3, 17)], f, out="bool")
        case(f"{op}_f32", [quant(3, 17)], lambda a, f=f: f(a, 0.5), out="bool")
    case("lt_bcast", [quant(3, 1), quant(1, 17)], np.less, out="bool")
    case("eq_bcast_rank0", [quant(17), quant()], np.equal, out="bool")
    case("lt_inf", [arr([-inf, inf, 0.0, -inf, inf, 1.0]), arr([0.0, 0.0, inf, -inf, inf, -inf])],
         np.less, out="bool")
    case("lt_nan", [arr([nan, 1.0, nan]), arr([1.0, nan, nan])], np.less, out="bool")
    case("eq_signed_zero", [arr([0.0, -0.0, 1.0]), arr([-0.0, 0.0, 1.0])], np.equal, out="bool")
    case("not_nan_mixed", [arr([nan, 1.0, inf, -inf, 0.0, -nan])], lambda a: ~np.isnan(a), out="bool")
    case("lt_permuted", [quant(17, 3), quant(3, 17)], lambda a, b: a.T < b, out="bool")
    # --- logical ops on bools -----------------------------------------------------------------
    case("not_bool", [randbool(3, 17)], np.logical_not, out="bool")
    case("and_bool", [randbool(3, 17), randbool(3, 17)], np.logical_and, out="bool")
    case("or_bool", [randbool(3, 17), randbool(3, 17)], np.logical_or, out="bool")
    case("and_bcast", [randbool(3, 1), randbool(17)], np.logical_and, out="bool")
    # --- select (torch.where) -----------------------------------------------------------------
    case("select_from_gt", [randn(3, 17), randn(3, 17)], lambda a, b: np.where(a > b, a, b))
    case("select_scalars", [randn(3, 17)], lambda a: np.where(a > 0.0, 1.0, -1.0))
    case("select_bool_input", [randbool(3, 17), randn(3, 17), randn(3, 17)],
         lambda c, a, b: np.where(c, a, b), out="f32")
    case("select_tensor_scalar", [randbool(3, 17), randn(3, 17)],
         lambda c, a: np.where(c, a, 0.0), out="f32")
    case("select_scalar_tensor", [randbool(3, 17), randn(3, 17)],
         lambda c, a: np.where(c, -2.0, a), out="f32")
    case("select_bcast", [randbool(3, 1), randn(1, 17), randn(17)],
         lambda c, a, b: np.where(c, a, b), out="f32")
    case("select_neg_inf_mask", [randbool(3, 17), randn(3, 17)],
         lambda c, a: np.where(c, a, -np.inf), out="f32")
    case("select_inf_other_branch", [randbool(4, 5), arr(np.full((4, 5), np.inf)), randn(4, 5)],
         lambda c, a, b: np.where(c, a, b), out="f32")
    case("select_i32", [randbool(3, 17), randint(-50, 50, 3, 17), randint(-50, 50, 3, 17)],
         lambda c, a, b: np.where(c, a, b), out="i32")
    # --- i32 arithmetic -----------------------------------------------------------------------
    case("add_i32", [randint(-1000, 1000, 3, 17), randint(-1000, 1000, 3, 17)], add)
    case("sub_i32", [randint(-1000, 1000, 3, 17), randint(-1000, 1000, 3, 17)], sub)
    case("mul_i32", [randint(-300, 300, 3, 17), randint(-300, 300, 3, 17)], mul)
    case("mod_i32", [randint(-100, 100, 3, 17), In(lambda r: r.integers(1, 9, (3, 17)) *
                                                    r.choice([-1, 1], (3, 17)), "i32")], fmod)
    case("maximum_i32", [randint(-5, 5, 3, 17), randint(-5, 5, 3, 17)], np.maximum)
    case("minimum_i32", [randint(-5, 5, 3, 17), randint(-5, 5, 3, 17)], np.minimum)
    case("lt_i32", [randint(-5, 5, 3, 17), randint(-5, 5, 3, 17)], np.less, out="bool")
    case("eq_i32", [randint(-3, 3, 3, 17), randint(-3, 3, 3, 17)], np.equal, out="bool")
    case("add_i32_bcast", [randint(-100, 100, 3, 1), randint(-100, 100, 17)], add)
    case("add_i32_scalar", [randint(-100, 100, 17)], lambda a: a + 7)
    case("mul_i32_scalar", [randint(-100, 100, 17)], lambda a: a * -3)
    case("neg_i32", [randint(-100, 100, 17)], np.negative)
    # --- f16 / bf16 ---------------------------------------------------------------------------
    case("add_f16", [randn(3, 17, dtype="f16"), randn(3, 17, dtype="f16")], add, **ULP_F16)
    case("mul_f16", [randn(3, 17, dtype="f16"), randn(3, 17, dtype="f16")], mul, **ULP_F16)
    case("div_f16", [randn(3, 17, dtype="f16"), away(0.5, 3.0, 3, 17, dtype="f16")], div,
         atol=1e-7, rtol=2.0**-9)
    case("sub_f16_bcast", [randn(3, 17, dtype="f16"), randn(17, dtype="f16")], sub, **ULP_F16)
    case("mul_f16_scalar", [randn(3, 17, dtype="f16")], lambda a: a * 3.0, **ULP_F16)
    case("lt_f16", [quant(3, 17, dtype="f16"), quant(3, 17, dtype="f16")], np.less, out="bool")
    case("add_bf16", [randn(3, 17, dtype="bf16"), randn(3, 17, dtype="bf16")], add, **ULP_BF16)
    case("mul_bf16", [randn(3, 17, dtype="bf16"), randn(3, 17, dtype="bf16")], mul, **ULP_BF16)
    case("maximum_bf16", [randn(3, 17, dtype="bf16"), randn(3, 17, dtype="bf16")], np.maximum,
         **EXACT)
    case("mod_bf16", [randn(17, dtype="bf16", scale=4.0), away(0.5, 2.0, 17, dtype="bf16")], fmod,
         **EXACT)
    case("select_f16", [randbool(3, 17), randn(3, 17, dtype="f16"), randn(3, 17, dtype="f16")],
         lambda c, a, b: np.where(c, a, b), out="f16", **EXACT)
    case("select_inf_nan_branches", [randbool(4, 5), arr(np.full((4, 5), np.inf)), arr(np.full((4, 5), np.nan))],
         lambda c, a, b: np.where(c, a, b), out="f32")
    # --- non-contiguous operands --------------------------------------------------------------
    case("add_permuted_lhs", [randn(17, 3), randn(3, 17)], lambda a, b: a.T + b)
    case("mul_both_permuted", [randn(4, 3, 2), randn(2, 4, 3)],
         lambda a, b: np.transpose(a, (2, 0, 1)) * np.transpose(b, (0, 1, 2)))
    case("add_sliced_both", [randn(5, 9), randn(4, 12)],
         lambda a, b: sl(a, 0, 1, 4) + sl(sl(b, 0, 0, 3), 1, 3, 12))
    case("sub_padded", [randn(3, 15), randn(3, 17)], lambda a, b: pad(a, [(0, 0), (1, 1)], 0.5) - b)
    case("add_expanded", [randn(3), randn(3, 17)], lambda a, b: expand(a, 1, 17) + b)
    case("add_self_transposed", [randn(5, 5)], lambda a: a + a.T)
    case("mul_expand_to", [randn(1, 17), randn(3, 17)], lambda a, b: np.broadcast_to(a, (3, 17)) * b)
    case("div_transposed_3d", [randn(2, 3, 4), away(0.5, 2.0, 4, 3, 2)],
         lambda a, b: a / np.transpose(b, (2, 1, 0)))
    # --- short chains -------------------------------------------------------------------------
    case("chain_fma", [randn(3, 17), randn(3, 17), randn(3, 17)], lambda a, b, c: a * b + c)
    case("chain_affine", [randn(3, 17), randn(3, 17)], lambda a, b: (a + 1.0) * (b - 2.0) / 3.0)
    case("chain_exp_log", [randn(3, 17)], lambda a: np.log(np.exp(a)), atol=2e-5)
    case("chain_shared_input", [randn(17)], lambda a: (a * a) - (a + a))
    # --- NaN semantics (IEEE comparisons, NaN-propagating max/min) ----------------------------
    case("cmp_nan", [arr([nan, 1.0, nan, 2.0, -inf]), arr([1.0, nan, nan, 2.0, -inf])],
         lambda a, b: [a == b, a != b, a <= b, a >= b, a > b], out=["bool"] * 5)
    case("maximum_nan", [arr([nan, 1.0, -inf, nan]), arr([0.0, nan, -inf, inf])],
         lambda a, b: [np.maximum(a, b), np.minimum(a, b)], out=["f32", "f32"])


def cases_reduce():
    family("reduce")
    s, mx, mn = np.sum, np.max, np.min
    big = dict(atol=1e-4)  # long f32 accumulations
    # --- sum -----------------------------------------------------------------------------------
    case("sum_axis0", [randn(3, 17)], lambda x: s(x, axis=0))
    case("sum_axis1", [randn(3, 17)], lambda x: s(x, axis=1))
    case("sum_axis_neg1_3d", [randn(2, 3, 5)], lambda x: s(x, axis=-1))
    case("sum_axis_neg2_3d", [randn(2, 3, 5)], lambda x: s(x, axis=-2))
    case("sum_axes_0_2", [randn(2, 3, 5)], lambda x: s(x, axis=(0, 2)))
    case("sum_axes_neg", [randn(2, 3, 4, 5)], lambda x: s(x, axis=(-1, -3)))
    case("sum_all", [randn(3, 17)], lambda x: s(x, axis=(0, 1)))
    case("sum_257", [randn(257)], lambda x: s(x, axis=0), **big)
    case("sum_3x257_axis1", [randn(3, 257)], lambda x: s(x, axis=1), **big)
    case("sum_257x3_axis0", [randn(257, 3)], lambda x: s(x, axis=0), **big)
    case("sum_size1_axis", [randn(3, 1)], lambda x: s(x, axis=1))
    case("sum_1x1", [randn(1, 1)], lambda x: s(x, axis=(0, 1)))
    case("sum_keepdim_axis1", [randn(3, 17)], lambda x: s(x, axis=1, keepdims=True))
    case("sum_keepdim_axes_neg", [randn(2, 3, 5)], lambda x: s(x, axis=(-1, -3), keepdims=True))
    case("sum_keepdim_all", [randn(3, 17)], lambda x: s(x, axis=(0, 1), keepdims=True))
    case("sum_nonfinite", [arr([[1.0, inf, 2.0], [-inf, 1.0, 0.0], [inf, -inf, 1.0], [nan, 1.0, 2.0]])],
         lambda x: s(x, axis=1))
    # --- max / min ------------------------------------------------------------------------------
    case("max_axis0", [randn(3, 17)], lambda x: mx(x, axis=0))
    case("max_axis_neg1_257", [randn(3, 257)], lambda x: mx(x, axis=-1))
    case("max_keepdim", [randn(3, 17)], lambda x: mx(x, axis=1, keepdims=True))
    case("max_all", [randn(2, 3, 5)], lambda x: mx(x, axis=(0, 1, 2)))
    case("max_axes_0_2", [randn(2, 3, 5)], lambda x: mx(x, axis=(0, 2)))
    case("max_all_negative", [unif(-9.0, -1.0, 3, 17)], lambda x: mx(x, axis=1))
    case("max_with_neg_inf", [arr([[-inf, -inf, -inf], [-inf, -5.0, -inf], [inf, 1.0, -inf]])],
         lambda x: mx(x, axis=1))
    case("max_nan_propagates", [arr([[1.0, nan, 3.0], [1.0, 2.0, 3.0]])], lambda x: mx(x, axis=1))
    case("min_axis1", [randn(3, 17)], lambda x: mn(x, axis=1))
    case("min_all_positive", [unif(1.0, 9.0, 3, 17)], lambda x: mn(x, axis=0))
    case("min_keepdim", [randn(2, 3, 5)], lambda x: mn(x, axis=-2, keepdims=True))
    case("min_all", [randn(257)], lambda x: mn(x, axis=0))
    case("min_with_inf", [arr([[inf, inf], [inf, 3.0], [-inf, 0.0]])], lambda x: mn(x, axis=1))
    # --- mean ----------------------------------------------------------------------------------
    case("mean_axis1", [randn(3, 17)], lambda x: np.mean(x, axis=1))
    case("mean_axes_1_2", [randn(2, 3, 5)], lambda x: np.mean(x, axis=(1, 2)))
    case("mean_keepdim", [randn(3, 17)], lambda x: np.mean(x, axis=0, keepdims=True))
    case("mean_257", [randn(257, shift=3.0)], lambda x: np.mean(x, axis=0))
    case("mean_all_4d", [randn(2, 3, 1, 5)], lambda x: np.mean(x, axis=(0, 1, 2, 3)))
    # --- prod ----------------------------------------------------------------------------------
    case("prod_axis1", [unif(0.5, 1.5, 3, 17)], lambda x: np.prod(x, axis=1))
    case("prod_keepdim", [unif(0.5, 1.5, 3, 5)], lambda x: np.prod(x, axis=0, keepdims=True))
    case("prod_with_zero", [arr([[1.5, 0.0, 2.0], [2.0, 3.0, 0.5], [-0.0, 4.0, 1.0]])],
         lambda x: np.prod(x, axis=1))
    case("prod_negative", [arr([[-1.5, 2.0, -2.0], [-3.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])],
         lambda x: np.prod(x, axis=1))
    case("prod_axes", [unif(0.8, 1.25, 2, 3, 5)], lambda x: np.prod(x, axis=(0, 2)))
    # --- var / std ------------------------------------------------------------------------------
    case("var_c0", [randn(3, 17)], lambda x: np.var(x, axis=-1))
    case("var_c1", [randn(3, 17)], lambda x: np.var(x, axis=-1, ddof=1))
    case("var_c1_keepdim", [randn(3, 17)], lambda x: np.var(x, axis=0, ddof=1, keepdims=True))
    case("var_axes_c1", [randn(2, 3, 5)], lambda x: np.var(x, axis=(0, 2), ddof=1))
    case("var_offset_257", [randn(257, shift=100.0)], lambda x: np.var(x, axis=0), atol=1e-3,
         rtol=1e-4)
    case("std_c0", [randn(3, 17, scale=2.0)], lambda x: np.std(x, axis=1))
    case("std_c1", [randn(3, 17, scale=2.0)], lambda x: np.std(x, axis=1, ddof=1))
    case("std_keepdim", [randn(2, 3, 5)], lambda x: np.std(x, axis=(1, 2), ddof=1, keepdims=True))
    # --- argmax / argmin (first occurrence) -----------------------------------------------------
    i32 = "i32"
    case("argmax_axis1", [randn(3, 17)], lambda x: np.argmax(x, axis=1), out=i32)
    case("argmax_axis0", [randn(3, 17)], lambda x: np.argmax(x, axis=0), out=i32)
    case("argmax_neg1_3d", [randn(2, 3, 5)], lambda x: np.argmax(x, axis=-1), out=i32)
    case("argmax_ties", [quant(4, 17, step=1.0, lo=0.0, hi=2.0)], lambda x: np.argmax(x, axis=1),
         out=i32)
    case("argmax_257", [randn(2, 257)], lambda x: np.argmax(x, axis=1), out=i32)
    case("argmax_with_neg_inf", [arr([[-inf, -inf, -1.0], [-inf, -inf, -inf], [2.0, -inf, 2.0]])],
         lambda x: np.argmax(x, axis=1), out=i32)
    case("argmin_axis1", [randn(3, 17)], lambda x: np.argmin(x, axis=1), out=i32)
    case("argmin_ties", [quant(17, 4, step=1.0, lo=0.0, hi=2.0)], lambda x: np.argmin(x, axis=0),
         out=i32)
    case("argmin_neg2", [randn(2, 5, 3)], lambda x: np.argmin(x, axis=-2), out=i32)
    case("argmax_size1", [randn(3, 1)], lambda x: np.argmax(x, axis=1), out=i32)
    # --- i32 / f16 / bf16 -----------------------------------------------------------------------
    case("sum_i32", [randint(-1000, 1000, 3, 17)], lambda x: s(x, axis=1))
    case("max_i32", [randint(-1000, 1000, 3, 17)], lambda x: mx(x, axis=0))
    case("max_i32_all_negative", [randint(-1000, -1, 3, 17)], lambda x: mx(x, axis=1))
    case("min_i32", [randint(-1000, 1000, 3, 17)], lambda x: mn(x, axis=1))
    case("argmax_i32", [randint(0, 4, 3, 17)], lambda x: np.argmax(x, axis=1), out=i32)
    case("sum_f16", [randn(3, 17, dtype="f16")], lambda x: s(x, axis=1))
    case("mean_f16", [randn(3, 17, dtype="f16")], lambda x: np.mean(x, axis=1))
    case("max_f16", [randn(3, 17, dtype="f16")], lambda x: mx(x, axis=0), **EXACT)
    case("sum_bf16", [randn(3, 17, dtype="bf16")], lambda x: s(x, axis=1), atol=5e-2)
    case("max_bf16", [randn(3, 17, dtype="bf16")], lambda x: mx(x, axis=1), **EXACT)
    case("argmax_f16", [randn(3, 17, dtype="f16")], lambda x: np.argmax(x, axis=1), out=i32)
    # --- reductions of views --------------------------------------------------------------------
    case("sum_permuted", [randn(17, 3)], lambda x: s(x.T, axis=0))
    case("sum_permuted_3d", [randn(2, 3, 5)], lambda x: s(np.transpose(x, (1, 2, 0)), axis=(0, 2)))
    case("max_sliced", [randn(5, 20)], lambda x: mx(sl(x, 1, 3, 17), axis=1))
    case("sum_padded", [randn(3, 5)], lambda x: s(pad(x, [(1, 1), (0, 2)], 1.0), axis=1))
    case("min_padded_value", [randn(3, 5)], lambda x: mn(pad(x, [(0, 0), (1, 0)], -5.0), axis=1))
    case("max_padded_neg", [unif(-9.0, -1.0, 3, 5)], lambda x: mx(pad(x, [(0, 0), (2, 2)], 0.0), axis=1))
    case("mean_expanded", [randn(3)], lambda x: np.mean(expand(x, 0, 4), axis=0))
    case("sum_expanded_other", [randn(3)], lambda x: s(expand(x, 1, 5), axis=0))
    case("argmax_permuted", [randn(17, 3)], lambda x: np.argmax(x.T, axis=1), out=i32)
    case("var_permuted", [randn(17, 3)], lambda x: np.var(x.T, axis=1, ddof=1))
    case("sum_of_product", [randn(3, 17), randn(3, 17)], lambda a, b: s(a * b, axis=1))
    case("sum_then_max", [randn(2, 3, 5)], lambda x: mx(s(x, axis=2), axis=1))


def cases_movement():
    family("movement")
    tr = np.transpose
    case("contiguous_identity", [randn(3, 17)], lambda x: x)
    case("contiguous_permuted", [randn(3, 17)], lambda x: x.T)
    case("permute_2d", [randn(3, 17)], lambda x: x.T)
    case("permute_3d", [randn(2, 3, 4)], lambda x: tr(x, (2, 0, 1)))
    case("permute_4d", [randn(2, 3, 1, 5)], lambda x: tr(x, (3, 1, 0, 2)))
    case("permute_identity", [randn(2, 3, 4)], lambda x: x)
    case("permute_twice", [randn(2, 3, 4)], lambda x: tr(tr(x, (2, 0, 1)), (2, 0, 1)))
    case("transpose_0_2", [randn(2, 3, 4)], lambda x: np.swapaxes(x, 0, 2))
    case("transpose_neg", [randn(2, 3, 4)], lambda x: np.swapaxes(x, -1, -2))
    case("transpose_257", [randn(257, 3)], lambda x: x.T)
    case("reshape_flat", [randn(3, 17)], lambda x: x.reshape(51))
    case("reshape_unflat", [randn(51)], lambda x: x.reshape(3, 17))
    case("reshape_3d", [randn(2, 3, 4)], lambda x: x.reshape(4, 6))
    case("reshape_add_ones", [randn(17)], lambda x: x.reshape(1, 17, 1))
    case("reshape_after_permute", [randn(3, 4)], lambda x: x.T.reshape(12))
    case("reshape_after_permute_3d", [randn(2, 3, 4)], lambda x: tr(x, (1, 0, 2)).reshape(3, 8))
    case("reshape_after_slice", [randn(4, 6)], lambda x: sl(x, 1, 1, 5).reshape(2, 8))
    case("reshape_to_scalar", [randn(1, 1)], lambda x: x.reshape(()))
    case("reshape_from_scalar", [randn()], lambda x: x.reshape(1, 1))
    # --- slice ---------------------------------------------------------------------------------
    case("slice_axis0", [randn(5, 7)], lambda x: sl(x, 0, 1, 4))
    case("slice_axis1", [randn(5, 7)], lambda x: sl(x, 1, 2, 7))
    case("slice_neg_axis", [randn(2, 3, 7)], lambda x: sl(x, -1, 0, 3))
    case("slice_full", [randn(5, 7)], lambda x: x)
    case("slice_single", [randn(5, 7)], lambda x: sl(x, 0, 2, 3))
    case("slice_3d_middle", [randn(3, 6, 4)], lambda x: sl(x, 1, 2, 5))
    case("slice_257", [randn(257)], lambda x: sl(x, 0, 100, 257))
    case("slice_twice", [randn(9, 9)], lambda x: sl(sl(x, 0, 2, 8), 0, 1, 4))
    case("slice_both_axes", [randn(6, 8)], lambda x: sl(sl(x, 0, 1, 5), 1, 3, 6))
    case("slice_permuted", [randn(4, 9)], lambda x: sl(x.T, 0, 2, 7))
    # --- pad ----------------------------------------------------------------------------------
    case("pad_1d", [randn(17)], lambda x: pad(x, [(2, 3)], 0.0))
    case("pad_2d_value", [randn(3, 4)], lambda x: pad(x, [(1, 0), (0, 2)], 1.5))
    case("pad_3d", [randn(2, 3, 2)], lambda x: pad(x, [(0, 1), (1, 1), (2, 0)], -0.5))
    case("pad_zero_amounts", [randn(3, 4)], lambda x: pad(x, [(0, 0), (0, 0)], 7.0))
    case("pad_neg_inf", [randn(2, 3)], lambda x: pad(x, [(0, 0), (1, 1)], -np.inf))
    case("pad_then_slice", [randn(3, 4)], lambda x: sl(pad(x, [(0, 0), (3, 3)], 2.0), 1, 1, 8))
    case("slice_then_pad", [randn(5, 6)], lambda x: pad(sl(x, 1, 2, 5), [(1, 1), (1, 2)], 0.0))
    case("pad_permuted", [randn(3, 4)], lambda x: pad(x.T, [(1, 0), (0, 1)], 3.0))
    case("permute_padded", [randn(3, 4)], lambda x: pad(x, [(1, 0), (0, 1)], 3.0).T)
    case("pad_twice", [randn(3)], lambda x: pad(pad(x, [(1, 1)], 1.0), [(2, 0)], 2.0))
    case("pad_size1", [randn(1)], lambda x: pad(x, [(4, 4)], 0.25))
    case("pad_axis", [randn(3, 4)], lambda x: pad(x, [(0, 0), (2, 1)], 0.0))
    # --- expand / squeeze / unsqueeze / flatten -------------------------------------------------
    case("expand_axis0", [randn(17)], lambda x: expand(x, 0, 3))
    case("expand_axis1", [randn(3)], lambda x: expand(x, 1, 4))
    case("expand_last", [randn(3, 4)], lambda x: expand(x, 2, 2))
    case("expand_neg_axis", [randn(3, 4)], lambda x: expand(x, -1, 2))
    case("expand_to_basic", [randn(1, 17)], lambda x: np.broadcast_to(x, (3, 17)))
    case("expand_to_rank_up", [randn(4)], lambda x: np.broadcast_to(x, (2, 3, 4)))
    case("expand_to_middle", [randn(3, 1, 2)], lambda x: np.broadcast_to(x, (3, 5, 2)))
    case("expand_to_scalar", [randn()], lambda x: np.broadcast_to(x, (2, 3)))
    case("slice_of_expanded", [randn(3)], lambda x: sl(expand(x, 0, 5), 0, 1, 3))
    case("expanded_permuted", [randn(3)], lambda x: expand(x, 1, 4).T)
    case("squeeze_0", [randn(1, 17)], lambda x: np.squeeze(x, 0))
    case("squeeze_neg", [randn(3, 1)], lambda x: np.squeeze(x, -1))
    case("squeeze_middle", [randn(2, 1, 3)], lambda x: np.squeeze(x, 1))
    case("unsqueeze_0", [randn(17)], lambda x: x[None])
    case("unsqueeze_2", [randn(3, 4)], lambda x: x[:, :, None])
    case("unsqueeze_middle", [randn(3, 4)], lambda x: x[:, None])
    case("flatten_all", [randn(2, 3, 4)], lambda x: x.reshape(24))
    case("flatten_mid", [randn(2, 3, 4, 5)], lambda x: x.reshape(2, 12, 5))
    case("flatten_neg_end", [randn(2, 3, 4)], lambda x: x.reshape(2, 12))
    case("flatten_permuted", [randn(2, 3, 4)], lambda x: tr(x, (2, 1, 0)).reshape(4, 6))
    # --- unfold (torch.Tensor.unfold) -------------------------------------------------------------
    case("unfold_1d", [randn(17)], lambda x: unfold(x, 0, 4, 2))
    case("unfold_2d_last", [randn(3, 10)], lambda x: unfold(x, 1, 3, 1))
    case("unfold_axis0", [randn(7, 3)], lambda x: unfold(x, 0, 3, 2))
    case("unfold_step_gt_size", [randn(10)], lambda x: unfold(x, 0, 2, 3))
    case("unfold_neg_axis", [randn(2, 9)], lambda x: unfold(x, -1, 5, 4))
    case("unfold_full", [randn(5)], lambda x: unfold(x, 0, 5, 1))
    # --- concat / split / chunk / stack -----------------------------------------------------------
    case("concat_axis0", [randn(3, 4), randn(2, 4)], lambda a, b: np.concatenate([a, b], 0))
    case("concat_axis1_three", [randn(3, 4), randn(3, 5), randn(3, 1)],
         lambda a, b, c: np.concatenate([a, b, c], 1))
    case("concat_neg_axis", [randn(2, 3, 1), randn(2, 3, 4)], lambda a, b: np.concatenate([a, b], -1))
    case("concat_along", [randn(17), randn(3)], lambda a, b: np.concatenate([a, b], 0))
    case("concat_3d_mid", [randn(2, 1, 3), randn(2, 4, 3)], lambda a, b: np.concatenate([a, b], 1))
    case("concat_ones", [randn(1), randn(1), randn(1)], lambda a, b, c: np.concatenate([a, b, c], 0))
    case("concat_permuted", [randn(4, 3), randn(3, 2)], lambda a, b: np.concatenate([a.T, b], 1))
    case("concat_same_twice", [randn(2, 3)], lambda a: np.concatenate([a, a], 0))
    case("split_axis0", [randn(17, 4)], lambda x: split(x, [1, 3, 13], 0), out=["f32"] * 3)
    case("split_axis1", [randn(3, 7)], lambda x: split(x, [2, 5], 1), out=["f32"] * 2)
    case("split_neg_axis", [randn(2, 3, 6)], lambda x: split(x, [3, 3], -1), out=["f32"] * 2)
    case("chunk_17_by_3", [randn(17, 2)], lambda x: split(x, chunk_sizes(17, 3), 0), out=["f32"] * 3)
    case("chunk_even", [randn(4, 12)], lambda x: split(x, chunk_sizes(12, 4), 1), out=["f32"] * 4)
    case("chunk_one", [randn(3, 5)], lambda x: [x], out=["f32"])
    case("stack_axis0", [randn(3, 4), randn(3, 4)], lambda a, b: np.stack([a, b], 0))
    case("stack_last", [randn(3, 4), randn(3, 4), randn(3, 4)], lambda a, b, c: np.stack([a, b, c], 2))
    case("stack_neg", [randn(5), randn(5)], lambda a, b: np.stack([a, b], -1))
    case("stack_scalars", [randn(), randn(), randn()], lambda a, b, c: np.stack([a, b, c], 0))
    # --- chains of views ------------------------------------------------------------------------
    case("permute_slice_pad", [randn(4, 6)], lambda x: pad(sl(x.T, 0, 1, 5), [(0, 1), (2, 0)], -1.0))
    case("expand_permute_slice", [randn(3, 4)],
         lambda x: sl(tr(expand(x, 0, 2), (2, 0, 1)), 2, 1, 3))
    case("pad_expand", [randn(3)], lambda x: expand(pad(x, [(1, 1)], 9.0), 0, 2))
    case("reshape_expand", [randn(6)], lambda x: np.broadcast_to(x.reshape(2, 1, 3), (2, 4, 3)))
    case("unfold_of_padded", [randn(2, 7)], lambda x: unfold(pad(x, [(0, 0), (1, 1)], 0.0), 1, 3, 2))
    case("concat_of_views", [randn(3, 4), randn(4, 3)],
         lambda a, b: np.concatenate([sl(a, 1, 1, 3), b.T, pad(a, [(0, 0), (1, 0)], 0.0)], 1))
    # --- other dtypes through views and copies (element sizes 1, 2, 4) ------------------------
    case("permute_f16", [randn(3, 5, dtype="f16")], lambda x: x.T, **EXACT)
    case("slice_bf16", [randn(4, 9, dtype="bf16")], lambda x: sl(x, 1, 2, 7), **EXACT)
    case("pad_f16_value", [randn(3, 4, dtype="f16")], lambda x: pad(x, [(1, 0), (0, 2)], 1.5), **EXACT)
    case("pad_i32_value", [randint(-9, 9, 3, 4)], lambda x: pad(x, [(0, 1), (2, 0)], 3))
    case("transpose_i32", [randint(-9, 9, 2, 3, 4)], lambda x: np.swapaxes(x, 0, 2))
    case("concat_i32", [randint(-9, 9, 2, 3), randint(-9, 9, 1, 3)], lambda a, b: np.concatenate([a, b]))
    case("permute_bool", [randbool(3, 17)], lambda x: x.T)
    case("concat_bool", [randbool(2, 3), randbool(2, 5)], lambda a, b: np.concatenate([a, b], 1))
    case("expand_bool", [randbool(3)], lambda x: expand(x, 0, 4))
    case("pad_bool", [randbool(2, 3)], lambda x: pad(x, [(1, 0), (0, 1)], False))
    case("stack_f16", [randn(3, dtype="f16"), randn(3, dtype="f16")], lambda a, b: np.stack([a, b], 1),
         **EXACT)
    case("permute_6d", [randn(2, 1, 3, 1, 2, 2)], lambda x: tr(x, (5, 2, 0, 4, 1, 3)))
    case("sum_6d_axes", [randn(2, 1, 3, 1, 2, 2)], lambda x: np.sum(x, axis=(1, 2, 5)))
    # --- outputs: an input, the same tensor twice, an intermediate ------------------------------
    case("input_as_output", [randn(3, 17)], lambda x: x, **EXACT)
    case("input_and_result_outputs", [randn(3, 4)], lambda x: [x, x * 2.0], out=["f32", "f32"])
    case("duplicate_outputs", [randn(3, 4)], lambda x: [np.exp(x), np.exp(x)], out=["f32", "f32"])
    case("intermediate_output", [randn(3, 4)], lambda x: [x + 1.0, np.exp(x + 1.0)],
         out=["f32", "f32"])
    case("view_and_base_outputs", [randn(3, 4)], lambda x: [x.T, sl(x, 1, 1, 3), np.sum(x, 0)],
         out=["f32", "f32", "f32"])
    case("slice_negative_bounds", [randn(5, 7)], lambda x: x[:, -4:-1])
    case("slice_end_past_dim", [randn(5, 7)], lambda x: x[2:])


def cases_nn():
    family("nn")
    mm = np.matmul
    big = dict(atol=1e-4)
    # --- softmax / log_softmax ------------------------------------------------------------------
    case("softmax_last", [randn(3, 17, scale=2.0)], lambda x: softmax(x, -1))
    case("softmax_axis0", [randn(3, 17, scale=2.0)], lambda x: softmax(x, 0))
    case("softmax_257", [randn(2, 257, scale=2.0)], lambda x: softmax(x, -1))
    case("softmax_3d_mid", [randn(2, 5, 3)], lambda x: softmax(x, 1))
    case("softmax_size1", [randn(3, 1)], lambda x: softmax(x, -1))
    case("softmax_large_logits", [arr([[1000.0, 1001.0, 999.0, -1000.0], [-500.0, -501.0, -502.0, -500.0]])],
         lambda x: softmax(x, -1))
    case("softmax_masked_neg_inf", [arr([[0.5, -inf, 1.5, -inf], [-inf, -inf, -inf, 2.0],
                                         [3.0, 1.0, -inf, 0.0]])], lambda x: softmax(x, -1))
    case("softmax_permuted", [randn(17, 3)], lambda x: softmax(x.T, -1))
    case("log_softmax_last", [randn(3, 17, scale=2.0)], lambda x: log_softmax(x, -1))
    case("log_softmax_axis0", [randn(3, 17, scale=2.0)], lambda x: log_softmax(x, 0))
    case("log_softmax_large_logits", [arr([[1000.0, 1001.0, 999.0], [-1000.0, 0.0, 1000.0]])],
         lambda x: log_softmax(x, -1), rtol=1e-5, atol=1e-3)
    # --- layer_norm / rms_norm -------------------------------------------------------------------
    case("layer_norm_last", [randn(3, 17, scale=2.0, shift=1.0)], lambda x: layer_norm(x, [-1], 1e-5),
         atol=1e-4)
    case("layer_norm_2axes", [randn(2, 3, 5)], lambda x: layer_norm(x, [-2, -1], 1e-5), atol=1e-4)
    case("layer_norm_axis0", [randn(4, 3)], lambda x: layer_norm(x, [0], 1e-5), atol=1e-4)
    case("layer_norm_257", [randn(2, 257)], lambda x: layer_norm(x, [-1], 1e-6), atol=1e-4)
    case("layer_norm_eps_large", [randn(3, 8, scale=0.1)], lambda x: layer_norm(x, [-1], 0.1),
         atol=1e-4)
    case("layer_norm_constant_row", [arr([[2.0, 2.0, 2.0, 2.0], [1.0, -1.0, 1.0, -1.0]])],
         lambda x: layer_norm(x, [-1], 1e-5), atol=1e-4)
    case("rms_norm_last", [randn(3, 17)], lambda x: rms_norm(x, [-1], 1e-6), atol=1e-4)
    case("rms_norm_axes", [randn(2, 3, 5)], lambda x: rms_norm(x, [1, 2], 1e-5), atol=1e-4)
    case("rms_norm_257", [randn(2, 257)], lambda x: rms_norm(x, [-1], 1e-5), atol=1e-4)
    case("rms_norm_eps_dominates", [arr([[0.0, 0.0, 0.0], [1e-3, -1e-3, 2e-3]])],
         lambda x: rms_norm(x, [-1], 1.0), atol=1e-6)
    # --- matmul ----------------------------------------------------------------------------------
    case("matmul_2d", [randn(3, 17), randn(17, 5)], mm)
    case("matmul_k257", [randn(2, 257), randn(257, 3)], mm, **big)
    case("matmul_n257", [randn(3, 4), randn(4, 257)], mm)
    case("matmul_1x1", [randn(1, 1), randn(1, 1)], mm)
    case("matmul_k1", [randn(3, 1), randn(1, 4)], mm)
    case("matmul_vec_mat", [randn(17), randn(17, 3)], mm)
    case("matmul_mat_vec", [randn(3, 17), randn(17)], mm)
    case("matmul_vec_vec", [randn(17), randn(17)], mm)
    case("matmul_batched", [randn(2, 3, 4), randn(2, 4, 5)], mm)
    case("matmul_bcast_batch", [randn(2, 1, 3, 4), randn(5, 4, 2)], mm)
    case("matmul_batched_mat", [randn(2, 3, 4), randn(4, 5)], mm)
    case("matmul_mat_batched", [randn(3, 4), randn(2, 4, 5)], mm)
    case("matmul_5d", [randn(2, 1, 2, 3, 4), randn(1, 2, 1, 4, 2)], mm)
    case("matmul_batched_vec", [randn(2, 3, 4), randn(4)], mm)
    case("matmul_vec_batched", [randn(4), randn(2, 4, 5)], mm)
    case("matmul_transposed_rhs", [randn(3, 17), randn(5, 17)], lambda a, b: a @ b.T)
    case("matmul_transposed_lhs", [randn(17, 3), randn(17, 5)], lambda a, b: a.T @ b)
    case("matmul_sliced", [randn(3, 12), randn(8, 4)], lambda a, b: sl(a, 1, 1, 9) @ b)
    case("matmul_expanded_rhs", [randn(2, 3, 4), randn(4, 5)],
         lambda a, b: a @ np.broadcast_to(b, (2, 4, 5)))
    case("matmul_padded", [randn(3, 4), randn(6, 2)], lambda a, b: pad(a, [(0, 0), (1, 1)], 0.5) @ b)
    case("matmul_i32", [randint(-10, 10, 3, 4), randint(-10, 10, 4, 5)], mm)
    case("matmul_f16", [randn(3, 17, dtype="f16"), randn(17, 5, dtype="f16")], mm, atol=3e-2)
    case("matmul_bf16", [randn(3, 17, dtype="bf16"), randn(17, 5, dtype="bf16")], mm, atol=1e-1)
    case("dot_17", [randn(17), randn(17)], np.dot)
    case("dot_257", [randn(257), randn(257)], np.dot, **big)
    case("dot_1", [randn(1), randn(1)], np.dot)
    case("dot_sliced", [randn(20), randn(3, 17)], lambda a, b: np.dot(sl(a, 0, 3, 20), b[1]))
    # --- tril / triu ------------------------------------------------------------------------------
    for k in (0, -1, 2):
        ks = str(k).replace("-", "neg")
        case(f"tril_{ks}", [randn(4, 5)], lambda x, k=k: np.tril(x, k))
        case(f"triu_{ks}", [randn(4, 5)], lambda x, k=k: np.triu(x, k))
    case("tril_batched", [randn(2, 4, 4)], lambda x: np.tril(x, 0))
    case("triu_batched_1", [randn(2, 3, 5)], lambda x: np.triu(x, 1))
    case("tril_tall", [randn(5, 3)], lambda x: np.tril(x, -2))
    # --- cumulative ops ---------------------------------------------------------------------------
    case("cumsum_axis0", [randn(5, 4)], lambda x: np.cumsum(x, 0))
    case("cumsum_last", [randn(3, 17)], lambda x: np.cumsum(x, -1))
    case("cumsum_257", [randn(257)], lambda x: np.cumsum(x, 0), **big)
    case("cumsum_3d_mid", [randn(2, 5, 3)], lambda x: np.cumsum(x, 1))
    case("cumprod_last", [unif(0.5, 1.5, 3, 17)], lambda x: np.cumprod(x, -1))
    case("cumprod_axis0", [randn(5, 3)], lambda x: np.cumprod(x, 0))
    case("cumprod_with_zero", [arr([2.0, 0.0, 3.0, -1.0])], lambda x: np.cumprod(x, 0))
    case("cummax_last", [randn(3, 17)], lambda x: np.maximum.accumulate(x, -1))
    case("cummax_axis0", [randn(6, 3)], lambda x: np.maximum.accumulate(x, 0))
    case("cummax_negative", [unif(-9.0, -1.0, 17)], lambda x: np.maximum.accumulate(x, 0))
    case("cumsum_i32", [randint(-100, 100, 3, 17)], lambda x: np.cumsum(x, 1))
    case("cumsum_permuted", [randn(17, 3)], lambda x: np.cumsum(x.T, -1))
    # --- small models -----------------------------------------------------------------------------
    case("mlp_gelu", [randn(3, 8), randn(8, 16, scale=0.3), randn(16, 4, scale=0.3)],
         lambda x, w1, w2: gelu(x @ w1) @ w2, rtol=1e-4, atol=1e-4)
    case("attention", [randn(4, 8), randn(6, 8), randn(6, 8)], attention, rtol=1e-4, atol=1e-5)
    case("attention_batched", [randn(2, 5, 8), randn(2, 7, 8), randn(2, 7, 4)], attention,
         rtol=1e-4, atol=1e-5)
    case("causal_attention", [randn(5, 8), randn(5, 8), randn(5, 8)], causal_attention,
         rtol=1e-4, atol=1e-5)
    case("residual_layer_norm", [randn(3, 8), randn(8, 8, scale=0.3)],
         lambda x, w: layer_norm(x + np.maximum(x @ w, 0.0), [-1], 1e-5), atol=1e-4)
    case("swiglu", [randn(3, 8), randn(8, 6, scale=0.3), randn(8, 6, scale=0.3)],
         lambda x, a, b: (x @ a) * sigmoid(x @ a) * (x @ b), rtol=1e-4, atol=1e-5)


def cases_conv():
    family("conv")
    tol = dict(atol=1e-4)

    def c1(name, x, w, stride=1, padding=0, dilation=1, groups=1):
        case(name, [randn(*x), randn(*w, scale=0.5)],
             lambda a, b: conv(a, b, (stride,), (padding,), (dilation,), groups), **tol)

    def c2(name, x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
        case(name, [randn(*x), randn(*w, scale=0.5)],
             lambda a, b: conv(a, b, stride, padding, dilation, groups), **tol)

    # --- conv1d: x [N, C, L], w [O, C/groups, K] --------------------------------------------------
    c1("conv1d_basic", (2, 3, 17), (4, 3, 3))
    c1("conv1d_stride2", (1, 3, 17), (2, 3, 3), stride=2)
    c1("conv1d_pad2", (1, 2, 17), (3, 2, 3), padding=2)
    c1("conv1d_dil2", (1, 2, 17), (3, 2, 3), dilation=2)
    c1("conv1d_groups2", (1, 4, 17), (6, 2, 3), groups=2)
    c1("conv1d_depthwise", (1, 3, 17), (3, 1, 5), padding=2, groups=3)
    c1("conv1d_k1", (2, 3, 17), (5, 3, 1))
    c1("conv1d_all", (2, 4, 17), (4, 2, 3), stride=2, padding=1, dilation=2, groups=2)
    c1("conv1d_l257", (1, 2, 257), (3, 2, 4), stride=3)
    c1("conv1d_l1", (2, 3, 1), (2, 3, 1))
    c1("conv1d_kernel_eq_len", (1, 2, 5), (3, 2, 5))
    c1("conv1d_stride_gt_kernel", (1, 1, 17), (2, 1, 2), stride=3, padding=1)
    case("conv1d_permuted_input", [randn(2, 17, 3), randn(4, 3, 3, scale=0.5)],
         lambda a, b: conv(np.transpose(a, (0, 2, 1)), b, (1,), (1,), (1,), 1), **tol)
    # --- conv2d: x [N, C, H, W], w [O, C/groups, kH, kW] -------------------------------------------
    c2("conv2d_basic", (1, 2, 7, 9), (3, 2, 3, 3))
    c2("conv2d_stride", (1, 2, 7, 9), (3, 2, 3, 3), stride=(2, 1))
    c2("conv2d_pad", (1, 2, 5, 6), (2, 2, 3, 3), padding=(1, 2))
    c2("conv2d_dil", (1, 1, 9, 9), (2, 1, 3, 3), dilation=(2, 2))
    c2("conv2d_groups", (1, 4, 6, 6), (4, 2, 3, 3), groups=2)
    c2("conv2d_depthwise", (2, 3, 5, 5), (3, 1, 3, 3), padding=(1, 1), groups=3)
    c2("conv2d_1x1", (2, 3, 4, 5), (6, 3, 1, 1))
    c2("conv2d_rect_kernel", (1, 2, 6, 7), (3, 2, 2, 3))
    c2("conv2d_all", (2, 4, 8, 7), (6, 2, 3, 2), stride=(2, 3), padding=(1, 2), dilation=(2, 1),
       groups=2)
    c2("conv2d_h1", (1, 3, 1, 17), (2, 3, 1, 3))
    case("conv2d_nhwc_permuted", [randn(1, 5, 6, 2), randn(3, 2, 3, 3, scale=0.5)],
         lambda a, b: conv(np.transpose(a, (0, 3, 1, 2)), b, (1, 1), (1, 1), (1, 1), 1), **tol)
    # --- pooling -------------------------------------------------------------------------------
    def p1(name, mode, shape, k, s, p, gen=randn):
        case(name, [gen(*shape)], lambda x: pool(x, (k,), (s,), (p,), mode))

    def p2(name, mode, shape, k, s, p, gen=randn):
        case(name, [gen(*shape)], lambda x: pool(x, k, s, p, mode))

    neg = lambda *s: unif(-9.0, -1.0, *s)  # noqa: E731  (all negative: -inf padding matters)
    p1("avg_pool1d_k2s2", "avg", (2, 3, 17), 2, 2, 0)
    p1("avg_pool1d_k3s1p1", "avg", (1, 2, 17), 3, 1, 1)
    p1("avg_pool1d_k3s2p1", "avg", (1, 2, 17), 3, 2, 1)
    p1("avg_pool1d_l257", "avg", (1, 1, 257), 4, 4, 0)
    p1("max_pool1d_k2s2", "max", (2, 3, 17), 2, 2, 0)
    p1("max_pool1d_k3s1p1_neg", "max", (1, 2, 17), 3, 1, 1, neg)
    p1("max_pool1d_k3s2p1_neg", "max", (1, 2, 17), 3, 2, 1, neg)
    p1("max_pool1d_k5s3", "max", (1, 2, 257), 5, 3, 0)
    p2("avg_pool2d_2x2", "avg", (1, 2, 6, 8), (2, 2), (2, 2), (0, 0))
    p2("avg_pool2d_3x3_s2_p1", "avg", (1, 2, 7, 7), (3, 3), (2, 2), (1, 1))
    p2("avg_pool2d_rect", "avg", (2, 1, 5, 9), (2, 3), (1, 2), (0, 1))
    p2("max_pool2d_2x2", "max", (1, 2, 6, 8), (2, 2), (2, 2), (0, 0))
    p2("max_pool2d_3x3_s2_p1_neg", "max", (1, 2, 7, 7), (3, 3), (2, 2), (1, 1), neg)
    p2("max_pool2d_rect", "max", (2, 1, 5, 9), (2, 3), (1, 2), (0, 1), neg)
    # --- nearest upsampling --------------------------------------------------------------------
    case("upsample_nearest1d_2", [randn(2, 3, 17)], lambda x: np.repeat(x, 2, axis=-1))
    case("upsample_nearest1d_3", [randn(1, 2, 5)], lambda x: np.repeat(x, 3, axis=-1))
    case("upsample_nearest1d_1", [randn(1, 2, 5)], lambda x: x)
    case("upsample_nearest2d_2", [randn(1, 2, 3, 4)],
         lambda x: np.repeat(np.repeat(x, 2, axis=-1), 2, axis=-2))
    case("upsample_nearest2d_3", [randn(2, 1, 2, 3)],
         lambda x: np.repeat(np.repeat(x, 3, axis=-1), 3, axis=-2))
    # --- a small conv net --------------------------------------------------------------------------
    case("conv_relu_pool", [randn(1, 2, 8, 8), randn(4, 2, 3, 3, scale=0.5)],
         lambda x, w: pool(np.maximum(conv(x, w, (1, 1), (1, 1), (1, 1), 1), 0.0), (2, 2), (2, 2),
                           (0, 0), "max"), **tol)


def cases_index():
    family("index")
    tal = np.take_along_axis
    # --- gather (torch.gather) -------------------------------------------------------------------
    case("gather_axis0", [randn(4, 5), randint(0, 4, 3, 5)], lambda x, i: tal(x, i, 0))
    case("gather_axis1", [randn(4, 5), randint(0, 5, 4, 7)], lambda x, i: tal(x, i, 1))
    case("gather_neg_axis_3d", [randn(2, 3, 6), randint(0, 6, 2, 3, 4)], lambda x, i: tal(x, i, -1))
    case("gather_axis1_3d", [randn(2, 5, 3), randint(0, 5, 2, 2, 3)], lambda x, i: tal(x, i, 1))
    case("gather_1d", [randn(17), randint(0, 17, 9)], lambda x, i: tal(x, i, 0))
    case("gather_i32_data", [randint(-50, 50, 4, 5), randint(0, 5, 4, 2)], lambda x, i: tal(x, i, 1))
    case("gather_permuted_data", [randn(5, 4), randint(0, 5, 4, 3)], lambda x, i: tal(x.T, i, 1))
    # --- index_select ---------------------------------------------------------------------------
    case("index_select_axis0", [randn(5, 4), arr([4, 0, 2, 2], "i32")], lambda x, i: np.take(x, i, 0))
    case("index_select_axis1", [randn(3, 17), randint(0, 17, 5)], lambda x, i: np.take(x, i, 1))
    case("index_select_3d_last", [randn(2, 3, 6), randint(0, 6, 8)], lambda x, i: np.take(x, i, -1))
    case("index_select_single", [randn(257, 3), arr([256], "i32")], lambda x, i: np.take(x, i, 0))
    case("index_select_permuted", [randn(3, 5), randint(0, 3, 4)], lambda x, i: np.take(x.T, i, 1))
    case("index_select_f16", [randn(6, 3, dtype="f16"), randint(0, 6, 4)], lambda x, i: np.take(x, i, 0),
         **EXACT)
    # --- embedding ------------------------------------------------------------------------------
    case("embedding_1d", [randn(10, 4), randint(0, 10, 3)], lambda t, i: t[i])
    case("embedding_2d_ids", [randn(10, 4), randint(0, 10, 2, 5)], lambda t, i: t[i])
    case("embedding_257_rows", [randn(257, 3), randint(0, 257, 17)], lambda t, i: t[i])
    case("embedding_scalar_id", [randn(6, 5), arr(3, "i32")], lambda t, i: t[i])
    case("embedding_repeated", [randn(4, 3), arr([1, 1, 0, 3, 1], "i32")], lambda t, i: t[i])
    case("embedding_bf16", [randn(10, 4, dtype="bf16"), randint(0, 10, 6)], lambda t, i: t[i], **EXACT)
    case("embedding_i32_table", [randint(-9, 9, 5, 3), randint(0, 5, 4)], lambda t, i: t[i])
    case("embedding_sliced_table", [randn(10, 6), randint(0, 10, 4)], lambda t, i: sl(t, 1, 2, 5)[i])
    case("embedding_bool_table", [randbool(5, 3), randint(0, 5, 4)], lambda t, i: t[i])
    # --- one_hot --------------------------------------------------------------------------------
    case("one_hot_basic", [arr([0, 3, 1, 1, 2], "i32")], lambda i: np.eye(4)[i], out="f32")
    case("one_hot_2d", [randint(0, 7, 2, 3)], lambda i: np.eye(7)[i], out="f32")
    case("one_hot_c1", [arr([0, 0, 0], "i32")], lambda i: np.eye(1)[i], out="f32")
    case("one_hot_257", [randint(0, 257, 3)], lambda i: np.eye(257)[i], out="f32")
    # --- creation ops ---------------------------------------------------------------------------
    case("iota_z", [], lambda: np.arange(17), out="i32")
    case("iota_mul2", [], lambda: np.arange(5) * 2, out="i32")
    case("iota_plus3_len1", [], lambda: np.arange(1) + 3, out="i32")
    case("iota_257", [], lambda: np.arange(257), out="i32")
    case("iota_mod3", [], lambda: np.arange(10) % 3, out="i32")
    case("iota_div2", [], lambda: np.arange(9) // 2, out="i32")
    case("iota_affine", [], lambda: np.arange(6) * 3 + 1, out="i32")
    case("arange_17", [], lambda: np.arange(17), out="f32")
    case("arange_1", [], lambda: np.arange(1), out="f32")
    case("arange_257", [], lambda: np.arange(257), out="f32")
    case("constant_scalar", [], lambda: np.float64(1.5), out="f32")
    case("constant_i32", [], lambda: np.int64(2), out="i32")
    case("constant_of_f16", [], lambda: np.float64(0.1), out="f16", **EXACT)
    case("full_2x3", [], lambda: np.full((2, 3), 0.5), out="f32")
    case("constant_expr_static", [], lambda: np.int64(7), out="i32")
    case("zeros_3x4", [], lambda: np.zeros((3, 4)), out="f32")
    case("ones_17", [], lambda: np.ones(17), out="f32")
    case("constant_plus_input", [randn(3, 17)], lambda x: 2.0 + x)
    case("arange_times_input", [randn(3, 17)], lambda x: np.arange(17) * x)
    case("full_minus_input", [randn(2, 3)], lambda x: np.full((2, 3), 0.5) - x)
    case("iota_as_index", [randn(9, 2)], lambda x: np.take(x, np.arange(4) * 2, 0))
    case("iota_cast_f32", [], lambda: (np.arange(7) * 2).astype(np.float64), out="f32")


def cases_dtype():
    family("dtype")
    f16, bf16 = "f16", "bf16"
    trunc = np.trunc
    # --- casts ----------------------------------------------------------------------------------
    case("cast_f32_i32", [randn(3, 17, scale=10.0)], trunc, out="i32")
    case("cast_f32_i32_edges", [arr([-2.7, -2.0, -0.5, -0.0, 0.0, 0.5, 0.999, 1.0, 2.5, 3.5, -3.5,
                                     1e6 + 0.5, -1e6 - 0.5])], trunc, out="i32")
    case("cast_f32_bool", [arr([0.0, -0.0, 1.0, -2.5, 1e-30, inf, -inf, nan])], lambda x: x != 0,
         out="bool")
    case("cast_i32_f32", [randint(-100000, 100000, 3, 17)], lambda x: x.astype(np.float64), out="f32")
    case("cast_i32_bool", [randint(-2, 3, 17)], lambda x: x != 0, out="bool")
    case("cast_bool_f32", [randbool(3, 17)], lambda x: x.astype(np.float64), out="f32")
    case("cast_bool_i32", [randbool(3, 17)], lambda x: x.astype(np.int64), out="i32")
    case("cast_bool_f16", [randbool(17)], lambda x: x.astype(np.float64), out=f16, **EXACT)
    case("cast_f32_f16", [randn(3, 17, scale=3.0)], lambda x: x, out=f16, atol=0.0, rtol=0.0)
    case("cast_f32_f16_edges", [arr([70000.0, -70000.0, 65504.0, 65519.0, 65520.0, 1e-8, -1e-8,
                                     6e-8, 1.00048828125, 1.00146484375, inf, nan])],
         lambda x: x, out=f16, atol=0.0, rtol=0.0)
    case("cast_f16_f32", [randn(3, 17, dtype=f16, scale=100.0)], lambda x: x, out="f32", atol=0.0,
         rtol=0.0)
    case("cast_f32_bf16", [randn(3, 17, scale=3.0)], lambda x: x, out=bf16, atol=0.0, rtol=0.0)
    case("cast_f32_bf16_edges", [arr([1.00390625, 1.01171875, 3e38, -3.39e38, 1e-30, inf, -inf, nan])],
         lambda x: x, out=bf16, atol=0.0, rtol=0.0)
    case("cast_bf16_f32", [randn(3, 17, dtype=bf16, scale=1e4)], lambda x: x, out="f32", atol=0.0,
         rtol=0.0)
    case("cast_f16_bf16", [randn(17, dtype=f16, scale=10.0)], lambda x: x, out=bf16, atol=0.0, rtol=0.0)
    case("cast_bf16_f16", [randn(17, dtype=bf16, scale=10.0)], lambda x: x, out=f16, atol=0.0, rtol=0.0)
    case("cast_f16_i32", [randn(17, dtype=f16, scale=20.0)], trunc, out="i32")
    case("cast_bf16_i32", [randn(17, dtype=bf16, scale=20.0)], trunc, out="i32")
    case("cast_i32_f16", [randint(-2000, 2000, 17)], lambda x: x.astype(np.float64), out=f16,
         atol=0.0, rtol=0.0)
    case("cast_i32_bf16", [randint(-2000, 2000, 17)], lambda x: x.astype(np.float64), out=bf16,
         atol=0.0, rtol=0.0)
    case("cast_f32_f16_f32", [randn(3, 17, scale=3.0)],
         lambda x: x.astype(np.float16).astype(np.float64), out="f32", atol=0.0, rtol=0.0)
    case("cast_same_dtype", [randn(5)], lambda x: x, atol=0.0, rtol=0.0)
    case("cast_permuted", [randn(17, 3, scale=10.0)], lambda x: trunc(x.T), out="i32")
    case("count_true", [randbool(3, 17)], lambda x: np.sum(x, axis=1).astype(np.float64), out="f32")
    case("count_lt_i32", [randn(3, 17)], lambda x: np.sum(x < 0.0, axis=1), out="i32")
    # --- f16 compute ----------------------------------------------------------------------------
    case("exp2_f16", [randn(3, 17, dtype=f16, scale=2.0)], np.exp2)
    case("log2_f16", [unif(0.1, 100.0, 3, 17, dtype=f16)], np.log2)
    case("sin_f16", [unif(-6.0, 6.0, 3, 17, dtype=f16)], np.sin)
    case("sqrt_f16", [unif(0.0, 100.0, 3, 17, dtype=f16)], np.sqrt, **ULP_F16)
    case("recip_f16", [away(0.1, 10.0, 3, 17, dtype=f16)], lambda x: 1.0 / x, **ULP_F16)
    case("exp_f16", [randn(3, 17, dtype=f16, scale=2.0)], np.exp)
    case("relu_f16", [randn(3, 17, dtype=f16)], lambda x: np.maximum(x, 0.0), **EXACT)
    case("exp_f16_overflow", [arr([12.0, -20.0, 0.0], dtype=f16)], np.exp)
    case("gelu_f16", [randn(3, 17, dtype=f16, scale=2.0)], gelu)
    case("softmax_f16", [randn(3, 17, dtype=f16, scale=2.0)], lambda x: softmax(x, -1))
    case("layer_norm_f16", [randn(3, 17, dtype=f16)], lambda x: layer_norm(x, [-1], 1e-5), atol=3e-2)
    case("sum_f16_257", [randn(257, dtype=f16)], lambda x: np.sum(x), atol=0.25, rtol=1e-2)
    # --- bf16 compute ---------------------------------------------------------------------------
    # Composites round every intermediate to bf16 (8-bit significand): exp(x) = exp2(x·log2 e)
    # loses ~|x|·2^-9 in the exponent, hence the looser rtol.
    case("exp_bf16", [randn(3, 17, dtype=bf16, scale=2.0)], np.exp, rtol=3e-2)
    case("sigmoid_bf16", [randn(3, 17, dtype=bf16, scale=3.0)], sigmoid)
    case("silu_bf16", [randn(3, 17, dtype=bf16, scale=3.0)], lambda x: x * sigmoid(x))
    case("sqrt_bf16", [unif(0.0, 1000.0, 17, dtype=bf16)], np.sqrt, **ULP_BF16)
    case("softmax_bf16", [randn(3, 17, dtype=bf16, scale=2.0)], lambda x: softmax(x, -1))
    case("rms_norm_bf16", [randn(3, 17, dtype=bf16)], lambda x: rms_norm(x, [-1], 1e-5), atol=5e-2)
    case("exp_bf16_overflow", [arr([89.0, 100.0, -100.0, 0.0, -inf], dtype=bf16)], np.exp)
    # --- mixed-dtype pipelines ------------------------------------------------------------------
    case("f16_to_f32_mul", [randn(3, 17, dtype=f16), randn(3, 17)],
         lambda a, b: a * b, out="f32")
    case("f32_compute_to_bf16", [randn(3, 17)], lambda x: np.exp(x), out=bf16)
    case("i32_ids_to_f32_math", [randint(0, 10, 17)], lambda i: i.astype(np.float64) * 0.5, out="f32")


def cases_dynamic():
    family("dynamic")

    def rr(dims, *inputs):
        return {"dims": dims, "inputs": list(inputs)}

    S = "seq"
    case("dyn_exp", [randn(17, 3, decl=[S, 3])], np.exp, dims={S: 17},
         reruns=[rr({S: 1}, randn(1, 3)), rr({S: 5}, randn(5, 3))])
    case("dyn_add_bcast", [randn(17, 4, decl=[S, 4]), randn(4)], np.add, dims={S: 17},
         reruns=[rr({S: 3}, randn(3, 4), randn(4))])
    case("dyn_sum_seq", [randn(17, 3, decl=[S, 3])], lambda x: np.sum(x, 0), dims={S: 17},
         reruns=[rr({S: 1}, randn(1, 3)), rr({S: 257}, randn(257, 3))], atol=1e-4)
    case("dyn_sum_static_axis", [randn(17, 3, decl=[S, 3])], lambda x: np.sum(x, 1), dims={S: 17},
         reruns=[rr({S: 2}, randn(2, 3))])
    case("dyn_mean_seq", [randn(17, 3, decl=[S, 3])], lambda x: np.mean(x, 0), dims={S: 17},
         reruns=[rr({S: 4}, randn(4, 3)), rr({S: 1}, randn(1, 3))])
    case("dyn_max_seq", [randn(3, 17, decl=[3, S])], lambda x: np.max(x, -1), dims={S: 17},
         reruns=[rr({S: 6}, randn(3, 6))])
    case("dyn_var_seq", [randn(3, 17, decl=[3, S])], lambda x: np.var(x, -1, ddof=1), dims={S: 17},
         reruns=[rr({S: 5}, randn(3, 5))])
    case("dyn_softmax_seq", [randn(3, 17, decl=[3, S])], lambda x: softmax(x, -1), dims={S: 17},
         reruns=[rr({S: 257}, randn(3, 257)), rr({S: 1}, randn(3, 1))])
    case("dyn_layer_norm", [randn(2, 17, decl=[2, "d"])], lambda x: layer_norm(x, [-1], 1e-5),
         dims={"d": 17}, reruns=[rr({"d": 8}, randn(2, 8))], atol=1e-4)
    case("dyn_matmul_rows", [randn(17, 8, decl=[S, 8]), randn(8, 5)], np.matmul, dims={S: 17},
         reruns=[rr({S: 2}, randn(2, 8), randn(8, 5))])
    case("dyn_matmul_inner", [randn(3, 17, decl=[3, "k"]), randn(17, 4, decl=["k", 4])], np.matmul,
         dims={"k": 17}, reruns=[rr({"k": 1}, randn(3, 1), randn(1, 4))])
    case("dyn_two_dims", [randn(3, 17, decl=["a", "b"])], lambda x: np.sum(x, (0, 1)),
         dims={"a": 3, "b": 17}, reruns=[rr({"a": 1, "b": 257}, randn(1, 257))], atol=1e-4)
    case("dyn_concat", [randn(17, 3, decl=[S, 3]), randn(2, 3)],
         lambda a, b: np.concatenate([a, b], 0), dims={S: 17}, reruns=[rr({S: 1}, randn(1, 3), randn(2, 3))])
    case("dyn_concat_two_dyn", [randn(5, 2, decl=["a", 2]), randn(3, 2, decl=["b", 2])],
         lambda a, b: np.concatenate([a, b], 0), dims={"a": 5, "b": 3},
         reruns=[rr({"a": 2, "b": 7}, randn(2, 2), randn(7, 2))])
    case("dyn_slice_to_end", [randn(17, 4, decl=[S, 4])], lambda x: x[1:], dims={S: 17},
         reruns=[rr({S: 3}, randn(3, 4))])
    case("dyn_slice_static", [randn(17, 4, decl=[S, 4])], lambda x: x[:, 1:3], dims={S: 17},
         reruns=[rr({S: 2}, randn(2, 4))])
    case("dyn_pad", [randn(17, decl=[S])], lambda x: pad(x, [(1, 2)], 0.5), dims={S: 17},
         reruns=[rr({S: 1}, randn(1))])
    case("dyn_permute", [randn(17, 3, decl=[S, 3])], lambda x: x.T, dims={S: 17},
         reruns=[rr({S: 4}, randn(4, 3))])
    case("dyn_argmax", [randn(3, 17, decl=[3, S])], lambda x: np.argmax(x, -1), out="i32",
         dims={S: 17}, reruns=[rr({S: 2}, randn(3, 2))])
    case("dyn_cumsum", [randn(17, decl=[S])], lambda x: np.cumsum(x), dims={S: 17},
         reruns=[rr({S: 5}, randn(5))])
    case("dyn_expand_to", [randn(17, 1, decl=[S, 1])], lambda x: np.broadcast_to(x, (x.shape[0], 5)),
         dims={S: 17}, reruns=[rr({S: 2}, randn(2, 1))])
    case("dyn_reshape", [randn(17, 4, decl=[S, 4])], lambda x: x.reshape(x.shape[0], 2, 2), dims={S: 17},
         reruns=[rr({S: 3}, randn(3, 4))])
    case("dyn_embedding", [randn(10, 4), randint(0, 10, 17, decl=[S])], lambda t, i: t[i], dims={S: 17},
         reruns=[rr({S: 1}, randn(10, 4), randint(0, 10, 1))])
    case("dyn_arange", [], lambda dims: np.arange(dims["n"]), fn_dims=True, out="f32", dims={"n": 17},
         reruns=[rr({"n": 1}), rr({"n": 257})])
    case("dyn_conv1d", [randn(1, 2, 17, decl=[1, 2, "L"]), randn(3, 2, 3, scale=0.5)],
         lambda x, w: conv(x, w, (1,), (1,), (1,), 1), dims={"L": 17},
         reruns=[rr({"L": 5}, randn(1, 2, 5), randn(3, 2, 3))], atol=1e-4)
    case("dyn_attention", [randn(5, 8, decl=[S, 8]), randn(5, 8, decl=[S, 8]), randn(5, 8, decl=[S, 8])],
         attention, dims={S: 5}, reruns=[rr({S: 17}, randn(17, 8), randn(17, 8), randn(17, 8)),
                                         rr({S: 1}, randn(1, 8), randn(1, 8), randn(1, 8))],
         rtol=1e-4)
    case("dyn_constant_expr", [randn(3)], lambda x, dims: x + (2 * dims["n"] + 1), fn_dims=True,
         dims={"n": 5}, reruns=[rr({"n": 0}, randn(3)), rr({"n": 40}, randn(3))])
    case("dyn_batched_matmul", [randn(2, 3, 4, decl=["b", 3, 4]), randn(4, 5)], np.matmul, dims={"b": 2},
         reruns=[rr({"b": 1}, randn(1, 3, 4), randn(4, 5)), rr({"b": 5}, randn(5, 3, 4), randn(4, 5))])
    case("rerun_static_new_data", [randn(3, 17), randn(17)], lambda a, b: np.exp(a) * b,
         reruns=[rr({}, randn(3, 17), randn(17)), rr({}, randn(3, 17), randn(17))])
    case("dyn_f16_exp", [randn(17, 3, dtype="f16", decl=[S, 3])], np.exp, dims={S: 17},
         reruns=[rr({S: 2}, randn(2, 3, dtype="f16"))])


def define_all():
    cases_unary()
    cases_binary()
    cases_reduce()
    cases_movement()
    cases_nn()
    cases_conv()
    cases_index()
    cases_dtype()
    cases_dynamic()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the fixture is out of date")
    ap.add_argument("--out", default=OUT_PATH)
    args = ap.parse_args()
    define_all()
    lines = []
    for name in sorted(CASES):
        lines.append(json.dumps(name) + ":" + json.dumps(CASES[name], separators=(",", ":"),
                                                         allow_nan=False))
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    json.loads(text)  # sanity
    counts = {}
    for c in CASES.values():
        counts[c["family"]] = counts.get(c["family"], 0) + 1
    summary = ", ".join(f"{f} {counts.get(f, 0)}" for f in FAMILIES)
    if args.check:
        with open(args.out) as f:
            if f.read() != text:
                sys.exit(f"{args.out} is stale: rerun scripts/gen_op_fixtures.py")
        print(f"up to date: {len(CASES)} cases ({summary})")
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {len(CASES)} cases ({summary}), {len(text) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
