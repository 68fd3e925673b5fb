#!/usr/bin/env python3
"""PyTorch rows for luminal_cuda's `ops_gbps` example (issue 14's bench list).

    python3 scripts/torch_ops_bench.py [ROWS] [COLS] [REPS]     (default 4096 8192 50)

f32 on cuda:0, the same ops, shapes and formula as `ops_gbps`:
- silu_mul: silu(x) * y        (reads x, y; writes the result)
- softmax:  softmax(x, -1)
- rms_norm: x * rsqrt(mean(x^2, -1) + 1e-5) * w
- d2d_copy: y.copy_(x)         (reads and writes the bytes of x)
each in eager mode and through torch.compile (default mode). Every rep is timed with CUDA
events around one call (3 warm-ups first; torch.compile's compile happens there);
GB/s = (input bytes + output bytes) / best time. One line per row:
    op | ROWSxCOLS | runner | best ms | mean ms | GB/s
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"torch_ops_bench needs torch: {e}", file=sys.stderr)
    sys.exit(2)


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return min(times), sum(times) / len(times)


def row(op, rows, cols, runner, t, nbytes):
    best, mean = t
    print(
        f"{op} | {rows}x{cols} | {runner} | {best * 1e3:.4f} | {mean * 1e3:.4f} | "
        f"{nbytes / best / 1e9:.1f}",
        flush=True,
    )


def silu_mul(x, y):
    return F.silu(x) * y


def softmax(x):
    return torch.softmax(x, dim=-1)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def main():
    args = [int(a) for a in sys.argv[1:]]
    rows = args[0] if len(args) > 0 else 4096
    cols = args[1] if len(args) > 1 else 8192
    reps = args[2] if len(args) > 2 else 50
    if not torch.cuda.is_available():
        print("torch_ops_bench needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.rand(rows, cols, device=dev, generator=g) - 0.5) * 8
    y = (torch.rand(rows, cols, device=dev, generator=g) - 0.5) * 8
    w = (torch.rand(cols, device=dev, generator=g) - 0.5) * 8
    n = rows * cols
    print(
        f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, f32, {reps} reps; "
        "op | shape | runner | best ms | mean ms | GB/s (at best)"
    )
    cases = [
        ("silu_mul", silu_mul, (x, y), 3 * n * 4),
        ("softmax", softmax, (x,), 2 * n * 4),
        ("rms_norm", rms_norm, (x, w), (2 * n + cols) * 4),
    ]
    with torch.no_grad():
        for op, fn, inputs, nbytes in cases:
            row(op, rows, cols, "torch eager", timed(lambda: fn(*inputs), reps), nbytes)
            try:
                compiled = torch.compile(fn)
                row(
                    op,
                    rows,
                    cols,
                    "torch.compile",
                    timed(lambda: compiled(*inputs), reps),
                    nbytes,
                )
            except Exception as e:  # no triton / compiler on the machine
                print(f"{op} | {rows}x{cols} | torch.compile | failed: {type(e).__name__}: {e}")
        out = torch.empty_like(x)
        row("d2d_copy", rows, cols, "torch copy_", timed(lambda: out.copy_(x), reps), 2 * n * 4)


if __name__ == "__main__":
    main()
