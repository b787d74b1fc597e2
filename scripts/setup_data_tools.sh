#!/usr/bin/env bash
# Creates (or reuses) .venv-data in the repo root with the pinned Python packages of the data
# scripts: reasoning-gym (task generators, scripts/make_reasoning_gym_data.py) and HF
# math-verify (the reference grader of scripts/verifier_agreement.py). A separate venv from
# .venv, so these pins never move the reference scripts' packages. Idempotent; exits non-zero
# (with a message) when PyPI cannot be reached, so callers can skip.
#
#   scripts/setup_data_tools.sh && .venv-data/bin/python scripts/make_reasoning_gym_data.py --help
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-data"

# name==version; the versions the committed fixtures and BENCHMARKS.md numbers came from.
PACKAGES=(
  "reasoning-gym==0.1.25"
  "math-verify[antlr4_13_2]==0.9.0"
)

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi

missing=()
for spec in "${PACKAGES[@]}"; do
  name="${spec%%[*}"; name="${name%%==*}"; want="${spec##*==}"
  have="$("$VENV/bin/python" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)"
  if [ "$have" != "$want" ]; then
    missing+=("$spec")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}"; then
    echo "setup_data_tools: could not install ${missing[*]} from PyPI" >&2
    exit 1
  fi
fi
