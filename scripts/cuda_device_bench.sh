#!/bin/bash
# Device run for benches/README.md's CUDA section: CLI --device cuda checks, luminal bench on
# the tiny fixtures and on a random-weight SmolLM2-135M-shaped GGUF made here, transformers
# eager on the same file, f32 4096^3 matmul luminal (cuBLAS) vs torch.matmul.
#
# The device machine has no Rust and no network. Prepare .gpu/bench/ (git-ignored) here:
#   cargo build --release -p luminal_cli
#   cargo build --release -p luminal_cuda --example matmul_tflops
#   cargo test --release -p luminal_cli --test cuda_device --no-run   # prints the binary's path
#   mkdir -p .gpu/bench; cp target/release/luminal target/release/examples/matmul_tflops .gpu/bench/
#   cp target/release/deps/cuda_device-<hash> .gpu/bench/cuda_device; strip .gpu/bench/*
#   python3 -m pip download --no-deps --only-binary=:all: -d .gpu/bench gguf==0.19.0
#   python3 scripts/make_llama1b_gguf.py .gpu/bench/smollm2-tokenizer.gguf \
#       --ref models/SmolLM2-135M-Instruct.Q8_0.gguf --tokenizer-only
#   pwd > .gpu/bench/build_root    # the checkout the binaries were built in
# then run `bash scripts/cuda_device_bench.sh` there (`... fusion`: the fusion run, see below) with .gpu/bench carried (run once from
# the repository root; $OUT is where logs go). The test binary finds the luminal binary and
# the fixtures under the build machine's checkout path (compiled in; read from
# .gpu/bench/build_root or $BUILD_ROOT), which is linked to this checkout below.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
B=.gpu/bench
# Scratch (the Python package, the generated GGUF) and logs: a private temporary folder
# unless the device tool's $OUT is set.
WORK=$(mktemp -d)
OUT=${OUT:-$WORK}
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
BUILD_ROOT=${BUILD_ROOT:-$(cat $B/build_root)}
[ -n "$BUILD_ROOT" ] || { echo "no build_root: see the header" >&2; exit 1; }
mkdir -p "$(dirname "$BUILD_ROOT")"; [ -e "$BUILD_ROOT" ] || ln -s "$PWD" "$BUILD_ROOT"
cd "$BUILD_ROOT"
mkdir -p target/release && cp $B/luminal target/release/luminal
L=target/release/luminal
step() { echo; echo "=== $*"; s=$(date +%s%N); }
took() { echo "--- rc=$1 $(( ($(date +%s%N) - s) / 1000000 )) ms"; }
smol() {
  step "gguf install + make SmolLM2-shaped GGUF"
  python3 -c "import gguf" 2>/dev/null && echo "gguf already there" || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" $B/gguf-*.whl && export PYTHONPATH="$WORK/site"; }
  S="$WORK/smollm2-shape.F16.gguf"
  timeout 60 python3 scripts/make_llama1b_gguf.py "$S" --ref $B/smollm2-tokenizer.gguf --shape smollm2 2>&1; took $?
}
if [ "$1" = fusion ]; then
  # Elementwise fusion (on by default; LUMINAL_CUDA_FUSION=0 gives one kernel per node,
  # =broadcast fuses through broadcasts too):
  # the luminal_cuda test binaries (release, stripped) from `cargo test --release -p
  # luminal_cuda --no-run`, copied to .gpu/ as op_suite, llama, emulator_fusion,
  # emulator_quant, emulator_matmul; then the SmolLM2-shaped decode/prefill bench with
  # fusion on and off, and each plan's launches per run (LUMINAL_CUDA_STATS=1).
  for t in emulator_fusion:gpu llama:gpu op_suite: emulator_quant:gpu emulator_matmul:gpu; do
    b=${t%%:*}; f=${t#*:}
    [ -x .gpu/$b ] || continue
    step ".gpu/$b $f"
    timeout 100 .gpu/$b $f --nocapture --test-threads 1 > $OUT/$b.log 2>&1; r=$?
    grep -E "^test |test result|positions|skipping|panicked|error|decode step|gpu" $OUT/$b.log | head -40; took $r
  done
  smol
  for fu in 1 0 broadcast; do
    step "LUMINAL_CUDA_FUSION=$fu luminal bench -m $S --device cuda -p 128,512 -n 128 -r 3"
    LUMINAL_CUDA_FUSION=$fu timeout 100 $L bench -m $S --device cuda -p 128,512 -n 128 -r 3 2>&1; took $?
    step "LUMINAL_CUDA_FUSION=$fu LUMINAL_CUDA_STATS=1 luminal generate -n 8 (launches per run)"
    LUMINAL_CUDA_FUSION=$fu LUMINAL_CUDA_STATS=1 timeout 60 $L generate -m $S --device cuda --prompt "Once upon a time" -n 8 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | head; took ${PIPESTATUS[0]}
  done
  exit 0
fi
step "cuda_device test"
timeout 90 $B/cuda_device --nocapture --test-threads 1 2>&1 | grep -vE "^\s*$"; took ${PIPESTATUS[0]}
F=crates/luminal_model_tests/tests/fixtures
for m in tiny-llama.gguf tiny-llama.q8_0.gguf tiny-qwen2.gguf; do
  for d in cuda cpu; do
    step "luminal bench -m $F/$m --device $d -p 16,128 -n 64 -r 5"
    timeout 60 $L bench -m $F/$m --device $d -p 16,128 -n 64 -r 5 2>&1; took $?
  done
done
smol
step "luminal bench -m $S --device cuda -p 128,512 -n 128 -r 3"
timeout 150 $L bench -m $S --device cuda -p 128,512 -n 128 -r 3 2>&1; took $?
step "luminal generate on cuda (random weights; timing line)"
timeout 60 $L generate -m $S --device cuda --prompt "Once upon a time" -n 64 --no-echo 2>&1 | tail -2; took ${PIPESTATUS[0]}
step "transformers eager f32 on the same GGUF"
timeout 150 python3 scripts/torch_llama_bench.py llama $S --pp 128 512 --tg 128 --reps 3 > $OUT/torch_llama.log 2>&1; r=$?
grep -E "^torch |^transformers|Error|error" $OUT/torch_llama.log | tail -12; took $r
step "luminal bench -m $S --device cpu -t 16 -p 512 -n 128 -r 3"
timeout 60 $L bench -m $S --device cpu -t 16 -p 512 -n 128 -r 3 2>&1; took $?
step "matmul f32 4096^3"
timeout 60 $B/matmul_tflops 4096 4096 4096 20 2>&1; took $?
timeout 60 python3 scripts/torch_llama_bench.py matmul --n 4096 --reps 20 2>&1; took $?
