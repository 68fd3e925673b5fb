"""Baseline for `luminal bench`: prefill (pp128) and decode (tg64) tok/s of llama.cpp through
llama-cpp-python on the same GGUF, same shape of test (empty cache each repetition).

Usage: python3 scripts/bench_llama_cpp.py THREADS [MODEL]
Needs: pip install llama-cpp-python (builds llama.cpp; ~5-60 min on 2 cores).
"""
import statistics
import sys
import time

import llama_cpp

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
model = sys.argv[2] if len(sys.argv) > 2 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
m = llama_cpp.Llama(model, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512, verbose=False)
toks = [100 + 7 * i for i in range(128)]
pp, tg = [], []
for r in range(4):
    m.reset()
    t = time.perf_counter()
    m.eval(toks)
    pp.append(128 / (time.perf_counter() - t))
    m.reset()
    t = time.perf_counter()
    for i in range(64):
        m.eval([toks[i]])
    tg.append(64 / (time.perf_counter() - t))
pp, tg = pp[1:], tg[1:]  # the first repetition is a warm-up
print(
    "llama.cpp (llama-cpp-python %s) threads %d: pp128 %.1f ± %.1f, tg64 %.1f ± %.1f tok/s"
    % (llama_cpp.__version__, threads, statistics.mean(pp), statistics.stdev(pp), statistics.mean(tg), statistics.stdev(tg))
)
