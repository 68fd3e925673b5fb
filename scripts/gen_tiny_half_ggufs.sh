#!/bin/bash
# tiny-llama.f16.gguf and tiny-llama.bf16.gguf: tiny-llama.gguf (llama.cpp's own f32
# conversion, scripts/gen_tiny_gguf_fixtures.py) with its 2-D weights converted by llama.cpp's
# `llama-quantize` to F16 / BF16 (norms stay f32). Used by the CUDA backend's model test
# (crates/luminal_cuda/tests/llama.rs: half weights read in place by cuBLAS) against the CPU
# backend on the same file. llama-quantize comes with any llama.cpp build, e.g. the one
# scripts/bench-vs-llamacpp.sh makes from the llama-cpp-python sdist:
#   bash scripts/gen_tiny_half_ggufs.sh path/to/llama-quantize
set -euo pipefail
Q=${1:?usage: gen_tiny_half_ggufs.sh path/to/llama-quantize}
F=crates/luminal_model_tests/tests/fixtures
"$Q" "$F/tiny-llama.gguf" "$F/tiny-llama.f16.gguf" F16
"$Q" "$F/tiny-llama.gguf" "$F/tiny-llama.bf16.gguf" BF16
