#!/usr/bin/env python3
"""Convert a CTranslate2 Whisper model (`model.bin` + `config.json` + `tokenizer.json`, as
faster-whisper uses) into the Hugging Face layout luminal reads (config.json,
model.safetensors, tokenizer.json, generation_config.json).

    python3 scripts/convert_ct2_whisper.py SRC_DIR DST_DIR

Pure Python (struct + json): no numpy, torch or ctranslate2 needed. Reads model.bin version
6 (`WhisperSpec`): variables `name, rank, shape, dtype, bytes`, then aliases. Float16 and
float32 weights are copied as they are (no re-rounding). CTranslate2 fuses the projections:
self-attention `linear_0` is q|k|v stacked by rows, cross-attention `linear_1` is k|v; they
are split into transformers' q_proj/k_proj/v_proj (Whisper has no k bias: the fused bias's k
part must be zero, which is checked). `suppress_ids` / `suppress_ids_begin` become
generation_config.json's suppress_tokens / begin_suppress_tokens; a vocabulary of 51865 or
more tokens means a multilingual model (openai-whisper's rule).
"""
import json
import os
import shutil
import struct
import sys

DTYPES = {0: ("F32", 4), 1: ("I8", 1), 2: ("I16", 2), 3: ("I32", 4), 4: ("F16", 2), 5: ("BF16", 2)}


def fail(msg):
    sys.exit(f"convert_ct2_whisper: {msg}")


def read_model_bin(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(data):
            fail(f"{path} is truncated at byte {pos}")
        chunk = data[pos:pos + n]
        pos += n
        return chunk

    def u(fmt):
        return struct.unpack("<" + fmt, take(struct.calcsize("<" + fmt)))[0]

    def string():
        return take(u("H"))[:-1].decode()

    version = u("I")
    if version != 6:
        fail(f"model.bin version {version} (this converter reads version 6)")
    spec = string()
    if spec != "WhisperSpec":
        fail(f"model.bin holds a {spec}, not a WhisperSpec")
    u("I")  # spec revision
    variables = {}
    for _ in range(u("I")):
        name = string()
        rank = u("B")
        shape = [u("I") for _ in range(rank)]
        dtype_id = u("B")
        if dtype_id not in DTYPES:
            fail(f"{name}: unknown dtype id {dtype_id}")
        nbytes = u("I")
        variables[name] = (shape, DTYPES[dtype_id], take(nbytes))
    for _ in range(u("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    return variables


def scalar(variables, name):
    shape, (dtype, size), raw = variables[name]
    return int.from_bytes(raw, "little", signed=True)


def main(src, dst):
    v = read_model_bin(os.path.join(src, "model.bin"))
    with open(os.path.join(src, "config.json")) as f:
        ct2_config = json.load(f)
    tensors = {}

    def put(name, shape, dtype, raw):
        tensors[name] = (shape, dtype, raw)

    def copy(hf, ct2):
        shape, (dtype, size), raw = v[ct2]
        put(hf, shape, dtype, raw)

    def rows(ct2, start, end, check_zero=False):
        shape, (dtype, size), raw = v[ct2]
        width = size * (shape[1] if len(shape) == 2 else 1)
        chunk = raw[start * width:end * width]
        if check_zero and any(chunk):
            fail(f"{ct2}: the k part of a fused bias is not zero")
        return [end - start] + shape[1:], dtype, chunk

    def norm(hf, ct2):
        copy(f"{hf}.weight", f"{ct2}/gamma")
        copy(f"{hf}.bias", f"{ct2}/beta")

    def linear(hf, ct2, bias=True):
        copy(f"{hf}.weight", f"{ct2}/weight")
        if bias:
            copy(f"{hf}.bias", f"{ct2}/bias")

    d = v["encoder/conv1/weight"][0][0]
    n_mels = v["encoder/conv1/weight"][0][1]
    vocab = v["decoder/embeddings/weight"][0][0]
    layers = lambda side: sum(1 for n in v if n.startswith(f"{side}/layer_") and n.endswith("ffn/linear_0/weight"))
    enc_layers, dec_layers = layers("encoder"), layers("decoder")

    for c in ["conv1", "conv2"]:
        linear(f"model.encoder.{c}", f"encoder/{c}")
    copy("model.encoder.embed_positions.weight", "encoder/position_encodings/encodings")
    copy("model.decoder.embed_positions.weight", "decoder/position_encodings/encodings")
    copy("model.decoder.embed_tokens.weight", "decoder/embeddings/weight")
    norm("model.encoder.layer_norm", "encoder/layer_norm")
    norm("model.decoder.layer_norm", "decoder/layer_norm")
    for side, n in [("encoder", enc_layers), ("decoder", dec_layers)]:
        for i in range(n):
            hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            qkv = f"{ct}/self_attention/linear_0"
            put(f"{hf}.self_attn.q_proj.weight", *rows(f"{qkv}/weight", 0, d))
            put(f"{hf}.self_attn.k_proj.weight", *rows(f"{qkv}/weight", d, 2 * d))
            put(f"{hf}.self_attn.v_proj.weight", *rows(f"{qkv}/weight", 2 * d, 3 * d))
            put(f"{hf}.self_attn.q_proj.bias", *rows(f"{qkv}/bias", 0, d))
            rows(f"{qkv}/bias", d, 2 * d, check_zero=True)
            put(f"{hf}.self_attn.v_proj.bias", *rows(f"{qkv}/bias", 2 * d, 3 * d))
            linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
            norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
            linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
            linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
            norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")
            if side == "decoder":
                linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0")
                kv = f"{ct}/attention/linear_1"
                put(f"{hf}.encoder_attn.k_proj.weight", *rows(f"{kv}/weight", 0, d))
                put(f"{hf}.encoder_attn.v_proj.weight", *rows(f"{kv}/weight", d, 2 * d))
                rows(f"{kv}/bias", 0, d, check_zero=True)
                put(f"{hf}.encoder_attn.v_proj.bias", *rows(f"{kv}/bias", d, 2 * d))
                linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
                norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")

    os.makedirs(dst, exist_ok=True)
    # safetensors: little-endian u64 header length, JSON header, then the data.
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        shape, dtype, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = {"format": "pt", "converted_from": "CTranslate2 model.bin"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)

    heads = scalar(v, "encoder/num_heads")
    eot = 50256
    multilingual = vocab >= 51865
    sot = 50258 if multilingual else 50257
    config = {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": vocab, "num_mel_bins": n_mels, "d_model": d,
        "encoder_layers": enc_layers, "decoder_layers": dec_layers,
        "encoder_attention_heads": heads, "decoder_attention_heads": scalar(v, "decoder/num_heads"),
        "encoder_ffn_dim": v["encoder/layer_0/ffn/linear_0/weight"][0][0],
        "decoder_ffn_dim": v["decoder/layer_0/ffn/linear_0/weight"][0][0],
        "max_source_positions": v["encoder/position_encodings/encodings"][0][0],
        "max_target_positions": v["decoder/position_encodings/encodings"][0][0],
        "activation_function": "gelu", "scale_embedding": bool(scalar(v, "decoder/scale_embeddings")),
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "decoder_start_token_id": sot,
        "tie_word_embeddings": True, "torch_dtype": "float16",
    }
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    generation = {
        "decoder_start_token_id": sot, "eos_token_id": eot, "pad_token_id": eot, "max_length": 448,
        "is_multilingual": multilingual,
        "suppress_tokens": ct2_config.get("suppress_ids", []),
        "begin_suppress_tokens": ct2_config.get("suppress_ids_begin", []),
        "alignment_heads": ct2_config.get("alignment_heads", []),
    }
    with open(os.path.join(dst, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
    shutil.copy(os.path.join(src, "tokenizer.json"), os.path.join(dst, "tokenizer.json"))
    print(f"wrote {dst}: {len(tensors)} tensors, d_model {d}, {enc_layers}+{dec_layers} layers, vocab {vocab}",
          file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
