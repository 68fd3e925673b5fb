#!/usr/bin/env bash
# Issue 11 (long context): luminal vs llama-bench on one GGUF, alternating the two in the
# same run: decode at depths (tg64 @ d0, d2048, d4096), prefill (pp512, pp2048), and the
# peak resident set (GNU time's %M) of a 4096-token prefill. Prints markdown on stdout.
#
# Environment (defaults in brackets):
#   MODEL        GGUF file [models/SmolLM2-135M-Instruct.Q4_1.gguf]
#   LLAMA_BENCH  llama-bench binary [$HOME/.cache/luminal-bench/build-0.3.36-native/bin/llama-bench,
#                or build-0.3.36-native-noamx on hosts with AMX] (scripts/bench-vs-llamacpp.sh
#                --build-only builds it)
#   LUMINAL_BIN  our binary [target/release/luminal, built when missing]
#   THREADS      threads for both [2]
#   REPS         repetitions per test (-r) [3]
#   DEPTHS       decode depths ["0 2048 4096"]
#   PROMPTS      prefill lengths ["512 2048"]
#   RSS_PROMPT   prompt length of the peak-RSS run [4096]
#   CACHE_TYPE   KV-cache type of both sides [f16]; e.g. q8_0 (llama.cpp then gets
#                -ctk/-ctv q8_0 -fa on: its quantized V cache needs flash attention)
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd -- "$SCRIPT_DIR/.." && pwd)"
cd "$REPO"
MODEL="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
VARIANT=native
grep -q -w amx_tile /proc/cpuinfo 2>/dev/null && VARIANT=native-noamx
LLAMA_BENCH="${LLAMA_BENCH:-$HOME/.cache/luminal-bench/build-0.3.36-$VARIANT/bin/llama-bench}"
LUMINAL_BIN="${LUMINAL_BIN:-target/release/luminal}"
THREADS="${THREADS:-2}"; REPS="${REPS:-3}"
DEPTHS="${DEPTHS:-0 2048 4096}"; PROMPTS="${PROMPTS:-512 2048}"; RSS_PROMPT="${RSS_PROMPT:-4096}"
CACHE_TYPE="${CACHE_TYPE:-f16}"
THEIR_CACHE=(); OUR_CACHE=()
if [ "$CACHE_TYPE" != f16 ]; then
    THEIR_CACHE=(-ctk "$CACHE_TYPE" -ctv "$CACHE_TYPE" -fa on)
    OUR_CACHE=(--cache-type "$CACHE_TYPE")
fi
[ -x "$LUMINAL_BIN" ] || cargo build --release -p luminal_cli >&2
[ -x "$LLAMA_BENCH" ] || { echo "no llama-bench at $LLAMA_BENCH" >&2; exit 1; }

# Mean t/s of a llama-bench / luminal bench JSON array with one record.
tps() { python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.2f" % r[0]["avg_ts"])'; }

echo "Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); KV cache $CACHE_TYPE"
echo
echo "| test | llama.cpp t/s | luminal t/s | ratio |"
echo "|---|---:|---:|---:|"
row() { # name, then the shared flags
    local name="$1"; shift
    local ours theirs
    theirs=$("$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -r "$REPS" -o json "${THEIR_CACHE[@]}" "$@" 2>/dev/null | tps)
    ours=$("$LUMINAL_BIN" bench -m "$MODEL" -t "$THREADS" -r "$REPS" -o json "${OUR_CACHE[@]}" "$@" 2>/dev/null | tps)
    echo "| $name | $theirs | $ours | $(python3 -c "print('%.2f' % ($ours / $theirs))") |"
}
for d in $DEPTHS; do row "tg64 @ d$d" -p 0 -n 64 -d "$d"; done
for p in $PROMPTS; do row "pp$p" -p "$p" -n 0; done
echo
peak() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }
theirs=$(peak "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -r 1 "${THEIR_CACHE[@]}" -p "$RSS_PROMPT" -n 0)
ours=$(peak "$LUMINAL_BIN" bench -m "$MODEL" -t "$THREADS" -r 1 "${OUR_CACHE[@]}" -p "$RSS_PROMPT" -n 0)
echo "Peak RSS of pp$RSS_PROMPT (-r 1): llama.cpp $((theirs / 1024)) MiB, luminal $((ours / 1024)) MiB, ratio $(python3 -c "print('%.2f' % ($ours / $theirs))")"
