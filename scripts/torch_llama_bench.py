"""PyTorch baselines for the CUDA section of benches/README.md (issue 14).

`matmul`: [N, N]·[N, N] with torch.matmul in each of `--dtypes` (f32 with TF32 off, tf32 = f32
with TF32 on, f16, bf16): best and mean TFLOP/s of REPS timed products after 3 warm-ups,
each timed like luminal's `matmul_tflops` (one product, then torch.cuda.synchronize), and, for
information, REPS back-to-back products timed with CUDA events (no host sync between).

`llama GGUF`: transformers eager (attn_implementation="eager", `--dtype` f32 (TF32 off), f16 or
bf16) on the weights of a Llama-family GGUF (loaded with `from_pretrained(dir, gguf_file=...)`,
dequantized to that type), or, with `--shape llama1b|smollm2` instead of a file, a randomly
initialised model of that shape (the GGUF of scripts/make_llama1b_gguf.py; weight values do
not change the time); `--compile` wraps the forward in torch.compile (dynamic shapes);
`--static` (the setting transformers documents for a compiled decode) runs the decode steps
through a StaticCache with SDPA attention and `torch.compile(mode="reduce-overhead",
fullgraph=True)` (CUDA graphs; the cache reset in place between runs, so the graphs are
recorded once, in the warm-up);
measured as `luminal bench` does: ppN = one forward of N tokens from an empty cache,
tgN = N one-token decode steps with the KV cache from an empty cache; one warm-up, then
REPS timed runs; tokens/s mean ± sample std.

Usage: python3 scripts/torch_llama_bench.py matmul [--n 4096] [--reps 20] [--dtypes f32 tf32 f16 bf16]
       python3 scripts/torch_llama_bench.py llama MODEL.gguf [--pp 128 512] [--tg 128] [--reps 3] [--dtype bf16] [--compile] [--static]
       python3 scripts/torch_llama_bench.py llama --shape llama1b [--dtype bf16] ...
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
    types = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    for kind in args.dtypes:
        dt = types[kind]
        a = (torch.rand((n, n), device=dev, generator=g, dtype=torch.float32) - 0.5).to(dt)
        b = (torch.rand((n, n), device=dev, generator=g, dtype=torch.float32) - 0.5).to(dt)
        tf32 = kind == "tf32"
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
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.reps):
            torch.matmul(a, b)
        end.record()
        sync()
        ev = start.elapsed_time(end) / 1e3 / args.reps
        flop = 2.0 * n**3
        best, mean = min(times), statistics.mean(times)
        print(
            f"torch.matmul {kind} [{n}, {n}]x[{n}, {n}]: "
            f"best {best * 1e3:.3f} ms ({flop / best / 1e12:.2f} TFLOP/s), "
            f"mean of {args.reps} {mean * 1e3:.3f} ms ({flop / mean / 1e12:.2f} TFLOP/s); "
            f"back-to-back (CUDA events) {ev * 1e3:.3f} ms ({flop / ev / 1e12:.2f} TFLOP/s)",
            flush=True,
        )
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


SHAPES = {
    # hidden, layers, heads, KV heads, FFN, RoPE base (scripts/make_llama1b_gguf.py)
    "llama1b": (2048, 16, 32, 8, 8192, 500000.0),
    "smollm2": (576, 30, 9, 3, 1536, 100000.0),
}


def llama(args):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    t = time.perf_counter()
    if args.shape:
        h, layers, heads, kv, ffn, theta = SHAPES[args.shape]
        config = LlamaConfig(
            vocab_size=49152, hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv, rope_theta=theta,
            rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192,
        )
        config._attn_implementation = "sdpa" if args.static else "eager"
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(dt)
        name = f"random {args.shape}-shaped"
    else:
        path = os.path.abspath(args.model)
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path),
            gguf_file=os.path.basename(path),
            dtype=dt,
            attn_implementation="sdpa" if args.static else "eager",
        )
        name = os.path.basename(path)
    model = model.to(dev).eval()
    label = f"transformers {'torch.compile' if args.compile else 'eager'} {args.dtype}"
    if args.static:
        label = f"transformers torch.compile static cache reduce-overhead sdpa {args.dtype}"
    print(
        f"{label}: {name} loaded in {time.perf_counter() - t:.1f} s, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters",
        flush=True,
    )
    if args.compile and not args.static:
        model.forward = torch.compile(model.forward, dynamic=True)
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

    if args.static:
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=args.tg + 8)
        fwd = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

        def tg():  # noqa: F811
            cache.reset()
            for i in range(args.tg):
                pos = torch.tensor([i], device=dev)
                fwd(
                    ids[:, i : i + 1],
                    past_key_values=cache,
                    cache_position=pos,
                    position_ids=pos.unsqueeze(0),
                    use_cache=True,
                )

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
                f"{label} {name}{n}: {statistics.mean(rates):.2f} ± {std:.2f} t/s",
                flush=True,
            )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matmul")
    m.add_argument("--n", type=int, default=4096)
    m.add_argument("--reps", type=int, default=20)
    m.add_argument("--dtypes", nargs="+", default=["f32", "tf32"], choices=["f32", "tf32", "f16", "bf16"])
    lm = sub.add_parser("llama")
    lm.add_argument("model", nargs="?")
    lm.add_argument("--shape", choices=sorted(SHAPES))
    lm.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    lm.add_argument("--compile", action="store_true")
    lm.add_argument("--static", action="store_true")
    lm.add_argument("--pp", type=int, nargs="+", default=[512])
    lm.add_argument("--tg", type=int, default=128)
    lm.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    {"matmul": matmul, "llama": llama}[args.cmd](args)


if __name__ == "__main__":
    main()
