#!/usr/bin/env bash
# Makes the virtual environment scripts/bench_vs_trl.sh runs TRL's GRPOTrainer in: a PyPI torch
# used on the CPU, plus pinned transformers, trl, accelerate and datasets. Prints the python to
# run with on stdout; everything else goes to stderr. Idempotent: when the pinned versions
# already import (and a matmul works) it does nothing and needs no network.
#
#   PY="$(scripts/trl/setup_venv.sh)" && "$PY" scripts/trl/grpo_trl.py --help
#
# Where: ${ROLLFLASH_CACHE_DIR:-$HOME/.cache/rollflash}/trl-venv (its own venv, so the
# project's .venv and the vLLM venv keep their own transformers).
#
# torch by scripts/setup_torch.sh (into this venv: TORCH_VENV), which says why PyPI's CUDA build
# goes in without triton and cuda-bindings. About 5 GB on disk and a few minutes on a fast link.
#
# pip prints "ERROR: pip's dependency resolver ... torch 2.15.0 requires triton / cuda-bindings"
# while it installs: expected (those two are left out on purpose) and harmless.
#
# Exit status: 0 with the python on stdout; 3 when it cannot be made (no python3/venv, pip
# failed): the caller prints `SKIPPED: ...` with the reason on stderr.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${ROLLFLASH_CACHE_DIR:-$HOME/.cache/rollflash}"
VENV="${TRL_VENV:-$CACHE/trl-venv}"
PY="$VENV/bin/python"
# Pinned so the comparison is against a known TRL (GRPOConfig's names and defaults move between
# releases). Override any of them to try another.
TORCH_SPEC="${TORCH_SPEC:-torch==2.15.0}"
TRL_SPEC="${TRL_SPEC:-trl==1.16.0}"
TRANSFORMERS_SPEC="${TRANSFORMERS_SPEC:-transformers==5.23.0}"
ACCELERATE_SPEC="${ACCELERATE_SPEC:-accelerate==1.15.0}"
DATASETS_SPEC="${DATASETS_SPEC:-datasets==5.2.0}"

die() {
  echo "setup_venv.sh: $*" >&2
  exit 3
}

spec_version() { echo "${1#*==}"; }

stack_works() {
  "$PY" - "$(spec_version "$TORCH_SPEC")" "$(spec_version "$TRL_SPEC")" \
    "$(spec_version "$TRANSFORMERS_SPEC")" >/dev/null 2>&1 <<'EOF'
import sys
import torch, transformers, trl, accelerate, datasets, psutil  # noqa: F401
c = torch.randn(2, 2) @ torch.randn(2, 2)
assert c.shape == (2, 2)
want_torch, want_trl, want_tf = sys.argv[1:4]
assert torch.__version__.split("+")[0] == want_torch, torch.__version__
assert trl.__version__ == want_trl, trl.__version__
assert transformers.__version__ == want_tf, transformers.__version__
EOF
}

torch_works() {
  "$PY" -c 'import torch; assert (torch.randn(2, 2) @ torch.randn(2, 2)).shape == (2, 2)' >/dev/null 2>&1
}

command -v python3 >/dev/null 2>&1 || die "no python3 on PATH"
if [ ! -x "$PY" ]; then
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV" >&2 || die "could not create the virtual environment $VENV (python3 -m venv; on Debian: apt-get install python3-venv)"
fi

if stack_works; then
  echo "$PY"
  exit 0
fi

PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

# torch exactly as scripts/setup_torch.sh installs it, into this venv (a no-op when it works).
TORCH_VENV="$VENV" TORCH_SPEC="$TORCH_SPEC" "$ROOT/scripts/setup_torch.sh" >&2 \
  || die "torch could not be installed into $VENV (scripts/setup_torch.sh, reason above)"
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(spec_version "$TORCH_SPEC")')" >/dev/null 2>&1; then
  die "$VENV holds another torch than $TORCH_SPEC (remove the venv to rebuild it)"
fi
torch_works || die "torch is installed in $VENV but does not import (try: $PY -c 'import torch')"

echo "setup_venv.sh: installing $TRL_SPEC $TRANSFORMERS_SPEC $ACCELERATE_SPEC $DATASETS_SPEC into $VENV" >&2
# --no-deps, then their own requirements without torch: a resolver that saw torch again would
# pull in the triton and cuda-bindings wheels skipped above.
STACK=("$TRL_SPEC" "$TRANSFORMERS_SPEC" "$ACCELERATE_SPEC" "$DATASETS_SPEC")
"${PIP[@]}" --no-deps "${STACK[@]}" >&2 \
  || die "pip could not install ${STACK[*]} (is PyPI reachable?)"
mapfile -t stack_reqs < <("$PY" - <<'EOF'
from importlib.metadata import requires

try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

seen = set()
for pkg in ("trl", "transformers", "accelerate", "datasets"):
    for line in requires(pkg) or []:
        r = Requirement(line)
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        name = r.name.lower().replace("_", "-")
        if name in ("torch", "trl", "transformers", "accelerate", "datasets") or name in seen:
            continue
        seen.add(name)
        print(str(r).split(";")[0].strip())
print("psutil")
EOF
)
"${PIP[@]}" "${stack_reqs[@]}" >&2 \
  || die "pip could not install the requirements of ${STACK[*]}: ${stack_reqs[*]}"

if ! stack_works; then
  "$PY" -c 'import torch, transformers, trl; print(torch.__version__, transformers.__version__, trl.__version__)' >&2 || true
  die "the TRL stack is installed in $VENV but does not import at the pinned versions (see above)"
fi
echo "setup_venv.sh: $("$PY" -c 'import torch, transformers, trl; print("torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)') in $VENV" >&2
echo "$PY"
