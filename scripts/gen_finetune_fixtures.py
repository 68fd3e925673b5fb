#!/usr/bin/env python3
"""PyTorch reference for fine-tuning the last block of the tiny Llama / Qwen2 checkpoints.

    pip install torch transformers   # tested with torch 2.15 (CPU), transformers 5.23
    python3 scripts/gen_finetune_fixtures.py

Nothing here runs luminal. Inputs: crates/luminal_model_tests/tests/fixtures/tiny-llama and
tiny-qwen2 (HF folders written by scripts/gen_llama_fixtures.py; their GGUF copies made by
scripts/gen_tiny_gguf_fixtures.py are what the Rust test loads). Output:
crates/luminal_model_tests/tests/fixtures/finetune_reference.json.

For each model: a batch of 2 windows (the first and the last `SEQ + 1` ids of
reference.json's longest case), inputs = ids[:, :-1], targets = ids[:, 1:]; the loss is the mean next-token
cross-entropy over all 2 × SEQ positions. Only the last decoder layer and the final norm
train (everything else frozen, as LlamaFinetune::build(.., train_last = 1) does). Recorded:
the loss and the gradients of the last layer's v_proj, o_proj, mlp and norm weights and of
model.norm (q/k are left out: the GGUF stores llama's q/k rows permuted), then the losses of
STEPS AdamW steps (torch.optim.AdamW defaults: betas (0.9, 0.999), eps 1e-8, weight decay
0.01; lr LR), each loss computed before its step.
"""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "crates/luminal_model_tests/tests/fixtures"
SEQ = 12
STEPS = 4
LR = 1e-2


def run(name):
    folder = FIX / name
    ref = json.loads((folder / "reference.json").read_text())
    case = ref["cases"][2]["ids"]
    ids = torch.tensor([case[: SEQ + 1], case[-(SEQ + 1) :]])
    assert ids.shape == (2, SEQ + 1), ids.shape
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()  # no dropout (there is none anyway)
    last = model.model.layers[-1]
    trainable = list(last.parameters()) + list(model.model.norm.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)

    def loss_fn():
        logits = model(input_ids=ids[:, :-1]).logits
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )

    loss = loss_fn()
    loss.backward()
    n = len(model.model.layers) - 1
    grads = {
        f"model.layers.{n}.self_attn.v_proj.weight": last.self_attn.v_proj.weight.grad,
        f"model.layers.{n}.self_attn.o_proj.weight": last.self_attn.o_proj.weight.grad,
        f"model.layers.{n}.mlp.gate_proj.weight": last.mlp.gate_proj.weight.grad,
        f"model.layers.{n}.mlp.up_proj.weight": last.mlp.up_proj.weight.grad,
        f"model.layers.{n}.mlp.down_proj.weight": last.mlp.down_proj.weight.grad,
        f"model.layers.{n}.input_layernorm.weight": last.input_layernorm.weight.grad,
        f"model.layers.{n}.post_attention_layernorm.weight": last.post_attention_layernorm.weight.grad,
        "model.norm.weight": model.model.norm.weight.grad,
    }
    grads = {k: [float(f"{x:.8g}") for x in v.flatten()] for k, v in grads.items()}

    for p in trainable:
        p.grad = None
    opt = torch.optim.AdamW(trainable, lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        l = loss_fn()
        losses.append(float(l))
        l.backward()
        opt.step()
    return {
        "ids": ids.tolist(),
        "loss": float(loss),
        "grads": grads,
        "adamw_lr": LR,
        "adamw_losses": losses,
    }


def main():
    out = {
        "generator": "scripts/gen_finetune_fixtures.py",
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "seq": SEQ,
        "models": {name: run(name) for name in ("tiny-llama", "tiny-qwen2")},
    }
    path = FIX / "finetune_reference.json"
    path.write_text(json.dumps(out))
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
