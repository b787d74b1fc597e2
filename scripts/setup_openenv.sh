#!/usr/bin/env bash
# Installs OpenEnv's server library (PyPI `openenv-core==0.3.0`, its dependencies pinned by
# scripts/openenv-constraints.txt) into a virtual environment in a cache directory, for
# scripts/openenv_guess.py (the OpenEnv environment the tests run). Idempotent: a finished
# install is reused without network access. Prints the venv's python on stdout; the rest goes
# to stderr. About 45 s and 480 MB the first time (gradio and fastmcp come with openenv-core).
#
#   PY="$(scripts/setup_openenv.sh)" && "$PY" scripts/openenv_guess.py --port 8100
#
# Cache: $ROLLFLASH_CACHE_DIR, else $XDG_CACHE_HOME/rollflash, else ~/.cache/rollflash.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="0.3.0"
CACHE="${ROLLFLASH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollflash}"
VENV="$CACHE/openenv-core-$VERSION"
DONE="$VENV/.rollflash-installed"

check() {
  "$VENV/bin/python" -c "import openenv.core.env_server, uvicorn" >/dev/null 2>&1
}

if [ -f "$DONE" ] && check; then
  echo "$VENV/bin/python"
  exit 0
fi

if ! command -v python3 >/dev/null 2>&1; then
  echo "setup_openenv.sh: no python3 found; cannot install openenv-core" >&2
  exit 2
fi
mkdir -p "$CACHE"
# A lock: two test binaries may set up at once.
exec 9>"$CACHE/openenv-setup.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi
if [ -f "$DONE" ] && check; then
  echo "$VENV/bin/python"
  exit 0
fi
rm -rf "$VENV"
if ! python3 -m venv "$VENV" >&2; then
  echo "setup_openenv.sh: python3 -m venv failed (is the venv module installed?)" >&2
  exit 2
fi
echo "setup_openenv.sh: installing openenv-core==$VERSION into $VENV" >&2
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  -c "$ROOT/scripts/openenv-constraints.txt" "openenv-core==$VERSION" >&2; then
  echo "setup_openenv.sh: pip could not install openenv-core==$VERSION (is PyPI reachable?)" >&2
  exit 3
fi
if ! check; then
  echo "setup_openenv.sh: openenv-core installed but does not import" >&2
  exit 4
fi
touch "$DONE"
echo "$VENV/bin/python"
