#!/usr/bin/env python3
"""A tiny random Whisper in the Hugging Face layout and transformers' outputs for it
(crates/luminal_model_tests/tests/whisper_model.rs).

    pip install torch transformers tokenizers
    python3 scripts/gen_whisper_fixtures.py   # after scripts/gen_whisper_audio_fixtures.py

Writes crates/luminal_model_tests/tests/fixtures/tiny-whisper/ (config.json,
model.safetensors, tokenizer.json with a byte-level vocabulary and Whisper's special tokens,
generation_config.json with suppress_tokens / begin_suppress_tokens) and
tiny-whisper.reference.json: for the log-mel features of audio/tones.wav (transformers'
WhisperFeatureExtractor), the encoder's last hidden state (rows 0, 1, 700, 1499 in full and
every row's sum), and greedy decoding (up to 20 steps) from the prompt <|startoftranscript|> <|en|>
<|transcribe|> <|notimestamps|>: each step's argmax after suppress_tokens (every step) and
begin_suppress_tokens (first step), its logit, the gap to the runner-up and all the raw
logits of the step — computed in
float64 by a plain loop over WhisperForConditionalGeneration's full forward (no cache), so the
reference shares no decoding code with transformers' generate().
"""
import json
import os
import shutil
import wave

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "luminal_model_tests", "tests", "fixtures")
OUT = os.path.join(FIX, "tiny-whisper")
torch.manual_seed(2)

# Byte-level vocabulary: the 256 byte characters, a few merges' worth of words, then the
# special tokens at the end (as in Whisper's own vocabulary).
byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
byte_chars.sort()
words = ["Ġthe", "Ġcat", "Ġsat", "Ġon", "Ġmat", "Ġhello", "Ġworld"]
vocab = {c: i for i, c in enumerate(byte_chars)}
for w in words:
    vocab[w] = len(vocab)
merges = []
specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
bpe = BPE(vocab=vocab, merges=merges)
tok = Tokenizer(bpe)
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens(specials)
ids = {s: tok.token_to_id(s) for s in specials}
n_vocab = tok.get_vocab_size()

cfg = WhisperConfig(vocab_size=n_vocab, num_mel_bins=80, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                    decoder_layers=2, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                    max_source_positions=1500, max_target_positions=64, activation_function="gelu",
                    pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"],
                    eos_token_id=ids["<|endoftext|>"], decoder_start_token_id=ids["<|startoftranscript|>"],
                    tie_word_embeddings=True)
model = WhisperForConditionalGeneration(cfg).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "encoder.embed_positions" in name:
            continue  # Whisper's sinusoids
        if "decoder.embed_positions" in name:
            p.normal_(0.0, 1.0)  # positions that matter, so the cache's positions are checked
            continue
        p.normal_(0.0, 0.25 if p.dim() > 1 else 0.1)
        if "layer_norm" in name and name.endswith("weight"):
            p.add_(1.0)
shutil.rmtree(OUT, ignore_errors=True)
model.save_pretrained(OUT, safe_serialization=True)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                               unk_token="<|endoftext|>", pad_token="<|endoftext|>")
fast.save_pretrained(OUT)
suppress = [vocab["Ġmat"], vocab["!"], ids["<|nocaptions|>"]]
begin_suppress = [vocab["Ġ"], ids["<|endoftext|>"]]
gen = {"decoder_start_token_id": ids["<|startoftranscript|>"], "eos_token_id": ids["<|endoftext|>"],
       "suppress_tokens": suppress, "begin_suppress_tokens": begin_suppress, "max_length": 64}
with open(os.path.join(OUT, "generation_config.json"), "w") as f:
    json.dump(gen, f, indent=2)

# Features of tones.wav, encoder output, plain greedy loop in float64.
with wave.open(os.path.join(FIX, "audio", "tones.wav")) as w:
    pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
samples = pcm.astype(np.float64) / 32768.0
fe = WhisperFeatureExtractor(feature_size=80)
padded = np.zeros(fe.n_samples)
padded[: len(samples)] = samples
feats = torch.tensor(fe._np_extract_fbank_features(padded[None, :], "cpu"), dtype=torch.float64)
m64 = WhisperForConditionalGeneration.from_pretrained(OUT).double().eval()
with torch.no_grad():
    enc = m64.model.encoder(feats).last_hidden_state[0]
    prompt = [ids["<|startoftranscript|>"], ids["<|en|>"], ids["<|transcribe|>"], ids["<|notimestamps|>"]]
    tokens = list(prompt)
    steps = []
    for step in range(20):
        raw = m64(input_features=feats, decoder_input_ids=torch.tensor([tokens])).logits[0, -1]
        logits = raw.clone()
        logits[suppress] = -float("inf")
        if step == 0:
            logits[begin_suppress] = -float("inf")
        top2 = torch.topk(logits, 2)
        nxt = int(top2.indices[0])
        steps.append({"id": nxt, "logit": float(top2.values[0]), "gap": float(top2.values[0] - top2.values[1]),
                      "logits": [float(f"{v:.9g}") for v in raw.tolist()]})
        tokens.append(nxt)
        if nxt == ids["<|endoftext|>"]:
            break
r = lambda xs: [float(f"{v:.9g}") for v in xs]
ref = {
    "prompt": prompt,
    "special_ids": ids,
    "encoder_rows": {str(i): r(enc[i].tolist()) for i in [0, 1, 700, 1499]},
    "encoder_row_sums": r(enc.sum(-1).tolist()),
    "greedy": steps,
    "min_gap": min(s["gap"] for s in steps),
}
with open(os.path.join(FIX, "tiny-whisper.reference.json"), "w") as f:
    json.dump(ref, f, separators=(",", ":"))
print("greedy:", [s["id"] for s in steps], "min gap", ref["min_gap"], "vocab", n_vocab)
