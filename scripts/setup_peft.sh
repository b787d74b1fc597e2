#!/usr/bin/env bash
# Installs Hugging Face `transformers` and `peft` (with a CPU-usable torch, through
# setup_torch.sh) into the project's virtual environment, for scripts/peft_check.py: the check
# that a LoRA adapter rollflash saved loads with the real `peft` package and gives our logits.
# Idempotent: does nothing (no network access) when both already import.
#
#   scripts/setup_peft.sh && .venv/bin/python scripts/peft_check.py --help
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
# Pinned so the check runs against a known PEFT (LoRA's definitions have been stable since 0.4).
PEFT_SPEC="${PEFT_SPEC:-peft==0.21.2}"

"$ROOT/scripts/setup_torch.sh"
if "$PY" -c 'import peft, transformers' >/dev/null 2>&1; then
  exit 0
fi
echo "setup_peft.sh: installing transformers and $PEFT_SPEC into $ROOT/.venv" >&2
"$PY" -m pip install --quiet --disable-pip-version-check transformers "$PEFT_SPEC" \
  || { echo "setup_peft.sh: pip could not install transformers and $PEFT_SPEC" >&2; exit 1; }
"$PY" -c 'import peft, transformers; print("setup_peft.sh: peft", peft.__version__, "transformers", transformers.__version__, "work", file=__import__("sys").stderr)'
