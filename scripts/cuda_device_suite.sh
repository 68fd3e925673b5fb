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
#   bash scripts/cuda_device_suite.sh --prepare         # copies + strips them into .gpu/,
#                                                       # adds the gguf wheel and tokenizer
# then run `bash scripts/cuda_device_suite.sh [tests|bench|all|decode]` there with .gpu carried
# (`decode`: the product/model tests, decode/prefill with and without the skinny products on
# F16, Q8_0 and Q4_0 files, then the other tests; `profile`: a few tests, the skinny products
# against cuBLAS, Nsight Compute on them and on every kernel of a 1B-shaped decode; `skinny`:
# the skinny kernels under their tuning knobs; `final`: every GPU test, products and decode;
# `mma`: the tensor-core skinny kernel against cuBLAS and the CUDA-core one, and in decode;
# `decode2`: the tests, decode, transformers eager and compiled on the same GPU; `attn16`: the
# f16 tensor-core attention's tests, against the 3xTF32 kernel and SDPA, and in decode;
# `kquant`: K-quant weights read in place against the f16 copy, in decode).
# Logs go to $OUT (the device tool's output folder) or a temporary folder.
set -u
if [ "${1:-}" = --prepare ]; then
  mkdir -p .gpu/bench
  for t in op_suite llama emulator_matmul emulator_fusion emulator_quant emulator_attention emulator_reduce emulator_graphs emulator_skinny_norm; do
    f=$(ls -t target/release/deps/$t-* 2>/dev/null | grep -v '\.d$' | head -1)
    [ -n "$f" ] && cp "$f" .gpu/$t && strip .gpu/$t
  done
  cp target/release/luminal .gpu/bench/luminal && strip .gpu/bench/luminal
  for e in matmul_tflops ops_gbps attention_bench matvec_gbps; do
    [ -x target/release/examples/$e ] && cp target/release/examples/$e .gpu/bench/ && strip .gpu/bench/$e
  done
  # For the model-shaped GGUFs made on the device: the gguf package's wheel and SmolLM2's
  # tokenizer alone (a Python with `gguf` installed here: $PYTHON, default python3).
  PY=${PYTHON:-python3}
  ls .gpu/bench/gguf-*.whl >/dev/null 2>&1 || $PY -m pip download -q --no-deps --only-binary=:all: -d .gpu/bench gguf==0.19.0
  [ -e .gpu/bench/smollm2-tokenizer.gguf ] || $PY scripts/make_llama1b_gguf.py .gpu/bench/smollm2-tokenizer.gguf --ref models/SmolLM2-135M-Instruct.Q4_1.gguf --tokenizer-only
  pwd > .gpu/bench/build_root
  ls -la .gpu .gpu/bench
  du -sh .gpu  # the device tool carries 64 MiB at most
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
# One GPU test binary (`name:filter`): its summary lines here, its whole log appended to
# $OUT/tests.log (one file: the device tool returns at most 8); returns its exit status.
gtest() {
  b=${1%%:*}; f=${1#*:}
  [ -x .gpu/$b ] || return 0
  step ".gpu/$b $f"
  timeout 60 .gpu/$b $f --nocapture --test-threads 1 > $WORK/$b.log 2>&1; r=$?
  grep -E "^test |test result|positions|skipping|panicked|FAILED|error|decode m|max|replays" $WORK/$b.log | head -30; took $r
  cat $WORK/$b.log >> $OUT/tests.log
  return $r
}
# A GGUF of model shape $1 (llama1b or smollm2; random weights, SmolLM2's tokenizer) as
# file $2, weight type $3 (default F16).
shaped_gguf() {
  gguf_py
  step "make the $1-shaped ${3:-f16} GGUF"
  timeout 90 python3 scripts/make_llama1b_gguf.py "$2" --ref $B/smollm2-tokenizer.gguf --shape $1 ${3:+--type $3} 2>&1 | tail -1; took $?
}
# `luminal bench` of GGUF $1 on the GPU under the environment assignments $2.
bench() {
  step "luminal bench $(basename $1) --device cuda ($2)"
  env $2 timeout 60 $L bench -m $1 --device cuda -p 512 -n 128 -r 3 2>&1 | grep -E "^\| llama|rror"; took $?
}
# Decode-shaped products alone at a 1B model's FFN shapes, weight type $1, every one skinny
# (or `S=0`: through cuBLAS), each line labelled $2.
mvb() { LUMINAL_CUDA_SKINNY=${S:-all} timeout 60 $B/matvec_gbps 2048 8192 16 50 $1 2>&1 | sed "s/^/$2 /"; }

if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  for t in emulator_matmul:gpu llama:gpu emulator_graphs:gpu emulator_reduce:gpu emulator_attention:gpu op_suite: emulator_fusion:gpu emulator_quant:gpu; do gtest $t; done
fi

if [ "$WHAT" = decode ]; then
  # Decode and prefill only (after decode changes), the most telling first: the product and
  # model tests, the 1B shape with and without the skinny products, the SmolLM2 shape in F16,
  # Q8_0 and Q4_0 (blocks read in place vs the f16 copy through cuBLAS), the device copy for
  # the roofline, then the remaining GPU tests.
  for t in emulator_matmul:gpu llama:gpu emulator_quant:gpu; do gtest $t; done
  if [ -x $B/matvec_gbps ]; then
    # Decode-shaped products alone: weight GB/s of the skinny kernels against cuBLAS at a
    # 1B model's FFN shapes (16 layers alternating [8192, 2048] and [2048, 8192]).
    step "matvec_gbps 2048 8192 16 50, skinny (all) vs cuBLAS (0)"
    for t in f16 q8_0 q4_0; do
      for k in all 0; do LUMINAL_CUDA_SKINNY=$k timeout 60 $B/matvec_gbps 2048 8192 16 50 $t 2>&1 | sed "s/^/SKINNY=$k /"; done
    done
    took 0
  fi
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  bench $G LUMINAL_CUDA_SKINNY=all
  bench $G LUMINAL_CUDA_SKINNY=0
  LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $G --device cuda --prompt "Once upon a time" -n 12 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -4
  rm -f $G
  [ -x $B/ops_gbps ] && timeout 40 $B/ops_gbps 4096 8192 30 2>&1 | grep d2d
  for q in f16 q8_0 q4_0; do
    S=$WORK/smollm2-shape.$q.gguf; shaped_gguf smollm2 $S $q
    bench $S LUMINAL_CUDA_SKINNY=all
    bench $S LUMINAL_CUDA_SKINNY=0
    LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $S --device cuda --prompt "Once upon a time" -n 12 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -3
    rm -f $S
  done
  for t in op_suite: emulator_fusion:gpu emulator_graphs:gpu; do gtest $t; done
fi

if [ "$WHAT" = profile ]; then
  # Where a decode step's device time goes: the GPU tests first (they check the plan's
  # launches on the device), the skinny products alone against cuBLAS, Nsight Compute's
  # sections for one up- and one down-shaped skinny product, every kernel's duration in a
  # Llama-3.2-1B-shaped F16 decode (graphs off, so each launch is its own), the device copy.
  for t in ${PROFILE_TESTS:-emulator_matmul:gpu llama:gpu emulator_fusion:gpu}; do gtest $t; done
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "ncu: $NCU"
  step "matvec_gbps 2048 8192 16 50: skinny (all) vs cuBLAS (0)"
  for t in f16 q8_0 q4_0; do
    for k in all 0; do LUMINAL_CUDA_SKINNY=$k timeout 60 $B/matvec_gbps 2048 8192 16 50 $t 2>&1 | sed "s/^/SKINNY=$k /"; done
  done
  took 0
  step "ncu: two skinny f16 products (up and down shapes)"
  LUMINAL_CUDA_GRAPHS=0 LUMINAL_CUDA_SKINNY=all timeout 120 $NCU --clock-control none --launch-skip 64 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
    $B/matvec_gbps 2048 8192 16 4 f16 > $OUT/ncu_skinny.txt 2>&1; took $?
  grep -E "lum_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Block Limit|Grid Size|Shared Memory Config" $OUT/ncu_skinny.txt | head -60
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  bench $G LUMINAL_CUDA_X=default
  LUMINAL_CUDA_STATS=3 timeout 30 $L generate -m $G --device cuda --prompt "Once upon a time" -n 4 --no-echo > $OUT/stats3.log 2>&1
  grep -E "luminal_cuda|tok/s" $OUT/stats3.log | tail -8
  step "ncu: every kernel of a 1B-shaped decode (2 tokens, graphs off)"
  LUMINAL_CUDA_GRAPHS=0 timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
    $L generate -m $G --device cuda --prompt "Once upon a time" -n 2 --no-echo > $OUT/ncu_decode.csv 2>&1; took $?
  python3 scripts/ncu_kernel_table.py $OUT/ncu_decode.csv | head -24
  rm -f $G
  [ -x $B/ops_gbps ] && timeout 40 $B/ops_gbps 4096 8192 30 2>&1 | grep d2d
fi

if [ "$WHAT" = skinny ]; then
  # The skinny decode products against cuBLAS: GPU tests of the products, the kernels alone
  # at a 1B model's FFN shapes under their tuning knobs, Nsight Compute's view of the f16 and
  # q8_0 kernels, then decode of the 1B and SmolLM2 shapes with every float product skinny
  # (`all`) and by the default bound.
  for t in emulator_matmul:gpu emulator_quant:gpu llama:gpu; do gtest $t; done
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  step "matvec_gbps 2048 8192 16 50"
  for t in f16 bf16; do
    S=0 mvb $t cuBLAS
    mvb $t "U2 B4"
    LUMINAL_CUDA_SKINNY_U=4 LUMINAL_CUDA_SKINNY_BLOCKS=0 mvb $t "U4 B0"
    LUMINAL_CUDA_SKINNY_U=4 LUMINAL_CUDA_SKINNY_BLOCKS=3 mvb $t "U4 B3"
    LUMINAL_CUDA_SKINNY_U=1 mvb $t "U1 B4"
    LUMINAL_CUDA_SKINNY_BLOCKS=0 mvb $t "U2 B0"
  done
  # SmolLM2's shapes (30 layers of [1536, 576] and [576, 1536]): rows split or not, blocks
  # striding or one block per 8 rows (the last session measured these only at 1B shapes).
  for t in f16 q8_0; do
    for k in "" "LUMINAL_CUDA_SKINNY_SPLIT=0" "LUMINAL_CUDA_SKINNY_PERSIST=0" "LUMINAL_CUDA_SKINNY_SPLIT=0 LUMINAL_CUDA_SKINNY_PERSIST=0"; do
      env $k LUMINAL_CUDA_SKINNY=all timeout 60 $B/matvec_gbps 576 1536 30 100 $t 2>&1 | sed "s/^/smollm2 [$k] /"
    done
    LUMINAL_CUDA_SKINNY=0 timeout 60 $B/matvec_gbps 576 1536 30 100 $t 2>&1 | sed "s/^/smollm2 cuBLAS /"
  done
  for t in q8_0 q4_0 q4_1; do
    S=0 mvb $t cuBLAS
    LUMINAL_CUDA_SKINNY_QUANT=0 mvb $t "f16-copy skinny"
    mvb $t "in place QB4"
    LUMINAL_CUDA_SKINNY_QBLOCKS=3 mvb $t "in place QB3"
    LUMINAL_CUDA_SKINNY_QBLOCKS=0 mvb $t "in place QB0"
  done
  took 0
  step "ncu: skinny f16 and q8_0 (up and down shapes)"
  for t in f16 q8_0; do
    LUMINAL_CUDA_GRAPHS=0 LUMINAL_CUDA_SKINNY=all timeout 60 $NCU --clock-control none --launch-skip 64 --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      $B/matvec_gbps 2048 8192 16 4 $t > $OUT/ncu_$t.txt 2>&1
    grep -E "  lum_|Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit (Reg|Shared)" $OUT/ncu_$t.txt | head -24
  done
  took 0
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  bench $G LUMINAL_CUDA_SKINNY=all
  bench $G LUMINAL_CUDA_X=default
  bench $G LUMINAL_CUDA_SKINNY=all
  LUMINAL_CUDA_SKINNY=all LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $G --device cuda --prompt "Once upon a time" -n 8 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -3
  rm -f $G
  S=$WORK/smollm2-shape.F16.gguf; shaped_gguf smollm2 $S
  bench $S LUMINAL_CUDA_SKINNY=all
  bench $S LUMINAL_CUDA_X=default
  rm -f $S
  [ -x $B/ops_gbps ] && timeout 40 $B/ops_gbps 4096 8192 30 2>&1 | grep d2d
fi

if [ "$WHAT" = final ]; then
  # The model test first (skinny products and programmatic launches in a model against the
  # CPU backend), the skinny products against cuBLAS at a 1B model's FFN shapes, decode of the
  # 1B and SmolLM2 shapes (by default, every float product skinny, programmatic launches off)
  # with the host time per step, the device copy for the roofline, then every other GPU test.
  # Programmatic launches are new: where the model test fails with them, the rest runs without.
  gtest llama:gpu || { export LUMINAL_CUDA_PDL=0; echo "llama gpu failed: LUMINAL_CUDA_PDL=0 from here on"; }
  step "matvec_gbps 2048 8192 16 50"
  S=0 mvb f16 cuBLAS; mvb f16 skinny
  LUMINAL_CUDA_SKINNY_SPLIT=0 mvb f16 "skinny, rows not split"
  LUMINAL_CUDA_SKINNY_PERSIST=0 mvb f16 "skinny, a block per 8 rows"
  S=0 mvb q8_0 cuBLAS; mvb q8_0 skinny
  took 0
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_SKINNY=all LUMINAL_CUDA_PDL=0 "LUMINAL_CUDA_SKINNY=all LUMINAL_CUDA_PDL=0"; do bench $G "$v"; done
  LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $G --device cuda --prompt "Once upon a time" -n 8 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -3
  rm -f $G
  S=$WORK/smollm2-shape.F16.gguf; shaped_gguf smollm2 $S
  for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_PDL=0; do bench $S "$v"; done
  LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $S --device cuda --prompt "Once upon a time" -n 8 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -3
  rm -f $S
  [ -x $B/ops_gbps ] && timeout 40 $B/ops_gbps 4096 8192 30 2>&1 | grep d2d
  for t in emulator_matmul:gpu emulator_quant:gpu op_suite: emulator_graphs:gpu emulator_fusion:gpu emulator_attention:gpu emulator_reduce:gpu; do gtest $t; done
fi

if [ "$WHAT" = mma ]; then
  # The tensor-core skinny kernel: the product, norm/residual and model tests on the GPU, the
  # kernel alone against cuBLAS and the CUDA-core kernel at a 1B model's FFN and square shapes
  # and at SmolLM2's under its knobs (chunks a batch, blocks an SM), decode of the 1B and
  # SmolLM2 shapes with it (the default), without the norm/residual fusion and without it at
  # all, the device copy for the roofline, then Nsight Compute's time of every kernel of a 1B
  # decode step.
  for t in emulator_matmul:gpu emulator_skinny_norm:gpu llama:gpu; do gtest $t; done
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  step "matvec_gbps: cuBLAS, the tensor-core kernel under its knobs, the CUDA-core kernel"
  for shape in "2048 8192 16 50" "2048 2048 16 100" "576 1536 30 100"; do
    LUMINAL_CUDA_SKINNY=0 timeout 60 $B/matvec_gbps $shape f16 2>&1 | sed "s/^/cuBLAS /"
    LUMINAL_CUDA_SKINNY_MMA=0 LUMINAL_CUDA_SKINNY=all timeout 60 $B/matvec_gbps $shape f16 2>&1 | sed "s/^/v4 /"
    for k in "LUMINAL_CUDA_X=0" "LUMINAL_CUDA_SKINNY_MMA_U=2" "LUMINAL_CUDA_SKINNY_MMA_BLOCKS=1"; do
      env $k timeout 60 $B/matvec_gbps $shape f16 2>&1 | sed "s/^/mma [$k] /"
    done
  done
  took 0
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  for v in LUMINAL_CUDA_X=default "LUMINAL_CUDA_SKINNY_NORM=0 LUMINAL_CUDA_SKINNY_RESIDUAL=0" LUMINAL_CUDA_SKINNY_MMA=0 LUMINAL_CUDA_X=default; do bench $G "$v"; done
  LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $G --device cuda --prompt "Once upon a time" -n 8 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -3
  S=$WORK/smollm2-shape.F16.gguf; shaped_gguf smollm2 $S
  for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_SKINNY_MMA=0; do bench $S "$v"; done
  rm -f $S
  [ -x $B/ops_gbps ] && timeout 40 $B/ops_gbps 4096 8192 30 2>&1 | grep d2d
  step "ncu: every kernel of a 1B-shaped decode (2 tokens, graphs off)"
  LUMINAL_CUDA_GRAPHS=0 timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
    $L generate -m $G --device cuda --prompt "Once upon a time" -n 2 --no-echo > $OUT/ncu_decode.csv 2>&1; took $?
  python3 scripts/ncu_kernel_table.py $OUT/ncu_decode.csv 123 | head -30
  rm -f $G
fi

if [ "$WHAT" = decode2 ]; then
  # The product, norm/residual and model tests on the GPU; the decode-shaped products alone
  # (tensor-core kernel, cuBLAS); decode of the 1B and SmolLM2 shapes by default and with the
  # CUDA-core attention kernel; the device copy for the roofline; then transformers on the
  # same GPU: eager bf16 and torch.compile (static cache, CUDA graphs) decode of the 1B shape
  # (the compile did not finish within 110 s in the fifth session: give it more).
  for t in emulator_matmul:gpu emulator_skinny_norm:gpu llama:gpu; do gtest $t; done
  step "matvec_gbps 2048 8192 16 50 f16"
  LUMINAL_CUDA_SKINNY=0 timeout 60 $B/matvec_gbps 2048 8192 16 50 f16 2>&1 | sed "s/^/cuBLAS /"
  timeout 60 $B/matvec_gbps 2048 8192 16 50 f16 2>&1 | sed "s/^/mma /"
  took 0
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_ATTENTION=simt; do bench $G "$v"; done
  LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $G --device cuda --prompt "Once upon a time" -n 8 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -3
  rm -f $G
  S=$WORK/smollm2-shape.F16.gguf; shaped_gguf smollm2 $S
  for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_ATTENTION=simt; do bench $S "$v"; done
  rm -f $S
  [ -x $B/ops_gbps ] && timeout 40 $B/ops_gbps 4096 8192 30 2>&1 | grep d2d
  step "transformers eager bf16, random llama1b-shaped"
  timeout 60 python3 scripts/torch_llama_bench.py llama --shape llama1b --pp 512 --tg 128 --reps 2 --dtype bf16 2>&1 | grep -E "transformers|Error"; took $?
  step "transformers torch.compile (static cache, reduce-overhead) bf16, random llama1b-shaped"
  timeout 300 python3 scripts/torch_llama_bench.py llama --shape llama1b --pp 0 --tg 128 --reps 2 --dtype bf16 --static 2>&1 | grep -E "transformers|Error"; took $?
fi

if [ "$WHAT" = attn16 ]; then
  # The f16 tensor-core attention (2026-11-28, built without a GPU; checked on the cooperative
  # emulator and by NVRTC/ptxas only): its GPU tests first (every attention case with each
  # kernel; the tiny models with it and with the 3xTF32 kernel), then causal attention at
  # seq 1024-8192 with the f16 kernel, the 3xTF32 kernel and SDPA in the same run, then decode
  # and prefill of the 1B and SmolLM2 shapes with each kernel.
  for t in emulator_attention:gpu llama:gpu; do gtest $t; done
  if [ -x $B/attention_bench ]; then
    step "attention_bench, k/v f16: the f16 kernel, then the 3xTF32 kernel; SDPA"
    ATTN_KV=f16 REPS=10 timeout 90 $B/attention_bench 1024 2048 4096 8192 2>&1
    ATTN_KV=f16 REPS=5 LUMINAL_CUDA_ATTENTION=tf32 timeout 90 $B/attention_bench 1024 2048 4096 8192 2>&1
    timeout 90 python3 scripts/torch_attention_bench.py 2>&1 | tail -20; took $?
  fi
  # LUMINAL_CUDA_ATTN_SPLITS=1: the f16 kernel's decode without key splits (no combine launch).
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_ATTENTION=tf32 LUMINAL_CUDA_ATTN_SPLITS=1; do bench $G "$v"; done
  rm -f $G
  S=$WORK/smollm2-shape.F16.gguf; shaped_gguf smollm2 $S
  for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_ATTENTION=tf32 LUMINAL_CUDA_ATTN_SPLITS=1; do bench $S "$v"; done
  rm -f $S
  for t in op_suite: emulator_graphs:gpu; do gtest $t; done
fi

if [ "$WHAT" = kquant ]; then
  # K-quant weights read in place by the skinny kernel (2026-11-28, built without a GPU):
  # the quantized product tests, then decode of the 1B shape with random Q4_K and Q6_K
  # super-blocks, in place and through the f16 copy (LUMINAL_CUDA_SKINNY_QUANT=0).
  for t in emulator_quant:gpu emulator_matmul:gpu; do gtest $t; done
  for q in q4_k q6_k; do
    G=$WORK/llama1b-shape.$q.gguf; shaped_gguf llama1b $G $q
    for v in LUMINAL_CUDA_X=default LUMINAL_CUDA_SKINNY_QUANT=0; do bench $G "$v"; done
    rm -f $G
  done
fi

if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  S=$WORK/smollm2-shape.F16.gguf; shaped_gguf smollm2 $S
  step "luminal bench SmolLM2-shape F16 --device cuda"
  timeout 60 $L bench -m $S --device cuda -p 128,512 -n 128 -r 3 2>&1; took $?
  step "launches and host/device time per decode step (LUMINAL_CUDA_STATS=2)"
  LUMINAL_CUDA_STATS=2 timeout 30 $L generate -m $S --device cuda --prompt "Once upon a time" -n 6 --no-echo 2>&1 | grep -E "luminal_cuda|tok/s" | tail -6
  step "LUMINAL_CUDA_GRAPHS=0 luminal bench SmolLM2-shape"
  LUMINAL_CUDA_GRAPHS=0 timeout 40 $L bench -m $S --device cuda -p 512 -n 128 -r 2 2>&1 | tail -3; took $?
  for n in 4096 8192; do
    for t in f32 tf32 f16 bf16; do
      timeout 30 $B/matmul_tflops $n $n $n 20 $t 2>&1
    done
    timeout 60 python3 scripts/torch_llama_bench.py matmul --n $n --reps 20 --dtypes f32 tf32 f16 bf16 2>&1
  done
  if [ -x $B/ops_gbps ]; then
    step "ops_gbps 4096 8192 30"
    timeout 40 $B/ops_gbps 4096 8192 30 2>&1; took $?
  fi
  step "transformers eager bf16, SmolLM2-shape (random init, same shape)"
  timeout 60 python3 scripts/torch_llama_bench.py llama --shape smollm2 --pp 128 512 --tg 128 --reps 2 --dtype bf16 2>&1 | grep -E "transformers|Error" ; took $?
  rm -f $S
  G=$WORK/llama1b-shape.F16.gguf; shaped_gguf llama1b $G
  step "luminal bench llama1b-shape F16 --device cuda"
  timeout 90 $L bench -m $G --device cuda -p 512 -n 128 -r 2 2>&1; took $?
  step "transformers eager bf16, random llama1b-shaped"
  timeout 60 python3 scripts/torch_llama_bench.py llama --shape llama1b --pp 512 --tg 128 --reps 2 --dtype bf16 2>&1 | grep -E "transformers|Error"; took $?
  if [ -x $B/attention_bench ]; then
    step "attention_bench"
    timeout 60 $B/attention_bench 1024 2048 4096 8192 2>&1; took $?
    timeout 60 python3 scripts/torch_attention_bench.py 2>&1 | tail -20
  fi
  step "torch_ops_bench.py"
  timeout 60 python3 scripts/torch_ops_bench.py 4096 8192 30 2>&1 | tail -12; took ${PIPESTATUS[0]}
fi
