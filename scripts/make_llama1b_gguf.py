"""Write a Llama-3.2-1B-shaped (or SmolLM2-135M-shaped) GGUF with random F16 weights, for speed benchmarks only.

Shape (Llama 3.2 1B): hidden 2048, 16 layers, 32 heads, 8 KV heads (head dim 64), FFN 8192,
RMSNorm eps 1e-5, RoPE base 500000, tied embeddings (no `output.weight`: the output
projection reads `token_embd.weight`, as in the real Llama 3.2 1B). The vocabulary and all
`tokenizer.*` metadata (gpt2 BPE, 49152 tokens, chat template) are copied from a reference
GGUF, by default SmolLM2-135M's, so the vocab is 49152 rather than Llama 3's 128256
(about 1.07B parameters instead of 1.24B).

Weights: N(0, 0.02²) rounded to F16, norm weights 1.0 (F32). The logits are meaningless; the
file exists to time prefill/decode at 1B scale. `--type q8_0|q4_0|q4_1` writes the matrices
quantized by gguf-py's reference quantizers instead (norms stay F32), or quantize the F16
file with llama-quantize (`llama-quantize --allow-requantize IN OUT Q4_0`). `--type
q4_k|q6_k` (gguf-py has no K-quant quantizer) writes random super-blocks whose scales keep
the weights at about the same size: for timing only (rows must be multiples of 256, so the
llama1b shape only).

`--shape smollm2`: SmolLM2-135M's shape instead (hidden 576, 30 layers, 9 heads, 3 KV heads,
FFN 1536, RoPE base 100000, tied embeddings; 134.5M parameters, ~270 MB), as the CUDA
benchmark of benches/README.md generates it on the device machine. `--ref` may be any GGUF
holding the `tokenizer.*` keys, e.g. one written with `--tokenizer-only` (no tensors, ~2 MB).

Usage: python3 scripts/make_llama1b_gguf.py OUT.gguf [--ref models/SmolLM2-135M-Instruct.Q4_1.gguf] [--seed 0] [--shape llama1b|smollm2] [--type f16|q8_0|q4_0|q4_1|q4_k|q6_k] [--tokenizer-only]
Needs: pip install numpy gguf  (tested with gguf 0.19.0). Writes ~2.1 GB; needs ~2.5 GB RAM.
"""
import argparse
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

# hidden, layers, heads, KV heads, FFN, RoPE base, name
SHAPES = {
    "llama1b": (2048, 16, 32, 8, 8192, 500000.0, "llama-3.2-1b-shape-random"),
    "smollm2": (576, 30, 9, 3, 1536, 100000.0, "smollm2-135m-shape-random"),
}


def copy_tokenizer(ref: GGUFReader, w: GGUFWriter) -> int:
    """Copies every `tokenizer.*` key; returns the vocabulary size."""
    vocab = None
    for key, field in ref.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        w.add_key_value(key, value, vtype, sub_type=sub)
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
    if vocab is None:
        sys.exit(f"{ref.path}: no tokenizer.ggml.tokens")
    return vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--ref", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama1b")
    ap.add_argument("--tokenizer-only", action="store_true", help="write only the tokenizer keys")
    ap.add_argument(
        "--type",
        choices=["f16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"],
        default="f16",
        help="the matrices' type (quantized with gguf-py's reference quantizers)",
    )
    args = ap.parse_args()
    HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, ROPE_BASE, NAME = SHAPES[args.shape]
    HEAD_DIM = HIDDEN // HEADS

    ref = GGUFReader(args.ref)
    tmp = args.out + ".part"
    w = GGUFWriter(tmp, "llama")
    if args.tokenizer_only:
        copy_tokenizer(ref, w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, args.out)
        print(f"wrote {args.out}: tokenizer only, {os.path.getsize(args.out)} bytes")
        return
    w.add_name(NAME)
    w.add_block_count(LAYERS)
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(1e-5)
    # ggml file types: MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_0, MOSTLY_Q4_1, MOSTLY_Q4_K_M,
    # MOSTLY_Q6_K.
    w.add_file_type({"f16": 1, "q8_0": 7, "q4_0": 2, "q4_1": 3, "q4_k": 15, "q6_k": 18}[args.type])
    vocab = copy_tokenizer(ref, w)
    w.add_vocab_size(vocab)

    rng = np.random.default_rng(args.seed)

    qtype = {
        "q8_0": GGMLQuantizationType.Q8_0,
        "q4_0": GGMLQuantizationType.Q4_0,
        "q4_1": GGMLQuantizationType.Q4_1,
    }.get(args.type)

    def rand(rows, cols):
        # numpy shape (rows, cols) = ggml ne [cols, rows]: cols is the input dimension.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    # Random K-quant super-blocks (256 values): (block bytes, offsets of f16 scales, their
    # size) with the other bytes random (quants, packed sub-block scales).
    kquant = {
        "q4_k": (GGMLQuantizationType.Q4_K, 144, [0, 2], 3e-5),
        "q6_k": (GGMLQuantizationType.Q6_K, 210, [208], 5e-6),
    }.get(args.type)

    def random_blocks(rows, cols):
        kt, nbytes, halves, size = kquant
        assert cols % 256 == 0, f"{args.type}: rows of {cols} are not whole super-blocks"
        b = rng.integers(0, 256, size=(rows, cols // 256, nbytes), dtype=np.uint8)
        for at in halves:
            h = (size * (1.0 + rng.random((rows, cols // 256)))).astype(np.float16)
            b[:, :, at : at + 2] = h.view(np.uint8).reshape(rows, cols // 256, 2)
        return b.reshape(rows, cols // 256 * nbytes), kt

    def add_matrix(name, rows, cols):
        if kquant is not None:
            b, kt = random_blocks(rows, cols)
            w.add_tensor(name, b, raw_dtype=kt)
            return
        m = rand(rows, cols)
        if qtype is None:
            w.add_tensor(name, m)
        else:
            w.add_tensor(name, quants.quantize(m.astype(np.float32), qtype), raw_dtype=qtype)

    ones = lambda n: np.ones(n, dtype=np.float32)
    add_matrix("token_embd.weight", vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(HIDDEN))
        add_matrix(p + "attn_q.weight", HIDDEN, HIDDEN)
        add_matrix(p + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add_matrix(p + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add_matrix(p + "attn_output.weight", HIDDEN, HIDDEN)
        w.add_tensor(p + "ffn_norm.weight", ones(HIDDEN))
        add_matrix(p + "ffn_gate.weight", FFN, HIDDEN)
        add_matrix(p + "ffn_up.weight", FFN, HIDDEN)
        add_matrix(p + "ffn_down.weight", HIDDEN, FFN)
    w.add_tensor("output_norm.weight", ones(HIDDEN))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, args.out)
    n = vocab * HIDDEN + LAYERS * (2 * HIDDEN * HIDDEN + 2 * KV_HEADS * HEAD_DIM * HIDDEN + 3 * HIDDEN * FFN)
    print(f"wrote {args.out}: {n / 1e9:.3f}B matrix parameters, vocab {vocab}, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
