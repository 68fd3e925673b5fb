#!/usr/bin/env python3
"""Embedding throughput: `luminal bench-embed` against sentence-transformers on PyTorch CPU,
same model, same batch of token ids, same threads, one run of each alternately.

    pip install torch sentence-transformers
    cargo build --release -p luminal_cli
    python3 scripts/bench_embed_vs_torch.py [--model models/all-MiniLM-L6-v2] [--threads 2]
        [--batch 32] [--tokens 128] [--reps 5] [--rounds 2] [--precision highest,high]

PyTorch runs the sentence-transformers module chain (BERT, pooling, normalisation) on the
same ids luminal builds ([CLS], 126 word ids spread over the vocabulary, [SEP]), under
torch.inference_mode with torch.set_num_threads(threads); each side reports its best of
`reps` timed runs after a warm-up. Prints a markdown row per round, precision and the ratio.

`--precision` lists float32 matmul precisions to compare at (default `highest`): each runs
luminal with `--matmul-precision P` and PyTorch under `torch.set_float32_matmul_precision(P)`
(PyTorch's "high" may use bfloat16x3 or TF32 where its kernels have them; on CPU builds
without them it computes as "highest").
"""
import argparse
import json
import os
import subprocess
import time

import torch
from sentence_transformers import SentenceTransformer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

p = argparse.ArgumentParser()
p.add_argument("--model", default=os.path.join(ROOT, "models", "all-MiniLM-L6-v2"))
p.add_argument("--threads", type=int, default=2)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--tokens", type=int, default=128)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--precision", default="highest", help="comma-separated: highest, high")
a = p.parse_args()
precisions = a.precision.split(",")

torch.set_num_threads(a.threads)
st = SentenceTransformer(a.model, device="cpu").eval()
tok = st.tokenizer
vocab = st[0].auto_model.config.vocab_size
cls, sep = tok.cls_token_id, tok.sep_token_id
ids = [[cls] + [1000 + (b * 7919 + j * 104729) % (vocab - 1000) for j in range(1, a.tokens - 1)] + [sep]
       for b in range(a.batch)]
features = {"input_ids": torch.tensor(ids), "attention_mask": torch.ones(a.batch, a.tokens, dtype=torch.long),
            "token_type_ids": torch.zeros(a.batch, a.tokens, dtype=torch.long)}


def torch_best():
    with torch.inference_mode():
        st(dict(features))  # warm-up
        times = []
        for _ in range(a.reps):
            t = time.perf_counter()
            out = st(dict(features))["sentence_embedding"]
            times.append(time.perf_counter() - t)
    assert out.shape == (a.batch, st.get_sentence_embedding_dimension())
    return min(times)


def luminal_best(precision):
    exe = os.path.join(ROOT, "target", "release", "luminal")
    out = subprocess.run([exe, "bench-embed", "--model", a.model, "-b", str(a.batch), "-n", str(a.tokens),
                          "-r", str(a.reps), "-t", str(a.threads), "--matmul-precision", precision, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["best_s"]


print(f"torch {torch.__version__}, {a.threads} threads, batch {a.batch} x {a.tokens} tokens, best of {a.reps}")
print("| round | float32 matmul precision | luminal sentences/s | PyTorch sentences/s | ratio |")
print("|---|---|---|---|---|")
for r in range(a.rounds):
    for prec in precisions:
        lum = a.batch / luminal_best(prec)
        torch.set_float32_matmul_precision(prec)
        pt = a.batch / torch_best()
        print(f"| {r + 1} | {prec} | {lum:.1f} | {pt:.1f} | {lum / pt:.2f}x |", flush=True)
