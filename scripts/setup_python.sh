#!/usr/bin/env bash
# Creates (or reuses) the project's Python virtual environment at .venv in the repo root and
# installs what the project's Python scripts need. Idempotent and quiet; safe to rerun.
#
#   scripts/setup_python.sh && .venv/bin/python scripts/reference_forward.py generate-fixtures
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

# Packages the Python scripts under scripts/ import. One per line; add new ones here.
PACKAGES=(
  numpy
  safetensors
  gguf
  tokenizers
  regex
)

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi

# Install only when something is missing, so a rerun costs no network access.
missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! "$VENV/bin/python" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi
