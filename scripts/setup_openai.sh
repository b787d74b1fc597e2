#!/usr/bin/env bash
# Installs the official `openai` Python client into the project's virtual environment (.venv in
# the repo root, created if missing), for scripts/openai_client_check.py. Idempotent: a rerun
# with the package present costs no network access.
#
#   scripts/setup_openai.sh && .venv/bin/python scripts/openai_client_check.py --base-url http://127.0.0.1:30000
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi

if ! "$VENV/bin/python" -c "import openai" >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check openai
fi
"$VENV/bin/python" -c "import openai; print('openai', openai.__version__)"
