#!/usr/bin/env bash
# luminal vs llama.cpp on the same GGUF files: prefill (ppN), decode (tgN), peak RSS, the
# host's read bandwidth and the decode roofline, optionally perplexity. Prints one markdown
# report on stdout (also saved as report.md in the run folder); progress goes to stderr.
#
# Usage: scripts/bench-vs-llamacpp.sh [--avx2] [--build-only] [--no-ppl] [--help]
#   --avx2        llama.cpp built for AVX2 only (-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
#                 -DGGML_F16C=ON, every AVX-512/AMX option OFF) and ours run with
#                 LUMINAL_CPU_ISA=avx2: both sides limited to the same instruction set.
#   --build-only  build llama.cpp (and ours) and make the model files, then stop.
#   --no-ppl      skip the perplexity comparison.
#
# Environment (defaults in brackets):
#   LUMINAL_BENCH_CACHE  cache for the llama.cpp source and builds, run outputs
#                        [$HOME/.cache/luminal-bench]
#   LLAMA_CPP_PYTHON_VERSION  llama-cpp-python sdist whose vendor/llama.cpp is built [0.3.36]
#   LLAMA_CPP_SDIST      use this llama_cpp_python-*.tar.gz instead of downloading it
#   MODELS_DIR           where model files are read and made [<repo>/models, git-ignored]
#   FILTER               extended regex on file names: which files to bench [all]
#                        e.g. FILTER='Q4_1|llama1b.*Q4_0'
#   THREADS              thread counts ["1 2"]
#   REPS                 repetitions per llama-bench / luminal bench call (-r) [3]
#   ROUNDS               alternating rounds of (llama.cpp, ours) per file and thread count;
#                        the table shows the median of the rounds' means [1]
#   PP, TG               prompt and decode lengths [128, 64]
#   CMD_TIMEOUT          seconds allowed to each benchmark command [900]
#   LUMINAL_BIN          our binary; unset: `cargo build --release -p luminal_cli` here and
#                        use target/release/luminal
#   PPL                  1 = perplexity comparison, 0 = skip [1]
#   PPL_FILTER           extended regex: files that get the perplexity run [SmolLM2]
#   PPL_TEXT             text file scored [/usr/share/common-licenses/GPL-3 (Debian
#                        base-files, 35 KB, ~8k tokens); else this repo's README.md + DESIGN/benches]
#   PPL_CTX              window [512]
#   BW_GIB               size of the bandwidth test's buffer in GiB [1]
#   BUILD_JOBS           parallel compile jobs [nproc]
#   BUILD_TIMEOUT        seconds to wait for the llama.cpp build before giving up [5400]
#   LLAMA_AMX            1 = keep AMX in the native llama.cpp build on hosts that have it [0:
#                        AMX off (-mno-amx-*), since 0.3.36's AMX path crashed on such a host]
#
# Files (under MODELS_DIR; made when missing, reused otherwise):
#   SmolLM2-135M-Instruct.Q4_1.gguf          shipped (scripts/fetch-models.sh)
#   SmolLM2-135M-Instruct.{Q8_0,Q4_0,Q4_K_M,Q6_K,F16}.gguf   llama-quantize --allow-requantize
#                                            from the Q4_1 file (so they carry Q4_1's error)
#   llama1b-shape.F16.gguf                   scripts/make_llama1b_gguf.py: Llama-3.2-1B shape,
#                                            random weights, SmolLM2 vocab, tied embeddings
#   llama1b-shape.{Q4_0,Q8_0,Q4_K_M}.gguf    llama-quantize from the F16 file
#
# Needs: bash, python3 + pip (cmake, ninja, numpy, gguf are pip-installed when missing), gcc/g++,
# cargo, /usr/bin/time (apt-get install time when missing), timeout (coreutils).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd -- "$SCRIPT_DIR/.." && pwd)"
cd "$REPO"

AVX2=0; BUILD_ONLY=0; DO_PPL="${PPL:-1}"
for a in "$@"; do
    case "$a" in
        --avx2) AVX2=1 ;;
        --build-only) BUILD_ONLY=1 ;;
        --no-ppl) DO_PPL=0 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $a (see --help)" >&2; exit 2 ;;
    esac
done

CACHE="${LUMINAL_BENCH_CACHE:-$HOME/.cache/luminal-bench}"
VER="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
MODELS_DIR="${MODELS_DIR:-$REPO/models}"
FILTER="${FILTER:-.}"
THREADS="${THREADS:-1 2}"
REPS="${REPS:-3}"
ROUNDS="${ROUNDS:-1}"
PP="${PP:-128}"
TG="${TG:-64}"
CMD_TIMEOUT="${CMD_TIMEOUT:-900}"
PPL_FILTER="${PPL_FILTER:-SmolLM2}"
PPL_CTX="${PPL_CTX:-512}"
BW_GIB="${BW_GIB:-1}"
BUILD_JOBS="${BUILD_JOBS:-$(nproc)}"
BUILD_TIMEOUT="${BUILD_TIMEOUT:-5400}"
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
VARIANT=native; [[ $AVX2 == 1 ]] && VARIANT=avx2
# On hosts that expose AMX (Sapphire Rapids and later, also some KVM guests), llama.cpp 0.3.36
# built with -march=native runs its AMX matmul and crashes in ggml_backend_amx_mul_mat here
# (segfault, seen on a KVM guest). The native build then keeps every other native instruction
# (AVX-512, VNNI, BF16) and turns AMX off; LLAMA_AMX=1 keeps it.
NATIVE_NOAMX=0
if [[ $VARIANT == native && "${LLAMA_AMX:-0}" != 1 ]] && grep -q -w amx_tile /proc/cpuinfo 2>/dev/null; then
    NATIVE_NOAMX=1; VARIANT=native-noamx
fi
HELPER="$SCRIPT_DIR/bench_vs_llamacpp.py"

mkdir -p "$CACHE" "$MODELS_DIR"
CACHE="$(cd -- "$CACHE" && pwd)"
MODELS_DIR="$(cd -- "$MODELS_DIR" && pwd)"
RUN="$CACHE/runs/$(date +%Y%m%d-%H%M%S)-$VARIANT"
mkdir -p "$RUN"

log() { echo "[bench-vs-llamacpp $(date +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------------------------------------
# Tools
ensure_tools() {
    local need=()
    command -v cmake >/dev/null 2>&1 || need+=(cmake)
    command -v ninja >/dev/null 2>&1 || need+=(ninja)
    "$PYTHON" -c 'import numpy' 2>/dev/null || need+=(numpy)
    "$PYTHON" -c 'import gguf' 2>/dev/null || need+=(gguf)
    if ((${#need[@]})); then
        log "pip install ${need[*]}"
        "$PYTHON" -m pip install --quiet --disable-pip-version-check "${need[@]}" >&2
        hash -r
    fi
    if [[ ! -x /usr/bin/time ]]; then
        log "apt-get install time (for /usr/bin/time -v)"
        local SUDO=""; [[ $(id -u) != 0 ]] && SUDO=sudo
        $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq time >&2
    fi
    command -v timeout >/dev/null 2>&1 || die "timeout (coreutils) is missing"
    command -v gcc >/dev/null 2>&1 || die "gcc is missing"
}

# ---------------------------------------------------------------------------------------------
# llama.cpp from the llama-cpp-python sdist
LLAMA_TARGETS=(llama-bench llama-quantize llama-perplexity)

llama_source() {
    local src="$CACHE/src/llama_cpp_python-$VER"
    if [[ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]]; then
        mkdir -p "$CACHE/src"
        local tgz="${LLAMA_CPP_SDIST:-$CACHE/src/llama_cpp_python-$VER.tar.gz}"
        if [[ ! -f "$tgz" ]]; then
            log "pip download llama-cpp-python==$VER (sdist)"
            # --no-binary for llama-cpp-python only: `--no-binary :all:` also applies to the
            # build backend pip installs to read the sdist's metadata, and builds cmake itself
            # from source (tens of minutes). The file downloaded is the same sdist either way.
            "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-python --disable-pip-version-check \
                --quiet "llama-cpp-python==$VER" -d "$CACHE/src" >&2
            tgz="$(ls "$CACHE"/src/llama_cpp_python-"$VER".tar.gz)"
        fi
        log "untar $tgz"
        tar -xzf "$tgz" -C "$CACHE/src"
        [[ -f "$src/vendor/llama.cpp/CMakeLists.txt" ]] || die "no vendor/llama.cpp in $tgz"
    fi
    echo "$src/vendor/llama.cpp"
}

# Builds (or reuses) llama.cpp for $VARIANT; sets LLAMA_BIN.
build_llamacpp() {
    local B="$CACHE/build-$VER-$VARIANT"
    LLAMA_BIN="$B/bin"
    local t missing=0
    for t in "${LLAMA_TARGETS[@]}"; do [[ -x "$LLAMA_BIN/$t" ]] || missing=1; done
    if [[ $missing == 0 && -f "$B/.build-ok" ]]; then
        log "llama.cpp ($VARIANT) cached in $B (built in $(cat "$B/.build-ok"))"
        return
    fi
    local pidf="$B.pid" pid=""
    if [[ -f "$pidf" ]] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
        pid="$(cat "$pidf")"
        log "a llama.cpp build ($VARIANT) is already running (pid $pid); waiting for it"
    else
        local S; S="$(llama_source)"
        local flags=(-DGGML_NATIVE=ON)
        if [[ $NATIVE_NOAMX == 1 ]]; then
            # GCC keeps explicit -mno-* flags over what -march=native turns on, whatever the order
            flags+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
                    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
        fi
        if [[ $VARIANT == avx2 ]]; then
            flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                   -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF
                   -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF
                   -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
        fi
        log "configure llama.cpp ($VARIANT): ${flags[*]}"
        cmake -S "$S" -B "$B" -G Ninja "${flags[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$B.configure.log" 2>&1 \
            || { tail -30 "$B.configure.log" >&2; die "cmake configure failed ($B.configure.log)"; }
        date +%s > "$B.start"
        log "build ${LLAMA_TARGETS[*]} in the background (-j $BUILD_JOBS; log $B.build.log)"
        nohup cmake --build "$B" --target "${LLAMA_TARGETS[@]}" -j "$BUILD_JOBS" \
            > "$B.build.log" 2>&1 < /dev/null &
        pid=$!
        echo "$pid" > "$pidf"
    fi
    local start; start="$(cat "$B.start" 2>/dev/null || date +%s)"
    while kill -0 "$pid" 2>/dev/null; do
        sleep 20
        local el=$(( $(date +%s) - start ))
        log "  llama.cpp build: ${el}s, $(tail -n 1 "$B.build.log" | cut -c1-60)"
        if (( el > BUILD_TIMEOUT )); then
            die "llama.cpp build still running after ${el}s (pid $pid, log $B.build.log); run again later to reuse it"
        fi
    done
    local rc=0
    wait "$pid" 2>/dev/null || rc=$?   # only our own child reports a status
    rm -f "$pidf"
    for t in "${LLAMA_TARGETS[@]}"; do
        [[ -x "$LLAMA_BIN/$t" ]] || { tail -30 "$B.build.log" >&2; die "llama.cpp build failed (rc $rc, $B.build.log)"; }
    done
    local secs=$(( $(date +%s) - start ))
    echo "${secs}s (-j $BUILD_JOBS, $(date -u +%F))" > "$B/.build-ok"
    log "llama.cpp ($VARIANT) built in ${secs}s: $LLAMA_BIN"
}

# ---------------------------------------------------------------------------------------------
# Ours
build_ours() {
    if [[ -n "${LUMINAL_BIN:-}" ]]; then
        OURS="$LUMINAL_BIN"
    else
        log "cargo build --release -p luminal_cli"
        cargo build --release -p luminal_cli >&2 || die "cargo build failed"
        OURS="$REPO/target/release/luminal"
    fi
    [[ -x "$OURS" ]] || die "no luminal binary at $OURS"
}

# ---------------------------------------------------------------------------------------------
# Model files
SMOL_SRC="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_TYPES=(Q8_0 Q4_0 Q4_K_M Q6_K F16)
B1_TYPES=(Q4_0 Q8_0 Q4_K_M)
ALL_FILES=("$SMOL_SRC")
for q in "${SMOL_TYPES[@]}"; do ALL_FILES+=("SmolLM2-135M-Instruct.$q.gguf"); done
for q in "${B1_TYPES[@]}"; do ALL_FILES+=("llama1b-shape.$q.gguf"); done
FILES=()
for f in "${ALL_FILES[@]}"; do [[ $f =~ $FILTER ]] && FILES+=("$f"); done
((${#FILES[@]})) || die "FILTER='$FILTER' matches none of: ${ALL_FILES[*]}"

quantize() { # in out type
    log "llama-quantize $(basename "$1") -> $(basename "$2") ($3)"
    "$LLAMA_BIN/llama-quantize" --allow-requantize "$1" "$2.part" "$3" "$BUILD_JOBS" \
        > "$RUN/quantize-$(basename "$2").log" 2>&1 \
        || { tail -20 "$RUN/quantize-$(basename "$2").log" >&2; rm -f "$2.part"; die "llama-quantize failed"; }
    mv "$2.part" "$2"
}

make_models() {
    local src="$MODELS_DIR/$SMOL_SRC"
    if [[ ! -f "$src" ]]; then
        MODELS_DIR="$MODELS_DIR" "$SCRIPT_DIR/fetch-models.sh" >/dev/null
    fi
    local f q
    for f in "${FILES[@]}"; do
        [[ -f "$MODELS_DIR/$f" ]] && continue
        case "$f" in
            SmolLM2-*)
                q="${f#SmolLM2-135M-Instruct.}"; q="${q%.gguf}"
                quantize "$src" "$MODELS_DIR/$f" "$q" ;;
            llama1b-shape.*)
                local f16="$MODELS_DIR/llama1b-shape.F16.gguf"
                if [[ ! -f "$f16" ]]; then
                    log "make_llama1b_gguf.py -> $f16"
                    "$PYTHON" "$SCRIPT_DIR/make_llama1b_gguf.py" "$f16" --ref "$src" >&2
                fi
                q="${f#llama1b-shape.}"; q="${q%.gguf}"
                quantize "$f16" "$MODELS_DIR/$f" "$q" ;;
        esac
    done
}

# ---------------------------------------------------------------------------------------------
# Read bandwidth: T threads each summing a disjoint slice of one BW_GIB buffer with the widest
# vector loads -march=native allows (AVX-512 / AVX2 / scalar); best of 12 passes.
membw() {
    local exe="$CACHE/membw-$(uname -m)"
    if [[ ! -x "$exe" ]]; then
        cat > "$CACHE/membw.c" <<'EOF'
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
static size_t BYTES; static int NT; static char *BUF; static pthread_barrier_t BAR;
static volatile uint64_t SINK; static double BEST = 1e30;
#define NPASS 12
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static uint64_t sum_slice(const char *p, size_t n) {
#if defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#elif defined(__AVX2__)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t o[4]; _mm256_storeu_si256((__m256i *)o, s);
    return o[0] + o[1] + o[2] + o[3];
#else
    const uint64_t *q = (const uint64_t *)p; uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) { s0 += q[i]; s1 += q[i + 1]; s2 += q[i + 2]; s3 += q[i + 3]; }
    return s0 + s1 + s2 + s3;
#endif
}
static void *worker(void *arg) {
    long id = (long)arg; size_t slice = BYTES / NT; char *p = BUF + id * slice;
    memset(p, (int)id + 1, slice); /* first touch by the thread that reads it */
    for (int pass = 0; pass < NPASS; pass++) {
        pthread_barrier_wait(&BAR);
        double t0 = now();
        SINK += sum_slice(p, slice);
        pthread_barrier_wait(&BAR);
        if (id == 0) { double dt = now() - t0; if (dt < BEST) BEST = dt; }
    }
    return NULL;
}
int main(int argc, char **argv) {
    NT = argc > 1 ? atoi(argv[1]) : 1;
    if (NT < 1 || NT > 256) NT = 1;
    BYTES = (size_t)((argc > 2 ? atof(argv[2]) : 1.0) * (double)(1ull << 30));
    BYTES -= BYTES % (256 * (size_t)NT);
    if (posix_memalign((void **)&BUF, 4096, BYTES)) { perror("posix_memalign"); return 1; }
    pthread_barrier_init(&BAR, NULL, NT);
    pthread_t th[256];
    for (long i = 0; i < NT; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (long i = 0; i < NT; i++) pthread_join(th[i], NULL);
    printf("threads %d bytes %zu best_s %.6f GB/s %.2f\n", NT, BYTES, BEST, BYTES / BEST / 1e9);
    return 0;
}
EOF
        gcc -O3 -march=native -pthread "$CACHE/membw.c" -o "$exe" || die "cannot compile membw.c"
    fi
    local t
    for t in $THREADS; do
        "$exe" "$t" "$BW_GIB" > "$RUN/bw.t$t.txt"
        log "read bandwidth, $t thread(s): $(awk '{print $8}' "$RUN/bw.t$t.txt") GB/s"
    done
}

# ---------------------------------------------------------------------------------------------
# One measured command: stdout -> $1.out, stderr -> $1.err, /usr/bin/time -v -> $1.time, exit
# status -> $1.rc, the /proc/stat cpu line before and after -> $1.stat (the report subtracts the
# command's own CPU time from the machine's busy time: CPU used by other processes meanwhile).
measure() {
    local stem="$1"; shift
    local rc=0
    head -n 1 /proc/stat > "$stem.stat"
    /usr/bin/time -v -o "$stem.time" timeout "$CMD_TIMEOUT" "$@" > "$stem.out" 2> "$stem.err" || rc=$?
    head -n 1 /proc/stat >> "$stem.stat"
    echo "$rc" > "$stem.rc"
    if [[ $rc == 124 ]]; then
        log "  timed out after ${CMD_TIMEOUT}s: $*"
    elif [[ $rc != 0 ]]; then
        log "  exit $rc: $* ($(tail -n 1 "$stem.err" | cut -c1-120))"
    fi
    return 0
}

run_bench() {
    local f t r stem
    for f in "${FILES[@]}"; do
        for t in $THREADS; do
            for ((r = 1; r <= ROUNDS; r++)); do
                local order=(llama ours); ((r % 2 == 0)) && order=(ours llama)
                local e
                for e in "${order[@]}"; do
                    stem="$RUN/bench.$f.t$t.r$r.$e"
                    log "$e: $f, $t thread(s), round $r/$ROUNDS"
                    if [[ $e == llama ]]; then
                        measure "$stem" "$LLAMA_BIN/llama-bench" -m "$MODELS_DIR/$f" -p "$PP" -n "$TG" \
                            -t "$t" -r "$REPS" -o json
                    else
                        measure "$stem" env ${OURS_ENV[@]+"${OURS_ENV[@]}"} "$OURS" bench \
                            --model "$MODELS_DIR/$f" -p "$PP" -n "$TG" --threads "$t" -r "$REPS" -o json
                    fi
                done
            done
        done
    done
}

run_ppl() {
    local text="${PPL_TEXT:-}"
    if [[ -z "$text" ]]; then
        if [[ -r /usr/share/common-licenses/GPL-3 ]]; then
            text=/usr/share/common-licenses/GPL-3
        else
            text="$RUN/ppl-text.txt"
            cat "$REPO/README.md" "$REPO/benches/README.md" > "$text"
        fi
    fi
    echo "$text" > "$RUN/ppl-text-path"
    local t; t="$(echo $THREADS | awk '{print $NF}')"
    local f stem
    for f in "${FILES[@]}"; do
        [[ $f =~ $PPL_FILTER ]] || continue
        stem="$RUN/ppl.$f.t$t"
        log "perplexity: $f ($text, ctx $PPL_CTX, $t threads)"
        measure "$stem.llama" "$LLAMA_BIN/llama-perplexity" -m "$MODELS_DIR/$f" -f "$text" \
            -c "$PPL_CTX" -b "$PPL_CTX" -t "$t"
        measure "$stem.ours" env ${OURS_ENV[@]+"${OURS_ENV[@]}"} "$OURS" perplexity \
            --model "$MODELS_DIR/$f" --file "$text" --ctx "$PPL_CTX" --threads "$t" \
            --protocol llama-cpp
    done
}

# ---------------------------------------------------------------------------------------------
ensure_tools
build_llamacpp
build_ours
OURS_ENV=()
[[ $AVX2 == 1 ]] && OURS_ENV=(LUMINAL_CPU_ISA=avx2)
make_models
# Check once that llama.cpp loads each file (llama-bench on a tiny test).
for f in "${FILES[@]}"; do
    if [[ ! -f "$MODELS_DIR/.$f.loads-$VARIANT" ]]; then
        "$LLAMA_BIN/llama-bench" -m "$MODELS_DIR/$f" -p 8 -n 0 -r 1 -t 1 > "$RUN/loadcheck.$f.log" 2>&1 \
            || { tail -20 "$RUN/loadcheck.$f.log" >&2; die "llama.cpp cannot run $f"; }
        touch "$MODELS_DIR/.$f.loads-$VARIANT"
    fi
done
if [[ $BUILD_ONLY == 1 ]]; then
    log "built: $LLAMA_BIN, $OURS; models in $MODELS_DIR"
    exit 0
fi

{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
    echo "nproc=$(nproc)"
    echo "isa=$(grep -m1 -o -w -E 'avx512f|avx2|fma|f16c|avx512_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "variant=$VARIANT"
    echo "llama_build=llama-cpp-python $VER vendor/llama.cpp, $(cat "$CACHE/build-$VER-$VARIANT/.build-ok" 2>/dev/null)"
    if [[ -n "${LUMINAL_BIN:-}" ]]; then
        echo "ours=$OURS (LUMINAL_BIN)"
    else
        echo "ours=$OURS (built from $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes'))"
    fi
    echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "clk_tck=$(getconf CLK_TCK 2>/dev/null || echo 100)"
    echo "ours_env=${OURS_ENV[*]:-}"
    echo "models_dir=$MODELS_DIR"
    echo "settings=-r $REPS per call, $ROUNDS alternating round(s) (llama.cpp first in odd rounds), -p $PP -n $TG, threads: $THREADS"
} > "$RUN/meta.txt"

membw
run_bench
[[ $DO_PPL == 1 ]] && run_ppl

echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$RUN/meta.txt"
"$PYTHON" "$HELPER" report --run "$RUN" --models-dir "$MODELS_DIR" --threads "$THREADS" \
    --pp "$PP" --tg "$TG" --ppl-ctx "$PPL_CTX" --files "${FILES[@]}" | tee "$RUN/report.md"
log "raw outputs and report.md: $RUN"
