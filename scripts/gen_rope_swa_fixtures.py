#!/usr/bin/env python3
"""Tiny Llama-family models with RoPE scaling (linear, YaRN) and a sliding attention window,
in both Hugging Face and GGUF form, with reference logits from a float64 numpy forward pass.

    pip install numpy gguf        # tested with numpy 2.4, gguf 0.19
    python3 scripts/gen_rope_swa_fixtures.py

Nothing here runs luminal, and nothing needs torch or transformers: the reference is a numpy
transcription of the published definitions, written for this script:

* Llama block as transformers' LlamaForCausalLM / MistralForCausalLM (RMSNorm, rotate-half
  RoPE on the Hugging Face q/k layout, grouped-query attention, SwiGLU MLP, untied lm_head).
* RoPE scaling as transformers' `modeling_rope_utils`:
  - linear: inverse frequencies theta^(-2i/d) divided by `factor`;
  - yarn (`_compute_yarn_parameters`): dim(b) = d ln(L / (2 pi b)) / (2 ln theta) with L the
    original context; low = max(floor(dim(beta_fast)), 0), high = min(ceil(dim(beta_slow)),
    d - 1); ramp_i = clip((i - low) / (high - low), 0, 1) over pair index i; inverse
    frequency inv_i (1 - ramp_i) + inv_i / factor ramp_i; cos and sin multiplied by the
    attention factor, default 0.1 ln(factor) + 1.
  GGUF YaRN as llama.cpp reads `{arch}.rope.scaling.*`: type, factor, original_context_length,
  yarn_beta_fast / yarn_beta_slow, and attn_factor multiplying the default attention factor
  (llama.cpp's `rope_yarn` applies mscale = attn_factor (1 + 0.1 ln factor)).
* Sliding window as transformers' `sliding_window_overlay` on the causal mask (and
  llama.cpp's LLAMA_SWA_TYPE_STANDARD): query position i sees key j iff i - window < j <= i.

GGUF files store q/k rows permuted for llama.cpp's interleaved RoPE (the permutation of
llama.cpp's `convert_hf_to_gguf.py`, `LlamaModel.permute`), so the GGUF path is checked
against the same reference as the Hugging Face layout.

Every model: vocab 64, hidden 32, 2 layers, 2 query heads, 1 kv head (GQA), head_dim 16
(8 frequencies), intermediate 32, rms_norm_eps 1e-5, untied lm_head, f32 weights drawn from a
seeded numpy generator. Output, under crates/luminal_model_tests/tests/fixtures/scaling/:

* tiny-yarn/ (HF, llama, rope_scaling yarn: factor 4, original_max_position_embeddings 2048,
  max_position_embeddings 8192, defaults beta 32/1 and attention factor 0.1 ln 4 + 1;
  the ramp runs over pairs 2..6) + tiny-yarn.gguf (same weights and scaling, GGUF keys).
* tiny-yarn-custom.gguf (yarn factor 4, original context 2048, yarn_beta_fast 16,
  yarn_beta_slow 2 -> ramp over pairs 2..5, attn_factor 0.9).
* tiny-linear.gguf (rope.scaling.type linear, factor 2).
* tiny-mistral/ (HF, mistral, sliding_window 4) + tiny-mistral.gguf (arch mistral,
  mistral.attention.sliding_window 4, rope theta 1e6).
* reference.json: per model, the token ids (12, longer than the window), the teacher-forced
  logits, the logits of a separate numpy decode loop with an explicit KV cache (a prefill of 5,
  then one token at a time), and the max |logit change| under mutated definitions (window
  off by one or absent, scaling absent, attention factor absent, untruncated YaRN range,
  ...), which the tests use to show their tolerance would catch each mistake.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import struct

import gguf
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "luminal_model_tests", "tests", "fixtures", "scaling")

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 32, 2, 2, 1, 16, 32
EPS = 1e-5
N_TOKENS, PREFILL = 12, 5

# Byte-level symbols of A-Z a-z 0-9, space (U+0120) and one merge "t h" -> "th".
TOKENS = (
    [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + [chr(c) for c in range(ord("0"), ord("9") + 1)]
    + ["\u0120", "th"]
)
MERGES = ["t h"]
assert len(TOKENS) == VOCAB


# --------------------------------------------------------------------------------------------
# the numpy reference


def base_inv_freq(d, theta):
    return 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)


def yarn_range(d, theta, original, beta_fast, beta_slow, truncate=True):
    def dim_of(turns):
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)


def rope_tables(cfg):
    """(inverse frequencies [d/2], cos/sin multiplier) of a config's rope."""
    d, theta, s = HEAD_DIM, cfg["theta"], cfg.get("scaling")
    inv = base_inv_freq(d, theta)
    if s is None:
        return inv, 1.0
    if s["type"] == "linear":
        return inv / s["factor"], 1.0
    assert s["type"] == "yarn"
    low, high = yarn_range(d, theta, s["original"], s["beta_fast"], s["beta_slow"],
                           s.get("truncate", True))
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv = inv * (1 - ramp) + inv / s["factor"] * ramp
    return inv, s["attention_factor"]


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rotate(x, positions, inv, mscale):
    """Rotate-half RoPE of x [heads, n, d] at absolute positions [n]."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = mscale * np.cos(ang), mscale * np.sin(ang)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def project(w, h, pre, positions, inv, mscale):
    """q [HEADS, n, d], k, v [KV_HEADS, n, d] of normed hidden states h [n, HIDDEN]."""
    n = h.shape[0]
    q = (h @ w[pre + "self_attn.q_proj.weight"].T).reshape(n, HEADS, HEAD_DIM).transpose(1, 0, 2)
    k = (h @ w[pre + "self_attn.k_proj.weight"].T).reshape(n, KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
    v = (h @ w[pre + "self_attn.v_proj.weight"].T).reshape(n, KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
    return rotate(q, positions, inv, mscale), rotate(k, positions, inv, mscale), v


def mlp(w, pre, x):
    h = rms(x, w[pre + "post_attention_layernorm.weight"])
    gate = h @ w[pre + "mlp.gate_proj.weight"].T
    up = h @ w[pre + "mlp.up_proj.weight"].T
    return x + (gate / (1 + np.exp(-gate)) * up) @ w[pre + "mlp.down_proj.weight"].T


def logits_of(w, x):
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def forward_full(w, cfg, ids):
    """Teacher-forced logits [n, vocab], all positions at once with a [n, n] mask."""
    inv, mscale = rope_tables(cfg)
    window = cfg.get("window")
    n = len(ids)
    pos = np.arange(n)
    visible = pos[None, :] <= pos[:, None]
    if window is not None:
        visible &= pos[None, :] > pos[:, None] - window
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}."
        q, k, v = project(w, rms(x, w[pre + "input_layernorm.weight"]), pre, pos, inv, mscale)
        k, v = np.repeat(k, HEADS // KV_HEADS, 0), np.repeat(v, HEADS // KV_HEADS, 0)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(HEAD_DIM)
        scores = np.where(visible, scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        att = (p / p.sum(-1, keepdims=True)) @ v  # [heads, n, d]
        x = x + att.transpose(1, 0, 2).reshape(n, HEADS * HEAD_DIM) @ w[pre + "self_attn.o_proj.weight"].T
        x = mlp(w, pre, x)
    return logits_of(w, x)


def forward_decode(w, cfg, ids, prefill):
    """The same logits by a separate path: a KV cache of rotated keys and values grown chunk
    by chunk (a prefill, then one token at a time), each query scored in a loop against the
    cached keys it may see by absolute position."""
    inv, mscale = rope_tables(cfg)
    window = cfg.get("window")
    cache = [([], []) for _ in range(LAYERS)]
    out = []
    chunks = [ids[:prefill]] + [[t] for t in ids[prefill:]]
    start = 0
    for chunk in chunks:
        positions = list(range(start, start + len(chunk)))
        x = w["model.embed_tokens.weight"][chunk]
        for layer in range(LAYERS):
            pre = f"model.layers.{layer}."
            q, k, v = project(w, rms(x, w[pre + "input_layernorm.weight"]), pre, positions, inv, mscale)
            keys, values = cache[layer]
            for j in range(len(chunk)):
                keys.append(k[:, j])
                values.append(v[:, j])
            att = np.zeros((len(chunk), HEADS * HEAD_DIM))
            for r, i in enumerate(positions):
                seen = [j for j in range(i + 1) if window is None or j > i - window]
                for head in range(HEADS):
                    kvh = head // (HEADS // KV_HEADS)
                    s = np.array([q[head, r] @ keys[j][kvh] for j in seen]) / math.sqrt(HEAD_DIM)
                    p = np.exp(s - s.max())
                    p /= p.sum()
                    att[r, head * HEAD_DIM:(head + 1) * HEAD_DIM] = sum(
                        pj * values[j][kvh] for pj, j in zip(p, seen)
                    )
            x = x + att @ w[pre + "self_attn.o_proj.weight"].T
            x = mlp(w, pre, x)
        out.append(logits_of(w, x))
        start += len(chunk)
    return np.concatenate(out, 0)


# --------------------------------------------------------------------------------------------
# weights and files


def random_weights(seed):
    rng = np.random.default_rng(seed)
    w = {}

    def add(name, shape, kind):
        n = rng.standard_normal(shape)
        if kind == "norm":
            a = 1.0 + 0.2 * n
        elif kind == "embed":
            a = 0.5 * n
        elif kind == "head":
            a = 2.0 * n / math.sqrt(shape[1])
        else:
            a = n / math.sqrt(shape[1])
        w[name] = a.astype(np.float32).astype(np.float64)  # the f32 values the files hold

    add("model.embed_tokens.weight", (VOCAB, HIDDEN), "embed")
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}."
        add(pre + "input_layernorm.weight", (HIDDEN,), "norm")
        add(pre + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN), "lin")
        add(pre + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), "lin")
        add(pre + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), "lin")
        add(pre + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM), "lin")
        add(pre + "post_attention_layernorm.weight", (HIDDEN,), "norm")
        add(pre + "mlp.gate_proj.weight", (FFN, HIDDEN), "lin")
        add(pre + "mlp.up_proj.weight", (FFN, HIDDEN), "lin")
        add(pre + "mlp.down_proj.weight", (HIDDEN, FFN), "lin")
    add("model.norm.weight", (HIDDEN,), "norm")
    add("lm_head.weight", (VOCAB, HIDDEN), "head")
    return w


def write_safetensors(path, w):
    """The safetensors format: u64 header length, JSON header, raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name in sorted(w):
        data = np.ascontiguousarray(w[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(w[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def tokenizer_json():
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(TOKENS)}, "merges": MERGES},
    }


def write_hf(name, w, config):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
        f.write("\n")
    write_safetensors(os.path.join(d, "model.safetensors"), w)


def hf_config(model_type, theta, max_pos, extra):
    cfg = {
        "architectures": ["MistralForCausalLM" if model_type == "mistral" else "LlamaForCausalLM"],
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": EPS,
        "rope_theta": theta,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    cfg.update(extra)
    return cfg


def permute(rows, n_head):
    """llama.cpp's converter permutation: per head, rows [0, d/2) and [d/2, d) interleaved so
    adjacent rows pair up (the inverse of gen_tiny_gguf_fixtures.unpermute)."""
    return (rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(file, arch, w, theta, ctx, extra_kv):
    writer = gguf.GGUFWriter(os.path.join(OUT, file), arch)
    writer.add_name(file)
    writer.add_block_count(LAYERS)
    writer.add_context_length(ctx)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for add in extra_kv:
        add(writer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    writer.add_token_merges(MERGES)
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
    writer.add_tensor("token_embd.weight", f32(w["model.embed_tokens.weight"]))
    for layer in range(LAYERS):
        pre = f"model.layers.{layer}."
        for hf, short in GGUF_NAMES.items():
            a = w[pre + hf]
            if hf == "self_attn.q_proj.weight":
                a = permute(a, HEADS)
            if hf == "self_attn.k_proj.weight":
                a = permute(a, KV_HEADS)
            writer.add_tensor(f"blk.{layer}.{short}", f32(a))
    writer.add_tensor("output_norm.weight", f32(w["model.norm.weight"]))
    writer.add_tensor("output.weight", f32(w["lm_head.weight"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --------------------------------------------------------------------------------------------


def r7(x):
    return float(f"{float(x):.7g}")


def yarn(factor, original, beta_fast=32.0, beta_slow=1.0, attn=None, truncate=True):
    return {"type": "yarn", "factor": factor, "original": original, "beta_fast": beta_fast,
            "beta_slow": beta_slow, "truncate": truncate,
            "attention_factor": (0.1 * math.log(factor) + 1.0) * (1.0 if attn is None else attn)}


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261201)
    ids = [int(t) for t in rng.integers(0, VOCAB, N_TOKENS)]

    yarn_default = yarn(4.0, 2048)
    yarn_custom = yarn(4.0, 2048, beta_fast=16.0, beta_slow=2.0, attn=0.9)
    models = {
        # name: (seed, reference config, mutated configs)
        "tiny-yarn": (1, {"theta": 10000.0, "scaling": yarn_default}, {
            "no_scaling": {"theta": 10000.0},
            "no_attention_factor": {"theta": 10000.0, "scaling": dict(yarn_default, attention_factor=1.0)},
            "untruncated_range": {"theta": 10000.0, "scaling": dict(yarn_default, truncate=False)},
            "linear_instead": {"theta": 10000.0, "scaling": {"type": "linear", "factor": 4.0}},
        }),
        "tiny-yarn-custom": (2, {"theta": 10000.0, "scaling": yarn_custom}, {
            "default_betas": {"theta": 10000.0, "scaling": dict(yarn_custom, beta_fast=32.0, beta_slow=1.0)},
            "attn_factor_ignored": {"theta": 10000.0, "scaling": dict(yarn_custom, attention_factor=0.1 * math.log(4.0) + 1.0)},
        }),
        "tiny-linear": (3, {"theta": 10000.0, "scaling": {"type": "linear", "factor": 2.0}}, {
            "no_scaling": {"theta": 10000.0},
        }),
        "tiny-mistral": (4, {"theta": 1e6, "window": 4}, {
            "no_window": {"theta": 1e6},
            "window_plus_one": {"theta": 1e6, "window": 5},
            "window_minus_one": {"theta": 1e6, "window": 3},
        }),
    }
    print(f"yarn range (default): {yarn_range(HEAD_DIM, 10000.0, 2048, 32, 1)}, "
          f"(custom): {yarn_range(HEAD_DIM, 10000.0, 2048, 16, 2)}")
    reference = {
        "generator": "scripts/gen_rope_swa_fixtures.py",
        "versions": {"numpy": np.__version__, "gguf": importlib.metadata.version("gguf")},
        "prefill": PREFILL,
        "models": {},
    }
    weights = {}
    for name, (seed, cfg, mutants) in models.items():
        w = random_weights(seed)
        weights[name] = w
        full = forward_full(w, cfg, ids)
        step = forward_decode(w, cfg, ids, PREFILL)
        gap = float(np.abs(full - step).max())
        assert gap < 1e-10, (name, gap)
        sens = {k: float(np.abs(forward_full(w, m, ids) - full).max()) for k, m in mutants.items()}
        print(f"{name}: logit std {full.std():.3f}, full vs decode {gap:.1e}, mutations {sens}")
        reference["models"][name] = {
            "config": cfg,
            "ids": ids,
            "logits": [[r7(x) for x in row] for row in full],
            "decode_logits": [[r7(x) for x in row] for row in step],
            "mutation_max_abs_diff": sens,
        }

    write_hf("tiny-yarn", weights["tiny-yarn"], hf_config("llama", 10000.0, 8192, {
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    }))
    write_gguf("tiny-yarn.gguf", "llama", weights["tiny-yarn"], 10000.0, 8192, [
        lambda wr: wr.add_rope_scaling_type(gguf.RopeScalingType.YARN),
        lambda wr: wr.add_rope_scaling_factor(4.0),
        lambda wr: wr.add_rope_scaling_orig_ctx_len(2048),
    ])
    write_gguf("tiny-yarn-custom.gguf", "llama", weights["tiny-yarn-custom"], 10000.0, 8192, [
        lambda wr: wr.add_rope_scaling_type(gguf.RopeScalingType.YARN),
        lambda wr: wr.add_rope_scaling_factor(4.0),
        lambda wr: wr.add_rope_scaling_orig_ctx_len(2048),
        lambda wr: wr.add_rope_scaling_yarn_beta_fast(16.0),
        lambda wr: wr.add_rope_scaling_yarn_beta_slow(2.0),
        lambda wr: wr.add_rope_scaling_attn_factors(0.9),
    ])
    write_gguf("tiny-linear.gguf", "llama", weights["tiny-linear"], 10000.0, 512, [
        lambda wr: wr.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
        lambda wr: wr.add_rope_scaling_factor(2.0),
    ])
    write_hf("tiny-mistral", weights["tiny-mistral"], hf_config("mistral", 1e6, 512, {
        "sliding_window": 4,
    }))
    write_gguf("tiny-mistral.gguf", "mistral", weights["tiny-mistral"], 1e6, 512, [
        lambda wr: wr.add_sliding_window(4),
    ])
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(reference, f, separators=(",", ":"))
        f.write("\n")
    for root, _, files in os.walk(OUT):
        for file in sorted(files):
            p = os.path.join(root, file)
            print(f"  {os.path.relpath(p, ROOT)}: {os.path.getsize(p)} bytes")


if __name__ == "__main__":
    main()
