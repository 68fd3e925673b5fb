#!/usr/bin/env bash
# Time to first token, whole process: luminal's `generate -n 1` against llama.cpp's
# `llama-completion -n 1` on the same GGUF files, alternating, wall time and peak RSS from
# /usr/bin/time. Prints a markdown table (every round, then the medians) on stdout.
#
# Usage: scripts/bench-ttft.sh [FILE.gguf ...]
#   (default: models/SmolLM2-135M-Instruct.{Q4_0,Q8_0}.gguf, models/llama1b-shape.{Q4_0,Q4_K_M}.gguf)
#
# Environment (defaults in brackets):
#   LLAMA_COMPLETION  llama.cpp's llama-completion binary [the native build of
#                     scripts/bench-vs-llamacpp.sh: $LUMINAL_BENCH_CACHE/build-0.3.36-native-noamx/bin;
#                     build it there with `cmake --build DIR --target llama-completion`]
#   LUMINAL_BIN       our binary [target/release/luminal, built here when unset]
#   ROUNDS            alternating rounds per file [3]
#   THREADS           threads for both [2]
#   PROMPT            the prompt [Hello]
# Needs /usr/bin/time (apt-get install time).
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
cd "$SCRIPT_DIR/.."
CACHE="${LUMINAL_BENCH_CACHE:-$HOME/.cache/luminal-bench}"
LLAMA="${LLAMA_COMPLETION:-$CACHE/build-0.3.36-native-noamx/bin/llama-completion}"
ROUNDS="${ROUNDS:-3}"; THREADS="${THREADS:-2}"; PROMPT="${PROMPT:-Hello}"
if [ -z "${LUMINAL_BIN:-}" ]; then
    cargo build --release -p luminal_cli >&2
    LUMINAL_BIN=target/release/luminal
fi
[ -x "$LLAMA" ] || { echo "no llama-completion at $LLAMA (set LLAMA_COMPLETION)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
if [ $# -eq 0 ]; then
    set -- models/SmolLM2-135M-Instruct.Q4_0.gguf models/SmolLM2-135M-Instruct.Q8_0.gguf \
        models/llama1b-shape.Q4_0.gguf models/llama1b-shape.Q4_K_M.gguf
fi
# Prints "wall_seconds peak_rss_kib" of one command (its output discarded).
TIMES="$(mktemp)"; trap 'rm -f "$TIMES"' EXIT
measure() {
    /usr/bin/time -o "$TIMES" -f "%e %M" "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }
    tail -1 "$TIMES"
}
median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "| file | llama.cpp s (each round) | luminal s (each round) | median llama.cpp / luminal | peak RSS MiB llama.cpp / luminal |"
echo "|---|---|---|---|---|"
for f in "$@"; do
    [ -f "$f" ] || { echo "missing $f" >&2; continue; }
    ls_t=(); lu_t=(); ls_m=0; lu_m=0
    for r in $(seq "$ROUNDS"); do
        read -r t m < <(measure "$LLAMA" -m "$f" -p "$PROMPT" -n 1 -t "$THREADS" -no-cnv --temp 0)
        ls_t+=("$t"); ls_m=$m
        read -r t m < <(measure "$LUMINAL_BIN" generate -m "$f" --prompt "$PROMPT" -n 1 -t "$THREADS")
        lu_t+=("$t"); lu_m=$m
        echo "$(basename "$f") round $r: llama.cpp ${ls_t[-1]} s, luminal ${lu_t[-1]} s" >&2
    done
    echo "| $(basename "$f") | ${ls_t[*]} | ${lu_t[*]} | $(echo "${ls_t[*]}" | median) / $(echo "${lu_t[*]}" | median) | $((ls_m / 1024)) / $((lu_m / 1024)) |"
done
