#!/usr/bin/env python3
"""Generate the test fixtures of luminal_io (GGUF, ggml block quants, safetensors).

    pip install numpy gguf safetensors ml_dtypes   # tested with gguf 0.19, safetensors 0.8
    python3 scripts/gen_gguf_fixtures.py           # writes crates/luminal_io/tests/fixtures/
    python3 scripts/gen_gguf_fixtures.py --check   # fails if a checked-in fixture is stale

Every expected value comes from an independent implementation: gguf-py's numpy dequantisers
(`gguf.quants.dequantize`), gguf-py's `GGUFWriter`/`GGUFReader`, the `safetensors` package and
numpy. Nothing here runs luminal. Randomness is seeded by a CRC of each item's name, so runs are
reproducible and adding an item never changes another.

Files written (all small; the total stays well under 1 MB):

* quant_blocks.json: per ggml type, a few cases of raw block bytes (hex) and the f32 values
  gguf-py decodes them to.  Types gguf-py can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) get a
  case quantized from real-looking random floats plus a case of random bytes; the k-quants
  (which gguf-py can only decode) get random bytes.  In random cases the f16 (or f32) scale
  fields are overwritten with sane finite values so the expected values are finite.  gguf-py
  cannot decode Q8_K, so its expected values are computed here with numpy as
  d · qs (block = f32 d, i8 qs[256], i16 bsums[16]); that formula is the whole format.
* tiny.gguf + tiny.expected.json: a GGUF v3 file written by gguf.GGUFWriter with alignment 64,
  metadata of every value type (incl. nested arrays and unicode strings) and tensors of types
  F32, F16, BF16, Q8_0, Q4_1, Q4_K, Q6_K; the JSON has the metadata in file order, tensor
  offsets as gguf.GGUFReader reads them, and each tensor's values decoded by gguf-py.
  Metadata values are written as {"t": type, "v": value}; arrays as
  {"t": "array", "elem": element type, "v": [values or nested array objects]}.
* tiny.safetensors + sharded/ (a model.safetensors.index.json over two shards) +
  safetensors.expected.json: F32/F16/BF16 tensors (and an I64 one, which the reader must
  refuse to convert), values as numpy reads them.
* smollm2_sample.json, only when models/SmolLM2-135M-Instruct.Q4_1.gguf is present (or
  --smollm2 PATH is given): header facts of the real model and the first rows of a few tensors
  (raw bytes + gguf-py's decoded values), so the decoders are also checked on real weights.
  The checked-in copy is kept when the model is absent.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "luminal_io" / "tests" / "fixtures"
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def f32_values(values) -> list[float]:
    """Exact f32 values as Python floats (json writes them as shortest round-trip decimals)."""
    return [float(x) for x in np.asarray(values, dtype=np.float32).ravel()]


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Block decoders

# Byte offsets of the f16 scale fields in each block; random bytes there would give NaN/inf.
F16_SCALE_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}
QUANTIZABLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
K_QUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def realistic_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Weight-like values: small normal noise, a few outliers, one exact zero block edge."""
    x = rng.standard_normal(n).astype(np.float32) * np.float32(0.02)
    outliers = rng.choice(n, size=max(1, n // 40), replace=False)
    x[outliers] *= np.float32(12.0)
    x[0] = 0.0
    return x


def random_blocks(qtype: Q, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if qtype == Q.Q8_K:
        d = rng.uniform(-0.01, 0.01, size=n_blocks).astype("<f4")
        blocks[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
        return blocks
    for at in F16_SCALE_FIELDS[qtype]:
        scale = rng.uniform(-0.05, 0.05, size=n_blocks).astype("<f2")
        blocks[:, at:at + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def dequantize_q8_k(blocks: np.ndarray) -> np.ndarray:
    d = blocks[:, 0:4].copy().view("<f4").astype(np.float32)  # (n, 1)
    qs = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)  # (n, 256)
    return (d * qs).ravel()


def decode(qtype: Q, blocks: np.ndarray) -> np.ndarray:
    if qtype == Q.Q8_K:
        return dequantize_q8_k(blocks)
    return dequantize(blocks.ravel(), qtype).astype(np.float32).ravel()


def quant_case(how: str, qtype: Q, blocks: np.ndarray) -> dict:
    return {"how": how, "data": blocks.tobytes().hex(), "values": f32_values(decode(qtype, blocks))}


def plain_case(qtype: Q, rng: np.random.Generator, n: int) -> dict:
    """F16/BF16: random bit patterns over the whole finite range (subnormals included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exponent_all_ones = 0x7C00 if qtype == Q.F16 else 0x7F80
    bits[(bits & exponent_all_ones) == exponent_all_ones] &= np.uint16(~0x4000 & 0xFFFF)
    bits[:4] = [0x0000, 0x8000, 0x0001, 0x3C00]  # +0, -0, smallest subnormal, 1.0 (in f16)
    data = bits.astype("<u2").view(np.uint8)
    return {"how": "random finite bit patterns", "data": data.tobytes().hex(),
            "values": f32_values(dequantize(data, qtype))}


def gen_quant_blocks() -> dict:
    out = {}
    for qtype in [Q.F16, Q.BF16]:
        out[qtype.name] = {"type_id": int(qtype), "block_size": 1, "type_size": 2,
                           "cases": [plain_case(qtype, rng_for(qtype.name), 64)]}
    for qtype in QUANTIZABLE + K_QUANTS + [Q.Q8_K]:
        rng = rng_for(qtype.name)
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        cases = []
        if qtype in QUANTIZABLE:
            x = realistic_floats(rng, 4 * block_size).reshape(1, -1)
            q = quantize(x, qtype).reshape(4, type_size)
            cases.append(quant_case("gguf.quants.quantize(weight-like floats)", qtype, q))
        n_random = 3 if block_size == 256 else 4
        cases.append(quant_case("random bytes, sane scales", qtype,
                                random_blocks(qtype, n_random, rng)))
        out[qtype.name] = {"type_id": int(qtype), "block_size": block_size,
                           "type_size": type_size, "cases": cases}
    return out


# ---------------------------------------------------------------------------------------------
# tiny.gguf

def tiny_metadata() -> list[tuple[str, V, object, V | None]]:
    """(key, type, value, array element type) in the order they are written."""
    return [
        ("test.u8", V.UINT8, 200, None),
        ("test.i8", V.INT8, -100, None),
        ("test.u16", V.UINT16, 60000, None),
        ("test.i16", V.INT16, -30000, None),
        ("test.u32", V.UINT32, 4_000_000_000, None),
        ("test.i32", V.INT32, -2_000_000_000, None),
        ("test.f32", V.FLOAT32, 0.1, None),
        ("test.bool", V.BOOL, True, None),
        ("test.bool_false", V.BOOL, False, None),
        ("test.string", V.STRING, "héllo wörld ✓ 🚀", None),
        ("test.empty_string", V.STRING, "", None),
        ("test.u64", V.UINT64, 18_000_000_000_000_000_000, None),
        ("test.i64", V.INT64, -9_000_000_000_000_000_000, None),
        ("test.f64", V.FLOAT64, 3.141592653589793, None),
        ("test.array.u8", V.ARRAY, [0, 1, 255], V.UINT8),
        ("test.array.i8", V.ARRAY, [-128, 0, 127], V.INT8),
        ("test.array.u16", V.ARRAY, [1, 65535], V.UINT16),
        ("test.array.i16", V.ARRAY, [-32768, 32767], V.INT16),
        ("test.array.u32", V.ARRAY, [1, 2, 3, 4_000_000_000], V.UINT32),
        ("test.array.i32", V.ARRAY, [-1, 0, 1], V.INT32),
        ("test.array.f32", V.ARRAY, [0.5, -1.25, 1e-7], V.FLOAT32),
        ("test.array.bool", V.ARRAY, [True, False, True], V.BOOL),
        ("test.array.string", V.ARRAY, ["a", "héllo", "", "<|im_end|>"], V.STRING),
        ("test.array.u64", V.ARRAY, [0, 2**64 - 1], V.UINT64),
        ("test.array.i64", V.ARRAY, [-(2**63), 2**63 - 1], V.INT64),
        ("test.array.f64", V.ARRAY, [1e300, -2.5], V.FLOAT64),
        ("test.array.nested_i32", V.ARRAY, [[1, 2], [3], [4, 5, 6]], None),
        ("test.array.nested_string", V.ARRAY, [["x", "yz"], ["ü"]], None),
        ("test.array.nested_twice", V.ARRAY, [[[1.5], [2.5, 3.5]], [[4.5]]], None),
        ("llama.block_count", V.UINT32, 2, None),
    ]


SCALAR_NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32",
                V.INT32: "i32", V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string",
                V.UINT64: "u64", V.INT64: "i64", V.FLOAT64: "f64"}
# What GGUFWriter infers for the elements of nested lists (see GGUFValueType.get_type).
INFERRED = {str: V.STRING, float: V.FLOAT32, bool: V.BOOL, int: V.INT32}


def expected_value(vtype: V, value, elem: V | None = None) -> dict:
    if vtype == V.ARRAY:
        if elem is None:
            elem = V.ARRAY if isinstance(value[0], list) else INFERRED[type(value[0])]
        if elem == V.ARRAY:
            return {"t": "array", "elem": "array", "v": [expected_value(V.ARRAY, v) for v in value]}
        return {"t": "array", "elem": SCALAR_NAMES[elem],
                "v": [expected_value(elem, v)["v"] for v in value]}
    if vtype == V.FLOAT32:
        value = float(np.float32(value))
    return {"t": SCALAR_NAMES[vtype], "v": value}


def tiny_tensors() -> list[tuple[str, Q, np.ndarray]]:
    """(name, type, data): float arrays for F32/F16, uint8 block bytes for the rest."""
    def rng(name):
        return rng_for("tiny/" + name)

    tensors = [
        ("token_embd.weight", Q.Q8_0,
         quantize(realistic_floats(rng("q8"), 4 * 64).reshape(4, 64), Q.Q8_0)),
        ("blk.0.attn_q.weight", Q.Q4_1,
         quantize(realistic_floats(rng("q41"), 3 * 64).reshape(3, 64), Q.Q4_1)),
        ("blk.0.ffn_up.weight", Q.Q4_K, random_blocks(Q.Q4_K, 2, rng("q4k")).reshape(2, 144)),
        ("blk.0.ffn_down.weight", Q.Q6_K, random_blocks(Q.Q6_K, 1, rng("q6k")).reshape(1, 210)),
        ("blk.0.attn_k.weight", Q.F16,
         (rng("f16").standard_normal((4, 8)) * 0.1).astype(np.float16)),
        ("blk.0.attn_v.weight", Q.BF16,
         (rng("bf16").standard_normal((2, 16)) * 0.1).astype(ml_dtypes.bfloat16)
         .view(np.uint8).reshape(2, 32)),
        ("output_norm.weight", Q.F32, rng("norm").standard_normal(7).astype(np.float32)),
        ("conv.weight", Q.F32, rng("conv").standard_normal((2, 3, 4)).astype(np.float32)),
    ]
    return tensors


def gen_tiny_gguf(out_dir: Path) -> None:
    path = out_dir / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_custom_alignment(64)
    metadata = tiny_metadata()
    for key, vtype, value, elem in metadata:
        writer.add_key_value(key, value, vtype, sub_type=elem)
    for name, qtype, data in tiny_tensors():
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    # Read it back with gguf-py's reader for the layout facts.
    reader = gguf.GGUFReader(str(path))
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    written = ["general.architecture", "general.alignment"] + [m[0] for m in metadata]
    assert keys == written, (keys, written)
    data_offset = min(t.data_offset for t in reader.tensors)
    expected_meta = [["general.architecture", {"t": "string", "v": "llama"}],
                     ["general.alignment", {"t": "u32", "v": 64}]]
    expected_meta += [[k, expected_value(t, v, e)] for k, t, v, e in metadata]
    tensors = []
    for t in reader.tensors:
        qtype = Q(t.tensor_type)
        raw = np.asarray(t.data).view(np.uint8).ravel()
        values = dequantize(raw, qtype) if qtype != Q.F32 else np.asarray(t.data)
        dims = [int(d) for d in t.shape]  # ggml order: dims[0] varies fastest
        tensors.append({"name": t.name, "ggml_type": qtype.name, "dims": dims,
                        "shape": dims[::-1], "offset": int(t.data_offset - data_offset),
                        "n_bytes": int(t.n_bytes), "values": f32_values(values)})
    write_json(out_dir / "tiny.expected.json", {
        "version": 3, "alignment": 64, "file_len": path.stat().st_size,
        "data_offset": int(data_offset), "metadata": expected_meta, "tensors": tensors})


# ---------------------------------------------------------------------------------------------
# safetensors

def gen_safetensors(out_dir: Path) -> None:
    rng = rng_for("safetensors")
    single = {
        "f32": rng.standard_normal((2, 3)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "bf16": rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
        "scalar": np.array(1.5, dtype=np.float32),
        "i64": np.array([1, -2, 3], dtype=np.int64),
    }
    save_file(single, str(out_dir / "tiny.safetensors"), metadata={"format": "pt"})
    shard1 = {"model.a.weight": rng.standard_normal((2, 2)).astype(np.float32),
              "model.b.bias": rng.standard_normal(3).astype(np.float16)}
    shard2 = {"model.c.weight": rng.standard_normal((3, 2)).astype(ml_dtypes.bfloat16)}
    sharded = out_dir / "sharded"
    sharded.mkdir(exist_ok=True)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file(shard1, str(sharded / names[0]), metadata={"format": "pt"})
    save_file(shard2, str(sharded / names[1]), metadata={"format": "pt"})
    weight_map = {k: names[0] for k in shard1} | {k: names[1] for k in shard2}
    total = sum(a.nbytes for a in (shard1 | shard2).values())
    write_json(sharded / "model.safetensors.index.json",
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})

    def describe(tensors):
        return {k: {"dtype": {"float32": "F32", "float16": "F16", "bfloat16": "BF16",
                              "int64": "I64"}[str(a.dtype)],
                    "shape": list(a.shape),
                    "values": f32_values(a.astype(np.float32)) if a.dtype != np.int64 else None}
                for k, a in tensors.items()}
    write_json(out_dir / "safetensors.expected.json",
               {"single": describe(single), "sharded": describe(shard1 | shard2)})


# ---------------------------------------------------------------------------------------------
# Real-model sample

def gen_smollm2_sample(model: Path, out_dir: Path) -> None:
    reader = gguf.GGUFReader(str(model))
    sha256 = hashlib.sha256(model.read_bytes()).hexdigest()
    data_offset = min(t.data_offset for t in reader.tensors)
    by_name = {t.name: t for t in reader.tensors}
    samples = []
    for name, rows in [("token_embd.weight", 2), ("blk.0.attn_q.weight", 2),
                       ("blk.29.ffn_down.weight", 1), ("blk.0.attn_norm.weight", 1)]:
        t = by_name[name]
        qtype = Q(t.tensor_type)
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = int(t.shape[0]) // block_size * type_size
        raw = np.asarray(t.data).view(np.uint8).ravel()[: rows * row_bytes]
        samples.append({"name": name, "ggml_type": qtype.name, "dims": [int(d) for d in t.shape],
                        "offset": int(t.data_offset - data_offset), "rows": rows,
                        "data": raw.tobytes().hex(), "values": f32_values(dequantize(raw, qtype))})
    tokens = reader.fields["tokenizer.ggml.tokens"]
    write_json(out_dir / "smollm2_sample.json", {
        "file": model.name, "sha256": sha256, "file_len": model.stat().st_size,
        "version": int(reader.fields["GGUF.version"].contents()),
        "n_tensors": len(reader.tensors),
        "n_kv": int(reader.fields["GGUF.kv_count"].contents()),
        "data_offset": int(data_offset),
        "block_count": int(reader.fields["llama.block_count"].contents()),
        "embedding_length": int(reader.fields["llama.embedding_length"].contents()),
        "rms_eps": float(reader.fields["llama.attention.layer_norm_rms_epsilon"].contents()),
        "n_tokens": len(tokens.data),
        "first_tokens": [tokens.contents(i) for i in range(5)],
        "samples": samples})


# ---------------------------------------------------------------------------------------------

def generate(out_dir: Path, smollm2: Path | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "quant_blocks.json", gen_quant_blocks())
    gen_tiny_gguf(out_dir)
    gen_safetensors(out_dir)
    if smollm2 is not None and smollm2.exists():
        gen_smollm2_sample(smollm2, out_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--smollm2", type=Path, default=SMOLLM2, help="path of the real model")
    args = parser.parse_args()
    if not args.check:
        generate(FIXTURES, args.smollm2)
        print(f"wrote {FIXTURES}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh, args.smollm2)
        stale = []
        for path in sorted(fresh.rglob("*")):
            if path.is_file():
                rel = path.relative_to(fresh)
                old = FIXTURES / rel
                if not old.exists() or not filecmp.cmp(path, old, shallow=False):
                    stale.append(str(rel))
        if stale:
            print("stale fixtures (run scripts/gen_gguf_fixtures.py):", *stale, sep="\n  ")
            return 1
    print("fixtures are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
