#!/usr/bin/env python3
"""Teacher-forced reference for the SmolLM2 decode-agreement tests, computed with transformers.

    pip install torch transformers accelerate gguf
    ./scripts/fetch-models.sh        # models/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 scripts/gen_smollm2_decode_fixture.py

transformers loads the shipped Q4_1 GGUF (every tensor dequantized to f32 by gguf-py) and
runs the first N_TOKENS tokens of tests/fixtures/ppl.txt (no BOS) in one f32 forward pass.
For every position it records the argmax and the top1 - top2 logit margin. The Rust tests
feed the same tokens one decode step at a time and count how often their argmax agrees.
Nothing here runs luminal. Output: crates/luminal_model_tests/tests/fixtures/smollm2_decode_reference.json
"""

import hashlib
import json
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "crates", "luminal_model_tests", "tests", "fixtures")
MODELS = os.path.join(ROOT, "models")
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_TOKENS = 400


def main() -> None:
    path = os.path.join(MODELS, SMOL_FILE)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=SMOL_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        MODELS, gguf_file=SMOL_FILE, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with open(os.path.join(FIXTURES, "ppl.txt"), encoding="utf-8") as f:
        text = f.read()
    ids = tok(text, add_special_tokens=False).input_ids[:N_TOKENS]
    assert len(ids) == N_TOKENS, len(ids)
    with torch.no_grad():
        lg = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    top = torch.topk(lg, 2, dim=-1)
    margin = (top.values[:, 0] - top.values[:, 1]).tolist()
    out = {
        "generator": "scripts/gen_smollm2_decode_fixture.py",
        "model_file": SMOL_FILE,
        "sha256": digest,
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "text": "the first N tokens of ppl.txt, no BOS",
        "ids": ids,
        "argmax": torch.argmax(lg, dim=-1).tolist(),
        "top1_margin": [round(v, 5) for v in margin],
    }
    dst = os.path.join(FIXTURES, "smollm2_decode_reference.json")
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(out, f, separators=(",", ":"))
    small = sum(m < 0.1 for m in margin)
    print(f"wrote {dst}: {len(ids)} positions, {small} with margin < 0.1")


if __name__ == "__main__":
    main()
