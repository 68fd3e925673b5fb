#!/usr/bin/env python3
"""GGUF copies of the tiny Hugging Face checkpoints, made by llama.cpp's own converter.

    # llama.cpp's convert_hf_to_gguf.py (+ its conversion/ package and gguf-py), e.g. from the
    # llama-cpp-python sdist (vendor/llama.cpp/); tested with llama-cpp-python 0.3.36
    # (sdist sha256 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e,
    # llama.cpp 0c1e570), torch 2.15, transformers 5.23, gguf 0.19:
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36   # the .tar.gz is all we need
    python3 scripts/gen_tiny_gguf_fixtures.py --sdist llama_cpp_python-0.3.36.tar.gz
    # or, with a llama.cpp checkout (or an unpacked sdist's vendor/llama.cpp):
    python3 scripts/gen_tiny_gguf_fixtures.py --llama-cpp path/to/llama.cpp

Nothing here runs luminal. Inputs: crates/luminal_model_tests/tests/fixtures/tiny-llama and
tiny-qwen2 (written by scripts/gen_llama_fixtures.py). Output, next to them:

* tiny-llama.gguf (`--outtype f32`): llama.cpp's Llama conversion. It permutes the q/k rows
  of every layer for llama.cpp's interleaved ("normal") RoPE, and, since config.json has
  llama3 `rope_scaling`, writes the tensor `rope_freqs.weight` ([head_dim/2] f32 divisors of
  the inverse frequencies) instead of any scaling metadata -- the Llama 3.1+/3.2 layout.
* tiny-llama.q8_0.gguf (`--outtype q8_0`): the same with the 2-D weights in Q8_0 blocks
  (norms and rope_freqs stay f32; rows are 64 or 128 wide, multiples of 32).
* tiny-llama.q8_0.reference.json: transformers' logits for reference.json's cases, computed
  with the weights of tiny-llama.q8_0.gguf dequantized by gguf-py (`gguf.dequantize`), q/k
  un-permuted, in the tiny-llama folder's LlamaForCausalLM (so: the exact model the file
  encodes, evaluated by transformers in f32).
* tiny-qwen2.gguf (`--outtype f32`): llama.cpp's Qwen2 conversion (no q/k permutation: NeoX
  RoPE; q/k/v biases; tied embeddings, so no output.weight).

The f32 files are checked against transformers' logits in tiny-llama/reference.json and
tiny-qwen2/reference.json directly (crates/luminal_model_tests/tests/tiny_gguf.rs).

One patch to the converter: it names the BPE pre-tokenizer (`tokenizer.ggml.pre`) by hashing
the token ids of a fixed text and looking the hash up in a table of known Hub tokenizers.
The tiny tokenizers were trained here, so their hash is in no table and the converter stops
with "BPE pre-tokenizer was not recognized". When (and only when) the lookup fails, we name
the pre-tokenizer from the Split regex in tokenizer.json: Llama 3's regex (digits in groups
of <= 3) is llama.cpp's "llama-bpe", Qwen2's (single digits) is "qwen2" -- the names the
converter writes for Llama 3 and Qwen2 checkpoints. Everything else is the converter as
shipped. The script also checks that the f32 GGUF, dequantized and un-permuted, equals the
safetensors bit for bit, and that rope_freqs.weight matches the llama3 formula.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "crates", "luminal_models", "tests", "fixtures")

LLAMA3_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
QWEN2_REGEX = LLAMA3_REGEX.replace("\\p{N}{1,3}", "\\p{N}")
PRE_BY_REGEX = {LLAMA3_REGEX: "llama-bpe", QWEN2_REGEX: "qwen2"}

# Runs convert_hf_to_gguf.main() in a fresh interpreter (so the converter's own gguf-py is the
# one imported), with get_vocab_base_pre falling back to argv[2] when the hash is unknown.
RUNNER = r"""
import sys
llama_cpp, pre = sys.argv[1], sys.argv[2]
sys.path.insert(0, llama_cpp)
import convert_hf_to_gguf
import conversion.base as base

original = base.TextModel.get_vocab_base_pre

def get_vocab_base_pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        base.logger.warning(f"unknown tokenizer hash: using tokenizer.ggml.pre = {pre!r}")
        return pre

base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
convert_hf_to_gguf.main()
"""


def pre_tokenizer_name(model_dir: str) -> str:
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    pre = tok["pre_tokenizer"]
    splits = [p for p in pre.get("pretokenizers", [pre]) if p.get("type") == "Split"]
    if len(splits) != 1 or splits[0]["pattern"].get("Regex") not in PRE_BY_REGEX:
        raise SystemExit(f"{model_dir}: pre-tokenizer is neither Llama 3's nor Qwen2's: {pre}")
    return PRE_BY_REGEX[splits[0]["pattern"]["Regex"]]


def convert(llama_cpp: str, name: str, outtype: str, out: str) -> None:
    model_dir = os.path.join(FIXTURES, name)
    pre = pre_tokenizer_name(model_dir)
    cmd = [sys.executable, "-c", RUNNER, llama_cpp, pre, model_dir, "--outtype", outtype,
           "--outfile", out]
    print(f"converting {name} -> {os.path.relpath(out, ROOT)} ({outtype}, pre {pre!r})")
    subprocess.run(cmd, check=True)
    size = os.path.getsize(out)
    print(f"  {size} bytes")
    assert size < 1 << 20, f"{out} is {size} bytes (keep fixtures under 1 MiB)"


def find_llama_cpp(args, tmp: str) -> str:
    if args.llama_cpp:
        path = args.llama_cpp
    else:
        prefix = None
        with tarfile.open(args.sdist) as tar:
            members = []
            for m in tar.getmembers():
                parts = m.name.split("/")
                if len(parts) >= 4 and parts[1:3] == ["vendor", "llama.cpp"] and (
                    parts[3] in ("convert_hf_to_gguf.py", "conversion", "gguf-py")
                ):
                    prefix = "/".join(parts[:3])
                    members.append(m)
            tar.extractall(tmp, members=members, filter="data")
        if prefix is None:
            raise SystemExit(f"{args.sdist}: no vendor/llama.cpp/convert_hf_to_gguf.py inside")
        path = os.path.join(tmp, prefix)
    if not os.path.isfile(os.path.join(path, "convert_hf_to_gguf.py")):
        raise SystemExit(f"{path}: no convert_hf_to_gguf.py")
    return path


# --------------------------------------------------------------------------------------------
# reading the GGUF back (installed gguf-py) into a transformers model


def unpermute(w, n_head: int):
    """Inverse of the converter's LlamaModel.permute (rows of q/k, per head: the halves
    [0, d/2) and [d/2, d) interleaved back into pairs)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape
    )


def hf_name(gguf_name: str) -> str | None:
    fixed = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
        "rope_freqs.weight": None,
    }
    if gguf_name in fixed:
        return fixed[gguf_name]
    _, layer, short, kind = gguf_name.split(".")
    module = {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }[short]
    return f"model.layers.{layer}.{module}.{kind}"


def gguf_state_dict(path: str, config, permuted: bool):
    """The HF state dict a GGUF file encodes (dequantized to f32), and rope_freqs if any."""
    import gguf
    import numpy as np
    import torch

    reader = gguf.GGUFReader(path)
    state, rope_freqs, types = {}, None, {}
    for t in reader.tensors:
        w = np.asarray(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        types[t.name] = t.tensor_type.name
        name = hf_name(t.name)
        if name is None:
            rope_freqs = w
            continue
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = unpermute(w, config.num_attention_heads)
        if permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = unpermute(w, config.num_key_value_heads)
        state[name] = torch.from_numpy(np.array(w, dtype=np.float32, copy=True))
    return state, rope_freqs, types


def llama3_factors(config):
    """rope_freqs as llama.cpp defines it: base_inv_freq / factor = HF's llama3 inv_freq."""
    import math

    rs = config.rope_parameters if hasattr(config, "rope_parameters") else config.rope_scaling
    dim = config.head_dim
    base = rs.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / (base ** (i / dim))
        wavelen = 2 * math.pi / freq
        low = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
        high = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
        if wavelen < high:
            out.append(1.0)
        elif wavelen > low:
            out.append(rs["factor"])
        else:
            s = (rs["original_max_position_embeddings"] / wavelen - rs["low_freq_factor"]) / (
                rs["high_freq_factor"] - rs["low_freq_factor"]
            )
            out.append(1.0 / ((1 - s) / rs["factor"] + s))
    return out


def check_f32(name: str, path: str, permuted: bool) -> None:
    """The f32 GGUF holds exactly the checkpoint's weights (after un-permuting q/k)."""
    import numpy as np
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model_dir = os.path.join(FIXTURES, name)
    config = AutoConfig.from_pretrained(model_dir)
    state, rope_freqs, _ = gguf_state_dict(path, config, permuted)
    st = load_file(os.path.join(model_dir, "model.safetensors"))
    assert set(state) == set(st), (sorted(set(state) ^ set(st)))
    for k, v in st.items():
        assert torch_equal(state[k], v), f"{name}: {k} differs from the safetensors"
    if name == "tiny-llama":
        want = np.array(llama3_factors(config), dtype=np.float32)
        assert rope_freqs is not None, "no rope_freqs.weight in the llama3-scaled GGUF"
        assert np.allclose(rope_freqs, want, rtol=1e-6), (rope_freqs, want)
        print(f"  rope_freqs.weight = {rope_freqs.tolist()}")
    else:
        assert rope_freqs is None
    print(f"  {name}: GGUF weights == safetensors (q/k un-permuted: {permuted})")


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def q8_reference(path: str, out: str) -> None:
    """transformers on the dequantized Q8_0 weights, for reference.json's cases."""
    import numpy as np
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = os.path.join(FIXTURES, "tiny-llama")
    config = AutoConfig.from_pretrained(model_dir)
    state, _, types = gguf_state_dict(path, config, permuted=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    f32 = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    q_err = max(float((state[k] - f32[k]).abs().max()) for k in state)
    with open(os.path.join(model_dir, "reference.json"), encoding="utf-8") as f:
        ref = json.load(f)
    cases = []
    with torch.no_grad():
        for case in ref["cases"]:
            ids = torch.tensor([case["ids"]])
            logits = model(ids).logits[0].float().numpy()
            cases.append({"ids": case["ids"], "logits": [[r7(x) for x in row] for row in logits]})
            f32_logits = np.array(case["logits"], dtype=np.float32)
            top1 = float((logits.argmax(-1) == f32_logits.argmax(-1)).mean())
            print(
                f"  q8_0 vs f32 transformers logits, {len(case['ids'])} tokens: "
                f"max |d| {float(np.abs(logits - f32_logits).max()):.4f}, top-1 agreement {top1}"
            )
    doc = {
        "model": "tiny-llama.q8_0.gguf",
        "generator": "scripts/gen_tiny_gguf_fixtures.py",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": importlib.metadata.version("gguf"),
        },
        "what": "transformers LlamaForCausalLM (tiny-llama/config.json) with the weights of "
        "tiny-llama.q8_0.gguf dequantized by gguf-py and q/k un-permuted",
        "tensor_types": types,
        "max_abs_weight_change_from_f32": q_err,
        "logits_digits": 7,
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(out, ROOT)}")


def r7(x) -> float:
    return float(f"{float(x):.7g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--llama-cpp", help="directory holding convert_hf_to_gguf.py")
    src.add_argument("--sdist", help="llama-cpp-python sdist (.tar.gz) vendoring llama.cpp")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tiny-gguf-")
    try:
        llama_cpp = find_llama_cpp(args, tmp)
        jobs = [
            ("tiny-llama", "f32", "tiny-llama.gguf", True),
            ("tiny-llama", "q8_0", "tiny-llama.q8_0.gguf", True),
            ("tiny-qwen2", "f32", "tiny-qwen2.gguf", False),
        ]
        for name, outtype, file, permuted in jobs:
            out = os.path.join(FIXTURES, file)
            convert(llama_cpp, name, outtype, out)
            if outtype == "f32":
                check_f32(name, out, permuted)
        q8_reference(
            os.path.join(FIXTURES, "tiny-llama.q8_0.gguf"),
            os.path.join(FIXTURES, "tiny-llama.q8_0.reference.json"),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
