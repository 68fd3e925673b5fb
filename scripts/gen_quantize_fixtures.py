#!/usr/bin/env python3
"""Fixtures for luminal's block encoders (`luminal::quant::encode`, casts to q8_0 & co.).

    pip install numpy gguf        # tested with gguf 0.19
    python3 scripts/gen_quantize_fixtures.py          # writes crates/luminal/src/testing/fixtures/quantize.json
    python3 scripts/gen_quantize_fixtures.py --check  # fails if the checked-in file is stale

Expected bytes come from gguf-py's numpy quantizers (`gguf.quants.quantize`), which are
bit-exact with ggml's reference `quantize_row_*_ref`; expected values from
`gguf.quants.dequantize` of those bytes. Nothing here runs luminal.

Per type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) a list of cases, each {"name", "values" (f32s, exact
as JSON doubles), "bytes" (hex), "decoded" (f32s)}: activation-like random blocks, keys with
outlier channels, an all-zero block, one nonzero value, exact rounding ties (x / d = k + 1/2),
tiny (f16-subnormal scales) and large magnitudes, and constant blocks.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = Path(__file__).resolve().parent.parent / "crates/luminal/src/testing/fixtures/quantize.json"
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def cases() -> dict[str, np.ndarray]:
    c: dict[str, np.ndarray] = {}
    c["random"] = rng("random").standard_normal(32 * 6).astype(np.float32)
    k = rng("keys").standard_normal(32 * 4).astype(np.float32)
    k[[3, 40, 77, 100]] *= 40.0  # outlier channels, as RoPE'd keys have
    c["keys_with_outliers"] = k
    c["zeros"] = np.zeros(32, np.float32)
    one = np.zeros(64, np.float32)
    one[5], one[32 + 31] = -3.25, 0.125
    c["one_nonzero"] = one
    # Q8_0 with max 127: d = 1, so x.5 values are exact ties (round half away from zero).
    t = np.zeros(32, np.float32)
    t[0] = 127.0
    t[1:9] = [2.5, -2.5, 0.5, -0.5, 126.5, -1.5, 3.5, -100.5]
    c["ties"] = t
    c["tiny"] = (rng("tiny").standard_normal(32) * 1e-6).astype(np.float32)
    c["large"] = (rng("large").standard_normal(32) * 1.5e4).astype(np.float32)
    c["constant"] = np.concatenate([np.full(32, 0.7, np.float32), np.full(32, -2.0, np.float32)])
    return c


def build() -> dict:
    out = {}
    for name in TYPES:
        qt = getattr(T, name)
        items = []
        for cname, x in cases().items():
            b = quants.quantize(x.reshape(-1, 32), qt)
            d = quants.dequantize(b, qt).reshape(-1).astype(np.float32)
            items.append(
                {
                    "name": cname,
                    "values": [float(v) for v in x],
                    "bytes": bytes(b.reshape(-1)).hex(),
                    "decoded": [float(v) for v in d],
                }
            )
        out[name] = items
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = json.dumps(build(), indent=None, separators=(",", ":")) + "\n"
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
