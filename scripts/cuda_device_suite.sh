#!/bin/bash
# One device run for issue 14 (benches/README.md, "CUDA backend"): the luminal_cuda GPU tests,
# then one table of luminal vs PyTorch measured in the same run on the same GPU:
#   matmul f32/tf32/f16/bf16 at 4096^3 and 8192^3 vs torch.matmul;
#   fused elementwise, softmax, rms_norm GB/s vs torch eager / torch.compile and a d2d copy;
#   causal attention at seq 1024-8192 vs scaled_dot_product_attention;
#   decode/prefill of SmolLM2-135M-shaped and Llama-3.2-1B-shaped random F16 GGUFs vs
#   transformers eager (f16/bf16).
#
# The device machine has no Rust and no network. Prepare .gpu/ (git-ignored) here:
#   cargo test -p luminal_cuda --release --no-run       # lists the test binaries
#   cargo build --release -p luminal_cli
#   cargo build --release -p luminal_cuda --examples
#   bash scripts/cuda_device_suite.sh --prepare         # copies + strips them into .gpu/
# then run `bash scripts/cuda_device_suite.sh [tests|bench|all]` there with .gpu carried.
# Logs go to $OUT (the device tool's output folder) or a temporary folder.
set -u
if [ "${1:-}" = --prepare ]; then
  mkdir -p .gpu/bench
  for t in op_suite llama emulator_matmul emulator_fusion emulator_quant emulator_attention emulator_reduce; do
    f=$(ls -t target/release/deps/$t-* 2>/dev/null | grep -v '\.d$' | head -1)
    [ -n "$f" ] && cp "$f" .gpu/$t && strip .gpu/$t
  done
  cp target/release/luminal .gpu/bench/luminal && strip .gpu/bench/luminal
  for e in matmul_tflops ops_gbps attention_bench; do
    [ -x target/release/examples/$e ] && cp target/release/examples/$e .gpu/bench/ && strip .gpu/bench/$e
  done
  pwd > .gpu/bench/build_root
  ls -la .gpu .gpu/bench
  exit 0
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
OUT=${OUT:-$WORK}
WHAT=${1:-all}
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
# The test binaries find the fixtures under the build machine's checkout path.
BUILD_ROOT=${BUILD_ROOT:-$(cat .gpu/bench/build_root)}
mkdir -p "$(dirname "$BUILD_ROOT")"; [ -e "$BUILD_ROOT" ] || ln -s "$PWD" "$BUILD_ROOT"
cd "$BUILD_ROOT"
B=.gpu/bench
L=$B/luminal
step() { echo; echo "=== $*"; s=$(date +%s%N); }
took() { echo "--- rc=$1 $(( ($(date +%s%N) - s) / 1000000 )) ms"; }
gguf_py() {
  python3 -c "import gguf" 2>/dev/null && return
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" $B/gguf-*.whl && export PYTHONPATH="$WORK/site"
}

if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  for t in emulator_matmul:gpu llama:gpu op_suite: emulator_fusion:gpu emulator_quant:gpu emulator_attention:gpu emulator_reduce:gpu; do
    b=${t%%:*}; f=${t#*:}
    [ -x .gpu/$b ] || continue
    step ".gpu/$b $f"
    timeout 120 .gpu/$b $f --nocapture --test-threads 1 > $OUT/$b.log 2>&1; r=$?
    grep -E "^test |test result|positions|skipping|panicked|error|GFLOP|decode step|gpu|ms" $OUT/$b.log | head -50; took $r
  done
fi

if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  for n in 4096 8192; do
    for t in f32 tf32 f16 bf16; do
      step "matmul_tflops $n $n $n 20 $t"
      timeout 60 $B/matmul_tflops $n $n $n 20 $t 2>&1; took $?
    done
    step "torch matmul --n $n"
    timeout 90 python3 scripts/torch_llama_bench.py matmul --n $n --reps 20 --dtypes f32 tf32 f16 bf16 2>&1; took $?
  done
  if [ -x $B/ops_gbps ]; then
    step "ops_gbps 4096 8192 50"
    timeout 90 $B/ops_gbps 4096 8192 50 2>&1; took $?
    step "torch_ops_bench.py"
    timeout 150 python3 scripts/torch_ops_bench.py 2>&1 | tail -30; took ${PIPESTATUS[0]}
  fi
  if [ -x $B/attention_bench ]; then
    step "attention_bench 1024 2048 4096 8192"
    timeout 120 $B/attention_bench 1024 2048 4096 8192 2>&1; took $?
    step "torch_attention_bench.py"
    timeout 120 python3 scripts/torch_attention_bench.py 2>&1 | tail -30; took ${PIPESTATUS[0]}
  fi
  gguf_py
  S=$WORK/smollm2-shape.F16.gguf
  step "make SmolLM2-shaped F16 GGUF"
  timeout 60 python3 scripts/make_llama1b_gguf.py "$S" --ref $B/smollm2-tokenizer.gguf --shape smollm2 2>&1 | tail -2; took $?
  step "luminal bench SmolLM2-shape F16 --device cuda"
  LUMINAL_CUDA_STATS=1 timeout 120 $L bench -m $S --device cuda -p 128,512 -n 128 -r 3 2>&1 | grep -v "^luminal_cuda: .*launches" ; took $?
  LUMINAL_CUDA_STATS=1 timeout 60 $L generate -m $S --device cuda --prompt "Once upon a time" -n 8 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -3
  for dt in f16 bf16; do
    step "transformers eager $dt SmolLM2-shape (same GGUF)"
    timeout 150 python3 scripts/torch_llama_bench.py llama $S --pp 128 512 --tg 128 --reps 3 --dtype $dt 2>&1 | grep -E "transformers|Error" ; took $?
  done
  rm -f $S
  G=$WORK/llama1b-shape.F16.gguf
  step "make Llama-3.2-1B-shaped F16 GGUF"
  timeout 120 python3 scripts/make_llama1b_gguf.py "$G" --ref $B/smollm2-tokenizer.gguf --shape llama1b 2>&1 | tail -2; took $?
  step "luminal bench llama1b-shape F16 --device cuda"
  timeout 180 $L bench -m $G --device cuda -p 512 -n 128 -r 3 2>&1; took $?
  step "transformers eager bf16, random llama1b-shaped"
  timeout 150 python3 scripts/torch_llama_bench.py llama --shape llama1b --pp 512 --tg 128 --reps 3 --dtype bf16 2>&1 | grep -E "transformers|Error"; took $?
fi
