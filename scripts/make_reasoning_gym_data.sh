#!/usr/bin/env bash
# Writes JSONL train/test files of reasoning-gym task families (basic_arithmetic, chain_sum,
# countdown) into OUT_DIR, from the pinned reasoning-gym==0.1.25 with a fixed seed, with the
# generator's own answers. Installs the package in .venv-data first (PyPI only).
#
#   scripts/make_reasoning_gym_data.sh data/rg                    # 2000 train + 200 test each
#   scripts/make_reasoning_gym_data.sh data/rg --tasks chain_sum --train 500 --seed 7
#   scripts/make_reasoning_gym_data.sh data/rg_1digit --tasks chain_sum --set max_digits=1
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [--tasks a,b] [--train N] [--test M] [--seed S] [--set FIELD=INT]" >&2
  exit 2
fi
"$ROOT/scripts/setup_data_tools.sh"
exec "$ROOT/.venv-data/bin/python" "$ROOT/scripts/make_reasoning_gym_data.py" "$@"
