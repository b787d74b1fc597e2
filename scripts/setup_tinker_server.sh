#!/usr/bin/env bash
# Installs an open Tinker server (SkyRL 0.4.0 with its JAX backend, which runs on CPU) and the
# official tinker 0.25.0 SDK into a Python 3.12 virtual environment in a cache directory, and
# builds the tiny random Qwen3 model it serves (offline, deterministic; scripts/tinker/make_tiny_qwen3.py).
# Idempotent: a finished install is reused without network access.
#
# On stdout, one `KEY=VALUE` line each (for `eval`/the tests):
#   TINKER_VENV=…   the venv (its bin/ has python and uv)
#   TINKER_MODEL=…  the tiny model directory (a Hugging Face directory: config, safetensors, tokenizer)
#   TINKER_JAX_CACHE=…  the persistent JAX compilation cache start_tinker_server.sh uses
# The rest goes to stderr. About 6.3 GB (a CUDA torch that `peft` pulls in) and a minute the first time.
#
# Exit codes: 2 = no Python 3.12 on this machine (skyrl 0.4.0 requires >=3.12), 3 = the install
# failed (PyPI unreachable?), 4 = installed but does not import, 5 = the model build failed.
#
# Cache: $ROLLFLASH_CACHE_DIR, else $XDG_CACHE_HOME/rollflash, else ~/.cache/rollflash.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${ROLLFLASH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollflash}"
BASE="$CACHE/tinker"
# The versions are pinned together: skyrl 0.4.0's `tinker` extra pins tinker <0.26,>=0.25, and
# SDK 0.38 cannot sample against it (it expects `sample_sequence_ids`). `aiohttp` is missing
# from the extra (a packaging bug: the API dies at import without it).
SKYRL="skyrl[tinker,jax]==0.4.0"
TINKER_SDK="tinker==0.25.0"
UV_VERSION="uv==0.13.9"
VENV="$BASE/venv-skyrl-0.4.0"
MODEL="$BASE/tiny-qwen3"
JAX_CACHE="$BASE/jax-cache"
DONE="$VENV/.rollflash-installed"

report() {
  echo "TINKER_VENV=$VENV"
  echo "TINKER_MODEL=$MODEL"
  echo "TINKER_JAX_CACHE=$JAX_CACHE"
}

check() {
  "$VENV/bin/python" -c "import skyrl.tinker.api, skyrl.tinker.engine, tinker, aiohttp" >/dev/null 2>&1 \
    && [ -x "$VENV/bin/uv" ]
}

model_ok() {
  [ -f "$MODEL/.rollflash-built" ] && [ -f "$MODEL/model.safetensors" ] && [ -f "$MODEL/tokenizer.json" ]
}

if [ -f "$DONE" ] && check && model_ok; then
  report
  exit 0
fi

# Python 3.12: whatever `python3.12` is on PATH, else pyenv's 3.12.x (this image has 3.12.1).
PY312=""
if command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import venv' >/dev/null 2>&1; then
  PY312="$(command -v python3.12)"
fi
if [ -z "$PY312" ]; then
  for d in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*; do
    if [ -x "$d/bin/python3.12" ]; then
      PY312="$d/bin/python3.12"
    fi
  done
fi
if [ -z "$PY312" ]; then
  echo "setup_tinker_server.sh: no Python 3.12 found (neither python3.12 on PATH nor ${PYENV_ROOT:-$HOME/.pyenv}/versions/3.12*); skyrl 0.4.0 requires Python >=3.12" >&2
  exit 2
fi

mkdir -p "$BASE" "$JAX_CACHE"
# A lock: two test binaries may set up at once.
exec 9>"$BASE/setup.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi

if ! { [ -f "$DONE" ] && check; }; then
  rm -rf "$VENV"
  echo "setup_tinker_server.sh: creating $VENV with $PY312" >&2
  if ! "$PY312" -m venv "$VENV" >&2; then
    echo "setup_tinker_server.sh: $PY312 -m venv failed" >&2
    exit 2
  fi
  if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$UV_VERSION" >&2; then
    echo "setup_tinker_server.sh: pip could not install $UV_VERSION (is PyPI reachable?)" >&2
    exit 3
  fi
  # uv reads SSL_CERT_FILE, not pip.conf: hand it the CA bundle pip is configured with, if any.
  if [ -z "${SSL_CERT_FILE:-}" ]; then
    CERT="$("$VENV/bin/python" -m pip config get global.cert 2>/dev/null || true)"
    if [ -n "$CERT" ] && [ -f "$CERT" ]; then
      export SSL_CERT_FILE="$CERT"
    fi
  fi
  echo "setup_tinker_server.sh: installing $SKYRL $TINKER_SDK aiohttp (about 6.3 GB)" >&2
  if ! "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" "$SKYRL" "$TINKER_SDK" aiohttp >&2; then
    echo "setup_tinker_server.sh: uv could not install $SKYRL (is PyPI reachable?)" >&2
    exit 3
  fi
  if ! check; then
    echo "setup_tinker_server.sh: skyrl installed but does not import" >&2
    exit 4
  fi
  touch "$DONE"
fi

if ! model_ok; then
  rm -rf "$MODEL"
  echo "setup_tinker_server.sh: building the tiny random Qwen3 into $MODEL" >&2
  if ! HF_HUB_OFFLINE=1 "$VENV/bin/python" "$ROOT/scripts/tinker/make_tiny_qwen3.py" "$MODEL" >&2; then
    echo "setup_tinker_server.sh: building the tiny model failed" >&2
    exit 5
  fi
  touch "$MODEL/.rollflash-built"
fi
report
