#!/usr/bin/env python3
"""Reference data for crates/luminal_models (the Llama family), computed with transformers.

    pip install torch transformers accelerate tokenizers gguf safetensors sentencepiece
    # tested with torch 2.15 (CPU), transformers 5.23, tokenizers 0.23, gguf 0.19
    python3 scripts/gen_llama_fixtures.py              # everything
    python3 scripts/gen_llama_fixtures.py --tiny       # only the tiny random checkpoints
    python3 scripts/gen_llama_fixtures.py --smollm2    # only the SmolLM2 reference

Nothing here runs luminal. Output, under crates/luminal_model_tests/tests/fixtures/:

* tiny-llama/ and tiny-qwen2/: tiny random Hugging Face checkpoints in f32 (config.json,
  generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json) plus
  reference.json with transformers' logits for a few token-id sequences, the tokenizer's
  text -> ids for a few strings, the rendered chat template, and a greedy generation.
  - tiny-llama: LlamaForCausalLM, hidden 64, 2 layers, 4 heads, 2 kv heads (GQA), head_dim 16,
    intermediate 128, rms_norm_eps 1e-5, untied lm_head, Llama-3 rope scaling
    (rope_theta 1e4, factor 4, low/high freq factor 1/4, original_max_position_embeddings 64,
    so the 8 frequencies cover all three branches: unchanged, smoothed, divided by factor).
    Its config.json is written in the transformers-4 layout used by most checkpoints on the
    Hub (top-level "rope_theta" plus "rope_scaling"). Its tokenizer prepends BOS
    (<|endoftext|>, id 0), like Llama 3.
  - tiny-qwen2: Qwen2ForCausalLM (q/k/v biases), tied embeddings (no lm_head.weight in the
    safetensors), rope_theta 1e6, rms_norm_eps 1e-6. Its config.json is in the transformers-5
    layout ("rope_parameters": {"rope_type": "default", "rope_theta": ...}). Its tokenizer adds
    no BOS, like Qwen2.
  Each has a byte-level BPE tokenizer trained here with the `tokenizers` library on the
  paragraphs in CORPUS (special tokens <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2), laid
  out like the real family's tokenizer.json: tiny-llama uses Llama 3's Split regex (digits in
  groups of <= 3) + ByteLevel(use_regex=False) and a BOS TemplateProcessing; tiny-qwen2 uses an
  NFC normalizer, Qwen2's Split regex (single digits) + ByteLevel(use_regex=False), and
  tokenizer_class Qwen2Tokenizer (transformers 5 picks Qwen2Tokenizer for a qwen2 folder
  anyway, and it imposes exactly this pre-tokenizer). Both carry the ChatML chat template.
  All weights are drawn from one seeded torch generator (not HF's init, so that norms and
  biases are non-trivial and logits have a spread of a few units).
* smollm2_reference.json: only when models/SmolLM2-135M-Instruct.Q4_1.gguf is present (see
  scripts/fetch-models.sh); otherwise the checked-in copy is kept. transformers loads the GGUF
  and dequantizes every tensor to f32 with gguf-py (`gguf.dequantize`), undoing llama.cpp's
  q/k row permutation. For a few prompts: ids, and per position the argmax, the top-32 ids
  with their logits, the full-vocab logsumexp and the top1-top2 margin; a 16-token greedy
  generation; and the perplexity of ppl.txt (protocol in `perplexity` below).

Every run prints noise floors: f32 vs f64 forward, single vs batched forward, in-memory vs
reloaded-from-disk model, cached generate() vs uncached argmax loop.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import tempfile

import numpy as np
import torch
import tokenizers
import transformers
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "crates", "luminal_models", "tests", "fixtures")
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TINY_VOCAB = 448

CORPUS = [
    "The quick brown fox jumps over the lazy dog. A small model can still learn the shape of "
    "a sentence, even when it has only a few hundred tokens in its vocabulary.",
    "In the morning the market opened early. Farmers brought apples, pears, bread and cheese, "
    "and the children ran between the stalls while their parents talked about the weather.",
    "Numbers matter too: 1, 2, 3, 4, 5, 10, 20, 100, 2024 and 3.14159 appear in many texts. "
    "So do dates like 12 March and times like 09:30.",
    "In 2023 the club had 12 members, in 2024 it had 45, and in 2025 it had 123. Of those 123, "
    "12 had joined in 2012 and 45 in 2045; the 12 oldest paid 345 a year, the other 45 paid 12.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i * 2))\n",
    "She opened the window and listened. The river was loud after the rain, and somewhere "
    "beyond the hills a train was calling. It was the kind of evening that made everyone "
    "want to tell a story.",
    "Questions and answers: What is the capital of France? Paris is the capital of France. "
    "How many legs does a spider have? A spider has eight legs.",
    "The engineers tested every part of the machine twice. When the results agreed, they "
    "wrote them down; when they did not, they started again from the beginning.",
]

TOKENIZER_STRINGS = [
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 12345 and  two  spaces,\ttabs\nand new lines!",
    "Unicode: café, naïve, 東京, emoji 🙂.",
    "<|im_start|>user\nHi there<|im_end|>\n",
]
CHAT_MESSAGES = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
]


# --------------------------------------------------------------------------------------------
# helpers


def r7(x) -> float:
    """A float rounded to 7 significant digits (f32 logits need no more for 1e-5 tolerances)."""
    return float(f"{float(x):.7g}")


def rows(t: torch.Tensor) -> list:
    return [[r7(v) for v in row] for row in t.tolist()]


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=None, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")


def versions() -> dict:
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# tiny tokenizer


# The pre-tokenizer regexes of Llama 3 (digits in groups of up to 3) and Qwen2 (single digits).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(kind: str) -> Tokenizer:
    """Byte-level BPE laid out like the real model's tokenizer.json.

    llama: Llama-3 Split regex + ByteLevel(use_regex=False), BOS added by TemplateProcessing.
    qwen2: NFC normalizer, Qwen2 Split regex + ByteLevel(use_regex=False), no BOS.
    """
    add_bos = kind == "llama"
    tok = Tokenizer(models.BPE())
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    split = LLAMA3_SPLIT if kind == "llama" else QWEN2_SPLIT
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A",
            pair="<|endoftext|> $A <|endoftext|> $B",
            special_tokens=[("<|endoftext|>", 0)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def tokenizer_config(kind: str) -> dict:
    add_bos = kind == "llama"
    added = {
        str(i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, s in enumerate(SPECIALS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast" if kind == "llama" else "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": "<|endoftext|>" if add_bos else None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "chat_template": CHATML,
    }


# --------------------------------------------------------------------------------------------
# tiny models


def init_weights(model: torch.nn.Module, seed: int, tied: bool) -> None:
    """Seeded weights with a useful spread. With tied embeddings a large embedding makes the
    model echo its last input token (h . e_t ~ |e_t|^2), so tied models get small embeddings
    and a larger final norm (logits keep a std of ~3)."""
    g = torch.Generator().manual_seed(seed)
    embed_std, final_norm = (0.1, 4.0) if tied else (0.5, 1.0)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            n = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name == "model.norm.weight":
                p.copy_(final_norm * (1.0 + 0.2 * n))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * n)
            elif name.endswith(".bias"):
                p.copy_(0.5 * n)
            elif "embed_tokens" in name:
                p.copy_(embed_std * n)
            elif "lm_head" in name:
                p.copy_(2.0 * n / math.sqrt(p.shape[1]))
            else:
                p.copy_(n / math.sqrt(p.shape[1]))


def tiny_config(kind: str, vocab: int):
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        hidden_act="silu",
        attention_dropout=0.0,
    )
    if kind == "llama":
        return LlamaConfig(
            **common,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    return Qwen2Config(
        **common,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False,
    )


def to_legacy_rope(config_path: str) -> None:
    """Rewrite transformers-5 "rope_parameters" as transformers-4 "rope_theta"/"rope_scaling"."""
    with open(config_path) as f:
        cfg = json.load(f)
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    if rp.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = rp
    with open(config_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


@torch.no_grad()
def logits_of(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long)
    return model(input_ids=x, use_cache=False).logits[0].float()


@torch.no_grad()
def greedy_uncached(model, ids: list[int], n: int) -> tuple[list[int], float]:
    """Greedy decoding by re-running the whole sequence each step; returns ids and min margin."""
    seq = list(ids)
    min_margin = float("inf")
    for _ in range(n):
        lg = logits_of(model, seq)[-1]
        top2 = torch.topk(lg, 2).values
        min_margin = min(min_margin, float(top2[0] - top2[1]))
        seq.append(int(torch.argmax(lg)))
    return seq[len(ids):], min_margin


@torch.no_grad()
def greedy_generate(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids], dtype=torch.long)
    out = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=n,
        min_new_tokens=0,
        do_sample=False,
        use_cache=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids):].tolist()


def build_tiny(kind: str, seed: int) -> None:
    name = f"tiny-{kind}"
    out_dir = os.path.join(FIXTURES, name)
    torch.manual_seed(seed)

    tok = train_tokenizer(kind)
    vocab = tok.get_vocab_size()
    cfg = tiny_config(kind, vocab)
    cfg._attn_implementation = "eager"
    cls = LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM
    model = cls(cfg).float().eval()
    init_weights(model, seed, cfg.tie_word_embeddings)
    if cfg.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    tmp = tempfile.mkdtemp(prefix=name + "-")
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save(os.path.join(tmp, "tokenizer.json"))
        write_json_pretty(os.path.join(tmp, "tokenizer_config.json"), tokenizer_config(kind))
        if kind == "llama":
            to_legacy_rope(os.path.join(tmp, "config.json"))
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        shutil.copytree(tmp, out_dir)
        os.chmod(out_dir, 0o755)
        for f in os.listdir(out_dir):
            os.chmod(os.path.join(out_dir, f), 0o644)
    finally:
        shutil.rmtree(tmp)

    # Everything below uses the checkpoint as read back from disk.
    loaded_cfg = AutoConfig.from_pretrained(out_dir)
    assert loaded_cfg.rope_parameters == cfg.rope_parameters, (
        loaded_cfg.rope_parameters,
        cfg.rope_parameters,
    )
    m = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    hf_tok = AutoTokenizer.from_pretrained(out_dir)
    assert len(hf_tok) == vocab, (len(hf_tok), vocab)

    rng = np.random.default_rng(seed)
    case_ids = [
        [vocab - 1],
        [int(v) for v in rng.integers(0, vocab, 7)],
        [0] + [int(v) for v in rng.integers(3, vocab, 17)] + [vocab - 2],
    ]
    cases = []
    noise = {}
    reload_diff = batch_diff = f64_diff = 0.0
    m64 = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float64, attn_implementation="eager"
    ).eval()
    for ids in case_ids:
        lg = logits_of(m, ids)
        reload_diff = max(reload_diff, float((logits_of(model, ids) - lg).abs().max()))
        f64_diff = max(f64_diff, float((logits_of(m64, ids).float() - lg).abs().max()))
        cases.append({"ids": ids, "logits": rows(lg)})
    # Batched, right-padded forward: valid positions must not see the padding (causal mask).
    L = max(len(c) for c in case_ids)
    x = torch.zeros(len(case_ids), L, dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, ids in enumerate(case_ids):
        x[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    with torch.no_grad():
        blg = m(input_ids=x, attention_mask=mask, use_cache=False).logits.float()
    for i, ids in enumerate(case_ids):
        ref = torch.tensor(cases[i]["logits"])
        batch_diff = max(batch_diff, float((blg[i, : len(ids)] - ref).abs().max()))
    noise = {
        "reload_vs_in_memory_max_abs": reload_diff,
        "batched_vs_single_max_abs": batch_diff,
        "f64_vs_f32_max_abs": f64_diff,
    }

    tok_cases = []
    for s in TOKENIZER_STRINGS:
        ids = hf_tok(s).input_ids
        raw = tok.encode(s).ids
        assert ids == raw, (s, ids, raw)
        tok_cases.append(
            {
                "text": s,
                "add_special_tokens": True,
                "ids": ids,
                "tokens": hf_tok.convert_ids_to_tokens(ids),
                "decoded": hf_tok.decode(ids, skip_special_tokens=False),
            }
        )
    chats = []
    for msgs in CHAT_MESSAGES:
        text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        chats.append({"messages": msgs, "add_generation_prompt": True, "text": text})

    prompt_text = chats[0]["text"]
    prompt_ids = hf_tok(prompt_text).input_ids
    new_ids = greedy_generate(m, prompt_ids, 8)
    check_ids, min_margin = greedy_uncached(m, prompt_ids, 8)
    assert new_ids == check_ids, (new_ids, check_ids)
    noise["generate_cached_equals_uncached"] = True

    ref = {
        "model": name,
        "generator": "scripts/gen_llama_fixtures.py",
        "versions": versions(),
        "vocab_size": vocab,
        "logits_digits": 7,
        "noise": noise,
        "cases": cases,
        "tokenizer": tok_cases,
        "chat_template": chats,
        "generation": {
            "prompt_text": prompt_text,
            "add_special_tokens": True,
            "prompt_ids": prompt_ids,
            "max_new_tokens": 8,
            "do_sample": False,
            "new_ids": new_ids,
            "new_text": hf_tok.decode(new_ids, skip_special_tokens=False),
            "min_top2_margin": r7(min_margin),
        },
    }
    write_json(os.path.join(out_dir, "reference.json"), ref)

    total = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{name}: vocab {vocab}, {len(os.listdir(out_dir))} files, {total} bytes")
    print(f"  noise floor: {noise}")
    print(f"  generation: {prompt_ids} -> {new_ids} (min top1-top2 margin {min_margin:.4f})")
    assert total < 1_000_000, total


def write_json_pretty(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# --------------------------------------------------------------------------------------------
# SmolLM2


SMOL_PROMPTS = [
    ("chat", None),  # the chat-templated question, filled in below
    ("prose", "The old lighthouse stood at the end of a long spit of sand, where the river met "
              "the sea, and every night its keeper climbed the stairs to light the lamp."),
    ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
             "fibonacci(n - 2)\n"),
    ("numbers", "2, 4, 6, 8, 10, 12, 14, 16,"),
]
TOP_K = 32
PPL_CTX = 128


@torch.no_grad()
def perplexity(model, ids: list[int], ctx: int) -> dict:
    nll_sum = 0.0
    n_scored = 0
    n_windows = 0
    for start in range(0, len(ids), ctx):
        w = ids[start : start + ctx]
        if len(w) < 2:
            continue
        n_windows += 1
        lg = model(input_ids=torch.tensor([w]), use_cache=False).logits[0].double()
        logp = torch.log_softmax(lg[:-1], dim=-1)
        tgt = torch.tensor(w[1:])
        nll_sum += float(-logp[torch.arange(len(w) - 1), tgt].sum())
        n_scored += len(w) - 1
    mean = nll_sum / n_scored
    return {"n_windows": n_windows, "n_scored": n_scored, "mean_nll": mean, "ppl": math.exp(mean)}


def build_smollm2(models_dir: str) -> None:
    path = os.path.join(models_dir, SMOL_FILE)
    if not os.path.exists(path):
        print(f"smollm2: {path} absent (run scripts/fetch-models.sh); keeping checked-in copy")
        return
    digest = sha256(path)
    assert digest == SMOL_SHA256, f"unexpected sha256 {digest} for {path}"
    tok = AutoTokenizer.from_pretrained(models_dir, gguf_file=SMOL_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        models_dir, gguf_file=SMOL_FILE, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    vocab = model.config.vocab_size

    chat_msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompts = []
    for name, text in SMOL_PROMPTS:
        if text is None:
            text = tok.apply_chat_template(chat_msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text).input_ids
        assert 10 <= len(ids) <= 40, (name, len(ids))
        prompts.append((name, text, ids))

    out_prompts = []
    all_logits = []
    for name, text, ids in prompts:
        lg = logits_of(model, ids)
        all_logits.append(lg)
        top = torch.topk(lg, TOP_K, dim=-1)
        lse = torch.logsumexp(lg.double(), dim=-1)
        out_prompts.append(
            {
                "name": name,
                "text": text,
                "ids": ids,
                "argmax": torch.argmax(lg, dim=-1).tolist(),
                "top1_margin": [r7(v) for v in (top.values[:, 0] - top.values[:, 1]).tolist()],
                "top_ids": top.indices.tolist(),
                "top_logits": rows(top.values),
                "logsumexp": [r7(v) for v in lse.tolist()],
            }
        )
        print(f"smollm2 {name}: {len(ids)} tokens, argmax {out_prompts[-1]['argmax']}")

    gen_prompt = prompts[0][2]
    new_ids = greedy_generate(model, gen_prompt, 16)
    check_ids, min_margin = greedy_uncached(model, gen_prompt, 16)
    assert new_ids == check_ids, (new_ids, check_ids)
    eos = tok.eos_token_id
    first_eos = new_ids.index(eos) if eos in new_ids else None
    print(f"smollm2 generation: {tok.decode(new_ids)!r} (min margin {min_margin:.4f})")

    with open(os.path.join(FIXTURES, "ppl.txt"), encoding="utf-8") as f:
        ppl_text = f.read()
    ppl_ids = tok(ppl_text, add_special_tokens=False).input_ids
    ppl = perplexity(model, ppl_ids, PPL_CTX)
    print(f"smollm2 perplexity (ctx {PPL_CTX}): {ppl}, {len(ppl_ids)} tokens")

    # Noise floor: the same dequantized weights in f64, and a batched forward in f32.
    ppl_bs_diff = 0.0
    L = max(len(p[2]) for p in prompts)
    x = torch.full((len(prompts), L), int(tok.pad_token_id or 0), dtype=torch.long)
    mask = torch.zeros_like(x)
    for i, (_, _, ids) in enumerate(prompts):
        x[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    with torch.no_grad():
        blg = model(input_ids=x, attention_mask=mask, use_cache=False).logits.float()
    for i, (_, _, ids) in enumerate(prompts):
        ppl_bs_diff = max(ppl_bs_diff, float((blg[i, : len(ids)] - all_logits[i]).abs().max()))
    model = model.double()
    f64_diff = 0.0
    f64_argmax_same = True
    for (_, _, ids), lg in zip(prompts, all_logits):
        lg64 = logits_of(model, ids)
        f64_diff = max(f64_diff, float((lg64 - lg).abs().max()))
        f64_argmax_same &= bool(torch.equal(lg64.argmax(-1), lg.argmax(-1)))
    ppl64 = perplexity(model, ppl_ids, PPL_CTX)
    noise = {
        "batched_vs_single_max_abs": ppl_bs_diff,
        "f64_vs_f32_max_abs": f64_diff,
        "f64_argmax_identical": f64_argmax_same,
        "f64_ppl": ppl64["ppl"],
        "generate_cached_equals_uncached": True,
    }
    print(f"smollm2 noise floor: {noise}")

    ref = {
        "model_file": SMOL_FILE,
        "sha256": SMOL_SHA256,
        "generator": "scripts/gen_llama_fixtures.py",
        "versions": versions(),
        "dequantization": "transformers GGUF loader: every tensor dequantized to f32 by "
        "gguf-py's gguf.dequantize (Q4_1, Q8_0 token_embd, F32 norms), q/k rows un-permuted "
        "from llama.cpp's interleaved rope layout to HF's rotate_half layout; lm_head tied to "
        "token_embd; forward in f32, eager attention",
        "vocab_size": vocab,
        "tokenizer": {
            "add_bos_token": bool(getattr(tok, "add_bos_token", False)),
            "bos_token": tok.bos_token,
            "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token,
            "eos_token_id": tok.eos_token_id,
            "chat_template": tok.chat_template,
        },
        "top_k": TOP_K,
        "logits_digits": 7,
        "noise": noise,
        "prompts": out_prompts,
        "generation": {
            "prompt": prompts[0][0],
            "prompt_ids": gen_prompt,
            "max_new_tokens": 16,
            "do_sample": False,
            "stops_at_eos": False,
            "new_ids": new_ids,
            "new_text": tok.decode(new_ids, skip_special_tokens=False),
            "first_eos_index": first_eos,
            "min_top2_margin": r7(min_margin),
        },
        "perplexity": {
            "file": "ppl.txt",
            "ctx": PPL_CTX,
            "add_bos": False,
            "protocol": "tokenize the whole file without BOS; non-overlapping windows of ctx "
            "tokens (a last partial window is kept if it has >= 2 tokens); score every token "
            "after the first of each window given the earlier tokens of that window; "
            "ppl = exp(mean NLL over all scored tokens)",
            "n_tokens": len(ppl_ids),
            **ppl,
        },
    }
    out = os.path.join(FIXTURES, "smollm2_reference.json")
    write_json(out, ref)
    print(f"smollm2_reference.json: {os.path.getsize(out)} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--tiny", action="store_true", help="only the tiny random checkpoints")
    ap.add_argument("--smollm2", action="store_true", help="only the SmolLM2 reference")
    ap.add_argument(
        "--models-dir",
        default=os.environ.get("MODELS_DIR", os.path.join(ROOT, "models")),
        help="folder holding the SmolLM2 GGUF (default: $MODELS_DIR or <repo>/models)",
    )
    args = ap.parse_args()
    both = not args.tiny and not args.smollm2
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    os.makedirs(FIXTURES, exist_ok=True)
    if args.tiny or both:
        build_tiny("llama", 1234)
        build_tiny("qwen2", 6)
    if args.smollm2 or both:
        # Like fetch-models.sh, a relative MODELS_DIR is taken from the repository root.
        build_smollm2(os.path.join(ROOT, args.models_dir))


if __name__ == "__main__":
    main()
