#!/usr/bin/env bash
# Makes Hugging Face `transformers` and `peft` importable, for scripts/peft_check.py: the check
# that a LoRA adapter rollflash saved loads with the real `peft` package and gives our logits.
# Prints the python to run the check with on stdout; everything else goes to stderr.
# Idempotent: does nothing (no network access) when they already import.
#
#   "$(scripts/setup_peft.sh)" scripts/peft_check.py --help
#
# Where: the project's .venv when it already has torch, transformers and peft (a developer who
# ran setup_torch.sh and this script before). Otherwise the cached vLLM venv of
# scripts/setup_vllm.sh, which the real-vLLM test installs anyway and which already holds a
# CPU-usable torch and transformers: only peft (and its one missing dependency, accelerate,
# both pure Python) is added, so the check costs CI no second 4.5 GB torch install.
# ROLLFLASH_SKIP_VLLM=1 keeps away from that venv (and then fails unless .venv has peft).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Pinned so the check runs against a known PEFT (LoRA's definitions have been stable since 0.4).
PEFT_SPEC="${PEFT_SPEC:-peft==0.21.2}"

die() {
  echo "setup_peft.sh: $*" >&2
  exit 1
}

peft_works() {
  "$1" -c 'import peft, transformers, torch, safetensors' >/dev/null 2>&1
}

LOCAL="$ROOT/.venv/bin/python"
if [ -x "$LOCAL" ] && peft_works "$LOCAL"; then
  echo "$LOCAL"
  exit 0
fi
[ "${ROLLFLASH_SKIP_VLLM:-}" = 1 ] \
  && die "ROLLFLASH_SKIP_VLLM=1 and $LOCAL lacks peft (run scripts/setup_torch.sh, then pip install transformers $PEFT_SPEC into .venv)"

PY="$("$ROOT/scripts/setup_vllm.sh")" || die "no python with torch and transformers (setup_vllm.sh failed, see above)"
if peft_works "$PY"; then
  echo "$PY"
  exit 0
fi
VENV="$(dirname "$(dirname "$PY")")"
echo "setup_peft.sh: installing $PEFT_SPEC into $VENV (torch and transformers as they are)" >&2
# uv keeps what is installed when it satisfies peft's requirements: torch stays vLLM's.
"$VENV/bin/uv" pip install --python "$PY" "$PEFT_SPEC" >&2 \
  || die "uv could not install $PEFT_SPEC into $VENV (is PyPI reachable?)"
peft_works "$PY" || die "peft is installed in $VENV but does not import"
echo "setup_peft.sh: $("$PY" -c 'import peft, transformers, torch; print("peft", peft.__version__, "transformers", transformers.__version__, "torch", torch.__version__)') in $VENV" >&2
echo "$PY"
