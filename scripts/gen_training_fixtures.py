#!/usr/bin/env python3
"""Generates crates/luminal_training/tests/fixtures/training.json: PyTorch (float64) reference
values for the training tests.

- grads: small graphs (a loss over a few hl_ops), their inputs, and d loss / d param from
  torch.autograd. Each case name has a builder of the same name in
  crates/luminal_training/tests/torch_grads.rs.
- losses: each torch.nn.functional loss on fixed inputs: value and gradient w.r.t. its input.
- optim: ten-step trajectories (loss and parameters after each step) of torch.optim
  optimizers, with LR schedulers and gradient clipping, on one small regression problem.
  Lion is not in torch.optim: it is written out with torch tensor ops from Algorithm 2 of
  Chen et al. 2023 ("Symbolic Discovery of Optimization Algorithms").
- schedules: 30 learning rates of each torch.optim.lr_scheduler we mirror.

Usage (torch from PyPI, any recent version):
    pip install torch numpy     # CPU torch from PyPI
    python3 scripts/gen_training_fixtures.py
"""
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
rng = np.random.default_rng(1234)
OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "luminal_training", "tests",
                   "fixtures", "training.json")


def rand(shape, lo=-1.0, hi=1.0):
    # Values are rounded to f32 first so both sides start from the same numbers.
    return np.asarray(rng.uniform(lo, hi, size=shape), dtype=np.float32).astype(np.float64)


def enc(a):
    a = np.asarray(a)
    return {"shape": list(a.shape), "data": [float(v) for v in a.reshape(-1)]}


def enc_ids(a):
    a = np.asarray(a)
    return {"shape": list(a.shape), "data": [int(v) for v in a.reshape(-1)], "dtype": "i32"}


# ---------------------------------------------------------------- gradients of small graphs
def grad_case(params, consts, fn):
    """params/consts: dict name -> numpy array (ids as int arrays in consts)."""
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tc = {k: (torch.tensor(v) if v.dtype.kind == "f" else torch.tensor(v, dtype=torch.long))
          for k, v in consts.items()}
    loss = fn(**tp, **tc)
    loss.backward()
    inputs = {k: enc(v) for k, v in params.items()}
    inputs.update({k: (enc(v) if v.dtype.kind == "f" else enc_ids(v)) for k, v in consts.items()})
    return {
        "params": list(params.keys()),
        "inputs": inputs,
        "loss": float(loss.detach()),
        "grads": {k: enc(tp[k].grad.numpy()) for k in params},
    }


grads = {}
grads["unary"] = grad_case(
    {"x": rand((2, 3), 0.5, 2.0)}, {"w": rand((2, 3))},
    lambda x, w: (w * (torch.log2(x) + torch.exp2(x) + torch.sin(x) + torch.sqrt(x) + 1 / x)).sum())
grads["linear_relu"] = grad_case(
    {"w1": rand((5, 3)), "b1": rand((3,))}, {"x": rand((4, 5)), "w": rand((4, 3))},
    lambda w1, b1, x, w: (torch.relu(x @ w1 + b1) * w).sum())
grads["mlp_tanh_sigmoid"] = grad_case(
    {"w1": rand((3, 6)), "w2": rand((6, 2))}, {"x": rand((5, 3)), "w": rand((5, 2))},
    lambda w1, w2, x, w: (torch.sigmoid(torch.tanh(x @ w1) @ w2) * w).sum())
grads["non_contiguous_views"] = grad_case(
    {"x": rand((4, 6))}, {"w": rand((4, 4)), "v": rand((3, 6))},
    lambda x, w, v: (x.t()[1:5] * w).sum()
    + (F.pad(x, (0, 0, 1, 2))[:5:2] * v).sum())
grads["softmax_layer_norm"] = grad_case(
    {"x": rand((3, 5))}, {"w1": rand((3, 5)), "w2": rand((3, 5))},
    lambda x, w1, w2: (torch.softmax(x, 1) * w1).sum()
    + (F.layer_norm(x, (5,), eps=1e-5) * w2).sum())
grads["amax_mean"] = grad_case(
    {"x": rand((3, 4))}, {"w": rand((3,)), "v": rand((4,))},
    lambda x, w, v: (torch.amax(x, 1) * w).sum() + (x.mean(0) * v).sum())
grads["embedding"] = grad_case(
    {"table": rand((6, 4))}, {"ids": np.array([3, 0, 3, 5, 3]), "w": rand((5, 4))},
    lambda table, ids, w: (F.embedding(ids, table) * w).sum())
grads["conv2d"] = grad_case(
    {"x": rand((1, 2, 5, 5)), "k": rand((3, 2, 3, 3))}, {"w": rand((1, 3, 3, 3))},
    lambda x, k, w: (F.conv2d(x, k, stride=1, padding=0) * w).sum())
grads["conv2d_pad_stride"] = grad_case(
    {"x": rand((2, 1, 6, 6)), "k": rand((2, 1, 3, 3))}, {"w": rand((2, 2, 3, 3))},
    lambda x, k, w: (F.conv2d(x, k, stride=2, padding=1) * w).sum())
grads["batched_matmul_gelu"] = grad_case(
    {"a": rand((2, 3, 4)), "b": rand((4, 5))}, {"w": rand((2, 3, 5))},
    lambda a, b, w: (F.gelu(a @ b) * w).sum())

grads["elementwise_hl_ops"] = grad_case(
    {"x": rand((3, 4), -2, 2)}, {"w": rand((8, 3, 4))},
    lambda x, w: (w[0] * torch.exp(x)).sum() + (w[1] * torch.tanh(x)).sum()
    + (w[2] * F.softplus(x)).sum() + (w[3] * F.silu(x)).sum()
    + (w[4] * F.leaky_relu(x, 0.1)).sum() + (w[5] * torch.abs(x)).sum()
    + (w[6] * torch.clamp(x, -0.5, 0.5)).sum() + (w[7] * x ** 3).sum())
grads["log_pow"] = grad_case(
    {"x": rand((2, 3), 0.5, 2.0)}, {"w": rand((3, 2, 3))},
    lambda x, w: (w[0] * torch.log(x)).sum() + (w[1] * x ** 1.5).sum() + (w[2] * x ** -2).sum())
grads["rms_norm_var_std"] = grad_case(
    {"x": rand((3, 5))}, {"w": rand((3, 5)), "v": rand((3,)), "u": rand((3,))},
    lambda x, w, v, u: (w * F.rms_norm(x, (5,), eps=1e-6)).sum()
    + (v * torch.var(x, 1)).sum() + (u * torch.std(x, 1)).sum())
grads["cumsum_prod"] = grad_case(
    {"x": rand((3, 4))}, {"w": rand((3, 4)), "v": rand((3,))},
    lambda x, w, v: (w * torch.cumsum(x, 1)).sum() + (v * torch.prod(x, 1)).sum())
grads["concat_split_stack"] = grad_case(
    {"a": rand((2, 3)), "b": rand((2, 2))}, {"w1": rand((2, 5)), "w2": rand((2, 2, 3)), "w3": rand((2, 4))},
    lambda a, b, w1, w2, w3: (w1 * torch.cat([a, b], 1)).sum()
    + (w2 * torch.stack([a, a * 2], 0)).sum()
    + (w3 * torch.split(torch.cat([a, b], 1), [1, 4], 1)[1]).sum())
grads["pooling"] = grad_case(
    {"x": rand((1, 2, 6, 6))}, {"w1": rand((1, 2, 3, 3)), "w2": rand((1, 2, 6, 6))},
    lambda x, w1, w2: (w1 * F.max_pool2d(x, 2, 2)).sum()
    + (w2 * F.avg_pool2d(x, 3, 1, padding=1)).sum())
grads["index_select_gather"] = grad_case(
    {"x": rand((4, 3))},
    {"idx": np.array([3, 1]), "idx2": np.array([[0, 2], [1, 1], [2, 0], [0, 0]]),
     "w1": rand((2, 3)), "w2": rand((4, 2))},
    lambda x, idx, idx2, w1, w2: (w1 * torch.index_select(x, 0, idx)).sum()
    + (w2 * torch.gather(x, 1, idx2)).sum())
grads["conv1d_minimum"] = grad_case(
    {"x": rand((2, 3, 7)), "k": rand((4, 3, 3))}, {"w": rand((2, 4, 4)), "v": rand((2, 3, 7))},
    lambda x, k, w, v: (w * F.conv1d(x, k, stride=2, padding=1)).sum()
    + (v * torch.minimum(x, torch.tensor(0.2))).sum())
grads["select_where"] = grad_case(
    {"x": rand((3, 3))}, {"m": rand((3, 3), 0, 1), "w": rand((3, 3))},
    lambda x, m, w: (w * torch.where(m > 0.5, x, x * x)).sum())

grads["causal_attention"] = grad_case(
    {"q": rand((2, 2, 5, 4)), "k": rand((2, 2, 5, 4)), "v": rand((2, 2, 5, 4))},
    {"w": rand((2, 2, 5, 4))},
    lambda q, k, v, w: (w * F.scaled_dot_product_attention(q, k, v, is_causal=True)).sum())

# ---------------------------------------------------------------- losses

# GELU (tanh) of a product and of a non-contiguous view of it, x over ±6 (autograd builds a
# recognised gelu_tanh's gradient as one expression: checked here against torch). Its own
# generator, so the cases above and below keep their inputs.
_rng_gelu = np.random.default_rng(4321)


def rand_gelu(shape, lo, hi):
    return np.asarray(_rng_gelu.uniform(lo, hi, size=shape), dtype=np.float32).astype(np.float64)


grads["gelu_tanh"] = grad_case(
    {"a": rand_gelu((2, 3, 4), -2, 2), "b": rand_gelu((4, 5), -2, 2)},
    {"w": rand_gelu((2, 3, 5), -1, 1), "v": rand_gelu((5, 3, 2), -1, 1)},
    lambda a, b, w, v: (F.gelu(a @ b, approximate="tanh") * w).sum()
    + (F.gelu((a @ b).permute(2, 1, 0) * 1.5, approximate="tanh") * v).sum())

# LayerNorm with its affine, of a row-major input and of a transposed one (autograd builds
# a recognised layer norm's gradient as one expression: checked here against torch).
grads["layer_norm_affine_views"] = grad_case(
    {"x": rand_gelu((5, 8), -3, 3), "w": rand_gelu((8,), 0.5, 1.5), "b": rand_gelu((8,), -1, 1)},
    {"u": rand_gelu((5, 8), -1, 1), "v": rand_gelu((8, 5), -1, 1)},
    lambda x, w, b, u, v: (F.layer_norm(x, (8,), w, b, eps=1e-5) * u).sum()
    + (F.layer_norm(x.t() * 2.0, (5,), eps=1e-3) * v).sum())

losses = {}


def loss_case(inp, fn, **consts):
    t = torch.tensor(inp, requires_grad=True)
    tc = {k: (torch.tensor(v) if v.dtype.kind == "f" else torch.tensor(v, dtype=torch.long))
          for k, v in consts.items()}
    out = fn(t, **tc)
    out.backward()
    case = {"input": enc(inp), "loss": float(out.detach()), "grad": enc(t.grad.numpy())}
    for k, v in consts.items():
        case[k] = enc(v) if v.dtype.kind == "f" else enc_ids(v)
    return case


pred, target = rand((4, 3), -2, 2), rand((4, 3), -2, 2)
losses["mse"] = loss_case(pred, lambda x, target: F.mse_loss(x, target), target=target)
losses["mse_sum"] = loss_case(pred, lambda x, target: F.mse_loss(x, target, reduction="sum"), target=target)
losses["l1"] = loss_case(pred, lambda x, target: F.l1_loss(x, target), target=target)
losses["huber"] = loss_case(pred, lambda x, target: F.huber_loss(x, target, delta=0.7), target=target)
losses["smooth_l1"] = loss_case(pred, lambda x, target: F.smooth_l1_loss(x, target, beta=0.5), target=target)
logits = rand((5, 4), -3, 3)
labels = np.array([1, 3, 0, 2, 3])
labels_ignored = np.array([1, -100, 0, 2, -100])
losses["cross_entropy"] = loss_case(
    logits, lambda x, labels: F.cross_entropy(x, labels), labels=labels)
losses["cross_entropy_smoothing_ignore"] = loss_case(
    logits, lambda x, labels: F.cross_entropy(x, labels, label_smoothing=0.1, ignore_index=-100),
    labels=labels_ignored)
losses["cross_entropy_sum"] = loss_case(
    logits, lambda x, labels: F.cross_entropy(x, labels, reduction="sum"), labels=labels)
losses["nll"] = loss_case(
    np.log(np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32).astype(np.float64),
    lambda x, labels: F.nll_loss(x, labels), labels=labels)
binary_targets = np.asarray(rng.uniform(0, 1, size=(4, 3)) > 0.5, dtype=np.float64)
binary_targets[0, 0] = 0.3  # soft targets are allowed too
losses["bce_with_logits"] = loss_case(
    rand((4, 3), -4, 4), lambda x, target: F.binary_cross_entropy_with_logits(x, target),
    target=binary_targets)
kl_target = rng.uniform(0, 1, size=(3, 4))
kl_target[1, 2] = 0.0
kl_target = (kl_target / kl_target.sum(1, keepdims=True)).astype(np.float32).astype(np.float64)
kl_input = np.log(rng.dirichlet(np.ones(4), size=3)).astype(np.float32).astype(np.float64)
losses["kl_div"] = loss_case(
    kl_input, lambda x, target: F.kl_div(x, target, reduction="batchmean"), target=kl_target)

# ---------------------------------------------------------------- optimizer trajectories
X, Y = rand((6, 3)), rand((6, 2))
W0, B0 = rand((3, 2)), rand((2,))


class Lion(torch.optim.Optimizer):
    """Algorithm 2 of Chen et al. 2023, written from the paper."""

    def __init__(self, params, lr, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if "m" not in state:
                    state["m"] = torch.zeros_like(p)
                m = state["m"]
                c = b1 * m + (1 - b1) * p.grad
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(c), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def trajectory(make_opt, make_sched=None, clip=None, steps=10):
    w = torch.tensor(W0, requires_grad=True)
    b = torch.tensor(B0, requires_grad=True)
    opt = make_opt([w, b])
    sched = make_sched(opt) if make_sched else None
    out = {"loss": [], "w": [], "b": [], "lr": []}
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(torch.tensor(X) @ w + b, torch.tensor(Y))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([w, b], clip)
        out["lr"].append(opt.param_groups[0]["lr"])
        opt.step()
        if sched:
            sched.step()
        out["loss"].append(float(loss.detach()))
        out["w"].append([float(v) for v in w.detach().numpy().reshape(-1)])
        out["b"].append([float(v) for v in b.detach().numpy().reshape(-1)])
    return out


def scaled_trajectory(init_scale, growth_interval, y_factor, backoff=0.5, steps=10):
    """Adam under torch.amp.GradScaler (CPU, f32 model): skipped steps on overflow, scale
    backoff and growth."""
    w = torch.tensor(W0, dtype=torch.float32, requires_grad=True)
    b = torch.tensor(B0, dtype=torch.float32, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval,
                                  backoff_factor=backoff)
    out = {"loss": [], "w": [], "b": [], "scale": [], "init_scale": init_scale,
           "growth_interval": growth_interval, "y_factor": y_factor, "backoff": backoff}
    x, y = torch.tensor(X, dtype=torch.float32), torch.tensor(Y * y_factor, dtype=torch.float32)
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(x @ w + b, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        out["loss"].append(float(loss.detach()))
        out["w"].append([float(v) for v in w.detach().numpy().reshape(-1)])
        out["b"].append([float(v) for v in b.detach().numpy().reshape(-1)])
        out["scale"].append(float(scaler.get_scale()))
    return out


S = torch.optim.lr_scheduler
optim = {
    "sgd": trajectory(lambda p: torch.optim.SGD(p, lr=0.1)),
    "sgd_momentum": trajectory(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "sgd_nesterov_wd": trajectory(
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "adam": trajectory(lambda p: torch.optim.Adam(p, lr=0.05)),
    "adam_l2": trajectory(lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.1)),
    "adamw": trajectory(lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1)),
    "rmsprop": trajectory(lambda p: torch.optim.RMSprop(p, lr=0.01)),
    "rmsprop_momentum_wd": trajectory(
        lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9, weight_decay=0.01)),
    "lion": trajectory(lambda p: Lion(p, lr=0.01, weight_decay=0.1)),
    "adam_clip": trajectory(lambda p: torch.optim.Adam(p, lr=0.05), clip=0.5),
    "sgd_step_lr": trajectory(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                              lambda o: S.StepLR(o, step_size=3, gamma=0.5)),
    "adam_cosine": trajectory(lambda p: torch.optim.Adam(p, lr=0.05),
                              lambda o: S.CosineAnnealingLR(o, T_max=8, eta_min=0.001)),
    "adamw_warmup_cosine": trajectory(
        lambda p: torch.optim.AdamW(p, lr=0.05),
        lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=3),
                                     S.CosineAnnealingLR(o, T_max=7, eta_min=0.0)], milestones=[3])),
    "sgd_one_cycle": trajectory(lambda p: torch.optim.SGD(p, lr=0.1),
                                lambda o: S.OneCycleLR(o, max_lr=0.2, total_steps=10,
                                                       cycle_momentum=False)),
}
problem = {"x": enc(X), "y": enc(Y), "w": enc(W0), "b": enc(B0)}

# ---------------------------------------------------------------- batch norm (train mode)
def batchnorm_case():
    xs = [rand((4, 3, 2, 2), -2, 2) for _ in range(3)]
    w = rand((4, 3, 2, 2))
    W, B = rand((3,)), rand((3,))
    bn = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(W))
        bn.bias.copy_(torch.tensor(B))
    opt = torch.optim.SGD(bn.parameters(), lr=0.1)
    out = {"x": [enc(x) for x in xs], "w": enc(w), "weight": enc(W), "bias": enc(B),
           "loss": [], "weight_after": [], "bias_after": [], "running_mean": [], "running_var": []}
    for i, x in enumerate(xs):
        opt.zero_grad()
        xt = torch.tensor(x, requires_grad=True)
        loss = (torch.tensor(w) * bn(xt)).sum()
        loss.backward()
        if i == 0:
            out["grad_x"] = enc(xt.grad.numpy())
        opt.step()
        out["loss"].append(float(loss.detach()))
        out["weight_after"].append([float(v) for v in bn.weight.detach().numpy()])
        out["bias_after"].append([float(v) for v in bn.bias.detach().numpy()])
        out["running_mean"].append([float(v) for v in bn.running_mean.numpy()])
        out["running_var"].append([float(v) for v in bn.running_var.numpy()])
    bn.eval()
    xe = rand((2, 3, 2, 2), -2, 2)
    out["x_eval"] = enc(xe)
    out["y_eval"] = enc(bn(torch.tensor(xe)).detach().numpy())
    return out


batchnorm = batchnorm_case()

# ---------------------------------------------------------------- schedules alone
def lrs(make_sched, base=0.1, n=30):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched = make_sched(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


schedules = {
    "step": lrs(lambda o: S.StepLR(o, step_size=4, gamma=0.3)),
    "cosine": lrs(lambda o: S.CosineAnnealingLR(o, T_max=20, eta_min=0.005)),
    "warmup_cosine": lrs(lambda o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.2, end_factor=1.0, total_iters=5),
            S.CosineAnnealingLR(o, T_max=25, eta_min=0.01)], milestones=[5])),
    "one_cycle": lrs(lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=30, cycle_momentum=False)),
}

os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump({"torch": torch.__version__, "grads": grads, "losses": losses, "optim": optim,
               "optim_problem": problem, "schedules": schedules,
               "batchnorm": batchnorm,
               # The overflow case is far from the threshold (2^124 overflows in any order of operations,
               # 2^108 in none): where exactly a product overflows depends on the order in which a
               # backward pass multiplies (PyTorch's mse backward scales before dividing by N).
               "loss_scale": {"overflow": scaled_trajectory(2.0 ** 124, 3, 1000.0, backoff=2.0 ** -16),
                              "growth": scaled_trajectory(2.0 ** 10, 2, 1.0)}}, f, indent=None)
    f.write("\n")
print("wrote", OUT)
