#!/usr/bin/env bash
# Installs a PyTorch that runs on the CPU into the project's virtual environment (.venv, created
# if absent), for scripts/bench_torch.py. Idempotent: when `import torch` and a matmul already
# work it does nothing (no network access).
#
#   scripts/setup_torch.sh && .venv/bin/python scripts/bench_torch.py
#
# Only PyPI is reachable here (no download.pytorch.org, so no `+cpu` wheel). PyPI's Linux x86_64
# `torch` wheel is a CUDA build, and its libraries (libtorch_cuda.so, linked from
# libtorch_python.so) need the CUDA runtime libraries to be present *at import time*, even on a
# machine without a GPU: with only the pure-Python dependencies, `import torch` fails with
# "libcublasLt.so.*[0-9] not found". So this script installs:
#   1. torch itself with --no-deps (~540 MB wheel),
#   2. its pure-Python dependencies (filelock, typing-extensions, sympy, networkx, jinja2,
#      fsspec, setuptools),
#   3. the nvidia-*/cuda-toolkit wheels torch's metadata asks for (~3 GB on disk: cudnn, cublas,
#      cusparse, cufft, nccl, ...), because the import needs their shared libraries. Skipped:
#      triton and cuda-bindings, which only GPU code paths (torch.compile, CUDA Python) use.
# Everything comes from PyPI; about 4.5 GB of .venv in total, a minute or two on a fast link.
#
# TORCH_SPEC overrides the torch requirement (default pinned so benchmark numbers are
# comparable across runs); TORCH_VENV another virtual environment (scripts/trl/setup_venv.sh's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TORCH_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
TORCH_SPEC="${TORCH_SPEC:-torch==2.15.0}"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

die() {
  echo "setup_torch.sh: $*" >&2
  exit 1
}

torch_works() {
  "$PY" - >/dev/null 2>&1 <<'EOF'
import torch
c = torch.randn(2, 2) @ torch.randn(2, 2)
assert c.shape == (2, 2)
EOF
}

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV" || die "could not create the virtual environment $VENV (python3 -m venv)"
fi

if torch_works; then
  exit 0
fi

# safetensors is what bench_torch.py loads Hugging Face weights with.
echo "setup_torch.sh: installing $TORCH_SPEC (CPU use) into $VENV" >&2
"${PIP[@]}" --no-deps "$TORCH_SPEC" || die "pip could not install $TORCH_SPEC (is PyPI reachable?)"
"${PIP[@]}" filelock 'typing-extensions>=4.13' 'sympy>=1.13.3' 'networkx>=2.5.1' jinja2 \
  'fsspec>=0.8.5' 'setuptools>=77.0.3' safetensors numpy \
  || die "pip could not install torch's pure-Python dependencies"

if ! torch_works; then
  # The CUDA build needs the CUDA shared libraries to import. Install exactly the Linux
  # requirements torch's own metadata names, minus triton and cuda-bindings.
  mapfile -t cuda_reqs < <("$PY" - <<'EOF'
from importlib.metadata import requires

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement

for line in requires("torch") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue  # an extra, or a marker that does not hold here
    name = r.name.lower().replace("_", "-")
    if name.startswith("nvidia-") or name == "cuda-toolkit":
        print(str(r).split(";")[0].strip())
EOF
  )
  if [ "${#cuda_reqs[@]}" -eq 0 ]; then
    "$PY" -c 'import torch' >&2 || true
    die "torch does not import and its metadata names no CUDA library packages to add"
  fi
  echo "setup_torch.sh: torch's PyPI wheel is a CUDA build and needs the CUDA libraries at import; installing ${cuda_reqs[*]} (~3 GB)" >&2
  "${PIP[@]}" "${cuda_reqs[@]}" || die "pip could not install the CUDA library wheels torch needs to import"
fi

if ! torch_works; then
  "$PY" -c 'import torch; print(torch.randn(2, 2) @ torch.randn(2, 2))' >&2 || true
  die "torch is installed in $VENV but does not work (see the error above)"
fi
echo "setup_torch.sh: $("$PY" -c 'import torch; print("torch", torch.__version__)') works in $VENV" >&2
