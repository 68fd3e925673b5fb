#!/usr/bin/env bash
# llama.cpp's `llama-perplexity` on the tiny f32 GGUF fixture and the perplexity text fixture:
# the reference for `luminal perplexity --protocol llama-cpp` (luminal_model_tests,
# tests/generate.rs). Needs the llama.cpp build that scripts/bench-vs-llamacpp.sh makes
# (run it with --build-only first); LLAMA_BIN overrides where llama-perplexity is.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LUMINAL_BENCH_CACHE:-$HOME/.cache/luminal-bench}"
LLAMA_BIN="${LLAMA_BIN:-$(ls -d "$CACHE"/build-*-native/bin | head -1)}"
FX=crates/luminal_model_tests/tests/fixtures
CTX=32
log="$(mktemp)"
"$LLAMA_BIN/llama-perplexity" -m "$FX/tiny-llama.gguf" -f "$FX/ppl.txt" -c "$CTX" -b "$CTX" -t 1 \
    >"$log" 2>&1
ppl="$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$log")"
chunks="$(grep -o '\[[0-9]*\][0-9.]*' "$log" | tail -1 | sed 's/\[\([0-9]*\)\].*/\1/')"
commit="$(sed -n 's/.*build: [0-9]* (\([0-9a-f]*\)).*/\1/p' "$log" | head -1)"
cat >"$FX/tiny-llama.llama-perplexity.json" <<JSON
{
  "model": "tiny-llama.gguf",
  "text": "ppl.txt",
  "ctx": $CTX,
  "chunks": $chunks,
  "ppl": $ppl,
  "command": "llama-perplexity -m tiny-llama.gguf -f ppl.txt -c $CTX -b $CTX -t 1",
  "llama_cpp_commit": "${commit:-unknown}"
}
JSON
cat "$FX/tiny-llama.llama-perplexity.json"
rm -f "$log"
