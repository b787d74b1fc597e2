#!/usr/bin/env bash
# Creates (or reuses) .venv-tb in the repo root with a pinned `tensorboard`, whose event reader
# (scripts/read_tensorboard.py) checks the event files `metrics.tensorboard = true` writes. A
# separate venv from .venv, so tensorboard's protobuf/numpy pins never move the reference
# scripts' packages. Idempotent: a rerun with the package present costs no network access.
# Exits non-zero (with a message) when PyPI cannot be reached, so callers can skip.
#
#   scripts/setup_tensorboard.sh && .venv-tb/bin/python scripts/read_tensorboard.py RUN_DIR/tensorboard
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-tb"
WANT="2.21.0"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi

have="$("$VENV/bin/python" -m pip show tensorboard 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [ "$have" != "$WANT" ]; then
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "tensorboard==$WANT"; then
    echo "setup_tensorboard: could not install tensorboard==$WANT from PyPI" >&2
    exit 1
  fi
fi
"$VENV/bin/python" -c "import tensorboard; print('tensorboard', tensorboard.__version__)"
