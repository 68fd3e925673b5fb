"""PyTorch baselines for the CUDA section of benches/README.md (issue 14).

`matmul`: f32 [N, N]·[N, N] with torch.matmul, TF32 off (and, for information, on): best and
mean TFLOP/s of REPS timed products after 3 warm-ups.

`llama GGUF`: transformers eager (attn_implementation="eager", f32, TF32 off) on the weights
of a Llama-family GGUF (loaded with `from_pretrained(dir, gguf_file=...)`, dequantized to
f32), measured as `luminal bench` does: ppN = one forward of N tokens from an empty cache,
tgN = N one-token decode steps with the KV cache from an empty cache; one warm-up, then
REPS timed runs; tokens/s mean ± sample std.

Usage: python3 scripts/torch_llama_bench.py matmul [--n 4096] [--reps 20]
       python3 scripts/torch_llama_bench.py llama MODEL.gguf [--pp 128 512] [--tg 128] [--reps 3]
Needs: torch with CUDA; for `llama` transformers and gguf.
"""
import argparse
import os
import statistics
import time

import torch


def sync():
    torch.cuda.synchronize()


def matmul(args):
    dev = torch.device("cuda")
    n = args.n
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.rand((n, n), device=dev, generator=g, dtype=torch.float32) - 0.5
    b = torch.rand((n, n), device=dev, generator=g, dtype=torch.float32) - 0.5
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        for _ in range(3):
            torch.matmul(a, b)
        sync()
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            torch.matmul(a, b)
            sync()
            times.append(time.perf_counter() - t)
        flop = 2.0 * n**3
        best, mean = min(times), statistics.mean(times)
        print(
            f"torch.matmul f32 [{n}, {n}]x[{n}, {n}] TF32 {'on' if tf32 else 'off'}: "
            f"best {best * 1e3:.3f} ms ({flop / best / 1e12:.2f} TFLOP/s), "
            f"mean of {args.reps} {mean * 1e3:.3f} ms ({flop / mean / 1e12:.2f} TFLOP/s)",
            flush=True,
        )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def llama(args):
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    path = os.path.abspath(args.model)
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path),
        gguf_file=os.path.basename(path),
        dtype=torch.float32,
        attn_implementation="eager",
    )
    model = model.to(dev).eval()
    print(
        f"transformers eager f32: {os.path.basename(path)} loaded in {time.perf_counter() - t:.1f} s, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters",
        flush=True,
    )
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, max(args.pp + [args.tg])), generator=g).to(dev)

    def pp(n):
        return lambda: model(ids[:, :n], use_cache=True)

    def tg():
        past = None
        for i in range(args.tg):
            out = model(ids[:, i : i + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values

    with torch.inference_mode():
        tests = [("pp", n, pp(n)) for n in args.pp] + [("tg", args.tg, tg)]
        for name, n, f in tests:
            if n == 0:
                continue
            f()
            sync()
            rates = []
            for _ in range(args.reps):
                t = time.perf_counter()
                f()
                sync()
                rates.append(n / (time.perf_counter() - t))
            std = statistics.stdev(rates) if len(rates) > 1 else 0.0
            print(
                f"transformers eager f32 {name}{n}: {statistics.mean(rates):.2f} ± {std:.2f} t/s",
                flush=True,
            )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matmul")
    m.add_argument("--n", type=int, default=4096)
    m.add_argument("--reps", type=int, default=20)
    lm = sub.add_parser("llama")
    lm.add_argument("model")
    lm.add_argument("--pp", type=int, nargs="+", default=[512])
    lm.add_argument("--tg", type=int, default=128)
    lm.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    {"matmul": matmul, "llama": llama}[args.cmd](args)


if __name__ == "__main__":
    main()
