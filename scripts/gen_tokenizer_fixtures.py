#!/usr/bin/env python3
"""Reference token ids for luminal_io's tokenizers, from independent implementations.

    pip install transformers gguf sentencepiece protobuf tokenizers   # no torch needed
    pip install llama-cpp-python        # optional: cross-check against llama.cpp itself
    python3 scripts/gen_tokenizer_fixtures.py

    # tested with transformers 5.23, tokenizers 0.23, sentencepiece 0.2.3, gguf 0.19,
    # llama-cpp-python 0.3.36 (a ~1 hour source build on 2 cores)

Writes crates/luminal_io/tests/fixtures/tokenizer/:

* smollm2.json (only when models/SmolLM2-135M-Instruct.Q4_1.gguf is present): ids of
  `transformers`' tokenizer for that GGUF (`AutoTokenizer.from_pretrained(models,
  gguf_file=...)`, i.e. its GGUF converter) on a varied list of strings, with the special
  tokens in the text parsed (`ids`) and not parsed (`ids_plain`, `encode_special_tokens`), and
  its decodings with and without special tokens.
  One correction: the file says `tokenizer.ggml.pre = "smollm"`, for which transformers 5.23
  has no split rule and falls back to GPT-2's ByteLevel regex. SmolLM2's own tokenizer.json (and
  llama.cpp's "smollm" pre-tokenizer: `\\p{N}` then the GPT-2 regex) first isolates every digit,
  which changes e.g. "  1" (ĠĠ 1, not Ġ Ġ 1) and "x\n\n3" (ĊĊ, not Ċ Ċ). The script restores that
  original pre-tokenizer, Sequence[Digits(individual_digits), ByteLevel], on the converted
  tokenizer; with it, transformers and llama.cpp agree on every string below.
  When llama-cpp-python is installed, `llama_cpp_ids` / `llama_cpp_ids_plain` hold
  llama.cpp's own tokenization (`Llama(vocab_only=True).tokenize(text, add_bos, special)`), a
  second, fully independent reference.

* spm_tiny.gguf + spm.json: a SentencePiece BPE model trained here with the `sentencepiece`
  package (byte_fallback, identity normalisation, dummy prefix, a user-defined `<|user|>`,
  control `<|im_start|>`/`<|im_end|>`), written as a GGUF (`tokenizer.ggml.model = "llama"`,
  tokens, scores, token types, bos/eos/unk ids, llama.* hyper-parameters but no tensors) with
  gguf-py's GGUFWriter. Reference ids come from the `sentencepiece` processor itself. Special
  tokens in the text follow llama.cpp's rule: the text is cut at control tokens (when special
  tokens are parsed) and user-defined ones (always), longest token first, and each remaining
  piece is encoded on its own, so each gets the dummy prefix space; BOS is prepended when
  special tokens are added. `decoded_skip` is `sentencepiece`'s decode of the ids.
  The same vocabulary is written as a Llama-2-style tokenizer.json in hf_llama_spm/ (BPE with
  byte fallback and merges from `transformers.tokenization_utils_base.generate_merges`, the
  Prepend/Replace normaliser, the Replace/ByteFallback/Fuse/Strip decoder and a `<s> $A`
  template), and the python `tokenizers` library's encodings (`hf_ids`, post-processor
  included) and decodings (`hf_decoded`, `hf_decoded_skip`) of it are recorded too.

* hf_bytelevel/ + hf_bytelevel.json: a small byte-level BPE tokenizer.json trained here with
  the python `tokenizers` library (SmolLM-style Digits + ByteLevel pre-tokenizer, special
  tokens <|endoftext|>, <|im_start|>, <|im_end|>), with a tokenizer_config.json (bos, eos,
  add_bos_token, chat_template) and generation_config.json; reference ids and decodings from
  the python `tokenizers` library.

The training text is the plain-text pydoc of a few standard-library modules plus a few
sentences in other languages, so the script needs no download.
"""
import importlib
import io
import json
import os
import pydoc
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "luminal_io", "tests", "fixtures", "tokenizer")
MODELS = os.path.join(ROOT, "models")
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Strings every tokenizer is checked on: digits and long numbers, whitespace runs, tabs,
# newlines, accents, CJK, emoji (multi-token characters), code, apostrophes.
COMMON = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple   spaces   inside",
    "   ",
    " ",
    "\n",
    "\ttab\tseparated\tvalues",
    "line one\nline two\n\nline four\n",
    "windows\r\nline endings\r\n",
    "12345",
    "3.14159265358979",
    "1234567890123456789",
    "phone 555-0123, year 2024, 1,000,000 items",
    "  1",
    "a  12",
    "x\n\n3",
    "a1b2c3",
    "naïve café résumé déjà vu",
    "Ünïcödé Ωmega straße",
    "日本語のテキストです。",
    "中文测试，你好世界",
    "한국어 텍스트",
    "Привет, мир!",
    "مرحبا بالعالم",
    "emoji 🙂👍🏽🚀",
    "👨‍👩‍👧‍👦 family",
    "flags 🇫🇷🇯🇵",
    "def square(x):\n    return x ** 2  # comment\n",
    'fn main() { println!("{}", 1 + 2); }',
    '<html><body class="x">hi &amp; bye</body></html>',
    "don't won't it's I'm we'll they've he'd",
    "DON'T SHOUT'S",
    "\u00a0non-breaking and\u3000ideographic spaces",
    "zero\u200bwidth joiner",
    "mixed 日本 and English 123 🙂",
    "The quick brown fox jumps over the lazy dog. " * 3,
]

SMOL_SPECIAL = [
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<|im_start|><|im_end|>",
    "not special: <|im_start and im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n",
]

SPM_SPECIAL = [
    "<s>hello</s>",
    "a<|user|>b",
    "<|user|> hi <|user|>",
    "x<|im_start|>y<|im_end|>z",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<unk> stays text?",
    "half <|im_sta rt|>",
]

HF_SPECIAL = [
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more",
    "<|im_start|><|im_end|>",
]

OTHER_LANGUAGES = [
    "Le café est très bon, n'est-ce pas ? Où est la bibliothèque ?",
    "Die Straße ist naß und schön; Grüße aus München.",
    "El niño comió paella en la playa con su mamá.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "素早い茶色の狐がのろまな犬を飛び越える。東京は日本の首都です。",
    "敏捷的棕色狐狸跳过了懒狗。北京是中国的首都。",
]


def corpus():
    lines = []
    for name in ["json", "string", "textwrap", "argparse", "collections", "functools",
                 "itertools", "pathlib", "random", "re"]:
        doc = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)
        # Object addresses (" at 0x7f...") differ from run to run: drop them.
        lines += [re.sub(r" at 0x[0-9a-f]+", "", line) for line in doc.splitlines() if line.strip()]
    return lines + OTHER_LANGUAGES * 20


def write_json(name, value):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(path, ROOT))


def try_llama_cpp(path):
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python not installed: no llama.cpp cross-check")
        return None
    return llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)


def llama_cpp_ids(llm, text, special):
    if llm is None:
        return None
    return llm.tokenize(text.encode("utf-8"), add_bos=special, special=special)


# --------------------------------------------------------------------------------------------
# SmolLM2 (byte-level BPE from GGUF)


def smollm2():
    path = os.path.join(MODELS, SMOL_FILE)
    if not os.path.exists(path):
        print(f"{path} absent: skipping smollm2.json")
        return
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=SMOL_FILE)
    backend = tok.backend_tokenizer
    # SmolLM2's original pre-tokenizer (see the module docstring).
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    plain = backend.__class__.from_str(backend.to_str())
    plain.encode_special_tokens = True
    llm = try_llama_cpp(path)

    cases = []
    mismatches = 0
    for text in COMMON + SMOL_SPECIAL:
        ids = tok.encode(text, add_special_tokens=True)
        ids_plain = plain.encode(text, add_special_tokens=False).ids
        case = {
            "text": text,
            "ids": ids,
            "ids_plain": ids_plain,
            "decoded": tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False),
        }
        if llm is not None:
            case["llama_cpp_ids"] = llama_cpp_ids(llm, text, True)
            case["llama_cpp_ids_plain"] = llama_cpp_ids(llm, text, False)
            if case["llama_cpp_ids"] != ids or case["llama_cpp_ids_plain"] != ids_plain:
                mismatches += 1
                print("  transformers and llama.cpp differ on", repr(text))
        cases.append(case)
    if llm is not None:
        print(f"smollm2: llama.cpp agrees with transformers on {len(cases) - mismatches}/{len(cases)}")
    write_json("smollm2.json", {
        "model": SMOL_FILE,
        "reference": "transformers AutoTokenizer(gguf_file) with SmolLM2's Digits+ByteLevel "
                     "pre-tokenizer; llama_cpp_* from llama-cpp-python when present",
        "add_bos": False,
        "bos_id": tok.bos_token_id,
        "eos_id": tok.eos_token_id,
        "vocab_size": len(tok),
        "cases": cases,
    })


# --------------------------------------------------------------------------------------------
# SentencePiece: tiny GGUF + Llama-2-style tokenizer.json


SPM_USER = ["<|user|>"]
SPM_CONTROL = ["<|im_start|>", "<|im_end|>"]


def train_spm():
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, model_type="bpe",
        vocab_size=1000, byte_fallback=True, character_coverage=0.9995,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, allow_whitespace_only_pieces=True, split_digits=False,
        user_defined_symbols=SPM_USER, control_symbols=SPM_CONTROL,
        num_threads=1, minloglevel=2,
    )
    return model.getvalue()


def partition(text, tokens):
    """llama.cpp's tokenizer_st_partition: cut at every occurrence of each token, longest
    token first; returns a list of str (raw text) and int (token id) fragments."""
    fragments = [text] if text else []
    for content, token_id in sorted(tokens, key=lambda t: -len(t[0].encode())):
        out = []
        for fragment in fragments:
            if not isinstance(fragment, str):
                out.append(fragment)
                continue
            while True:
                at = fragment.find(content)
                if at < 0:
                    break
                if at > 0:
                    out.append(fragment[:at])
                out.append(token_id)
                fragment = fragment[at + len(content):]
            if fragment:
                out.append(fragment)
        fragments = out
    return fragments


def spm_fixtures():
    import gguf
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    from transformers.tokenization_utils_base import generate_merges

    blob = train_spm()
    sp = spm.SentencePieceProcessor(model_proto=blob)
    proto = pb.ModelProto()
    proto.ParseFromString(blob)
    pieces = [(p.piece, p.score, int(p.type)) for p in proto.pieces]
    tokens = [p[0] for p in pieces]
    bos, eos, unk = sp.bos_id(), sp.eos_id(), sp.unk_id()

    # GGUF
    path = os.path.join(OUT, "spm_tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("spm-tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([p[1] for p in pieces])
    writer.add_token_types([p[2] for p in pieces])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_unk_token_id(unk)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print("wrote", os.path.relpath(path, ROOT), os.path.getsize(path), "bytes")

    # Llama-2-style tokenizer.json of the same vocabulary.
    vocab = {piece: i for i, piece in enumerate(tokens)}
    merges = generate_merges(vocab, {p[0]: p[1] for p in pieces})
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=tokens[unk], fuse_unk=True,
                              byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    hf.add_special_tokens([AddedToken(p[0], normalized=False, special=True)
                           for p in pieces if p[2] in (2, 3)])
    hf.add_tokens([AddedToken(p[0], normalized=False, special=False) for p in pieces if p[2] == 4])
    hf.post_processor = processors.TemplateProcessing(
        single=f"{tokens[bos]}:0 $A:0", special_tokens=[(tokens[bos], bos)])
    os.makedirs(os.path.join(OUT, "hf_llama_spm"), exist_ok=True)
    hf.save(os.path.join(OUT, "hf_llama_spm", "tokenizer.json"))

    llm = try_llama_cpp(path)
    control = [(p[0], i) for i, p in enumerate(pieces) if p[2] in (2, 3)]
    user = [(p[0], i) for i, p in enumerate(pieces) if p[2] == 4]

    def encode(text, special):
        ids = [bos] if special else []
        for fragment in partition(text, user + control if special else user):
            ids += [fragment] if isinstance(fragment, int) else sp.encode(fragment)
        return ids

    cases = []
    disagreements = []
    for text in COMMON + SPM_SPECIAL:
        ids, ids_plain = encode(text, True), encode(text, False)
        hf_ids = hf.encode(text, add_special_tokens=True).ids
        case = {
            "text": text,
            "ids": ids,
            "ids_plain": ids_plain,
            "decoded_skip": sp.decode(ids),
            "hf_ids": hf_ids,
            "hf_decoded": hf.decode(hf_ids, skip_special_tokens=False),
            "hf_decoded_skip": hf.decode(hf_ids, skip_special_tokens=True),
        }
        if hf_ids != ids:
            disagreements.append(f"tokenizers-python on {text!r}")
        if llm is not None:
            case["llama_cpp_ids"] = llama_cpp_ids(llm, text, True)
            case["llama_cpp_ids_plain"] = llama_cpp_ids(llm, text, False)
            if case["llama_cpp_ids"] != ids or case["llama_cpp_ids_plain"] != ids_plain:
                disagreements.append(f"llama.cpp on {text!r}")
        cases.append(case)
    for d in disagreements:
        print("  sentencepiece reference differs from", d)
    write_json("spm.json", {
        "reference": "sentencepiece (SentencePieceProcessor.encode/decode) with llama.cpp's "
                     "special-token partition; hf_* from the python tokenizers library on "
                     "hf_llama_spm/tokenizer.json; llama_cpp_* from llama-cpp-python",
        "vocab_size": len(tokens),
        "bos_id": bos,
        "eos_id": eos,
        "unk_id": unk,
        "cases": cases,
    })


# --------------------------------------------------------------------------------------------
# Byte-level BPE tokenizer.json trained with python tokenizers


def hf_bytelevel():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)

    folder = os.path.join(OUT, "hf_bytelevel")
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    template = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}")
    config = {
        "bos_token": "<|endoftext|>",
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True},
        "pad_token": None,
        "add_bos_token": True,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": [2, 0]}, f, indent=2)

    plain = Tokenizer.from_str(tok.to_str())
    plain.encode_special_tokens = True
    cases = []
    for text in COMMON + HF_SPECIAL:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_plain": plain.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        })
    write_json("hf_bytelevel.json", {
        "reference": "python tokenizers (Tokenizer.encode/decode; encode_special_tokens for "
                     "ids_plain) on hf_bytelevel/tokenizer.json; encode(text, true) adds "
                     "bos_token because tokenizer_config.json says add_bos_token",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bos_id": tok.token_to_id("<|endoftext|>"),
        "eos_id": tok.token_to_id("<|im_end|>"),
        "chat_template": template,
        "cases": cases,
    })


def main():
    os.makedirs(OUT, exist_ok=True)
    smollm2()
    spm_fixtures()
    hf_bytelevel()


if __name__ == "__main__":
    main()
