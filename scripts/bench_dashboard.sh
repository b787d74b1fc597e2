#!/usr/bin/env bash
# What the live dashboard costs a run: the default `rollflash train` (its warm-up taken from
# the cache, so only RL and the evaluations run) with the dashboard off, and on with a viewer
# polling it as the page does (the four JSON routes every 2 s), alternating, REPEATS times each.
# Prints each run's RL throughput and the ratio of medians (on / off).
#
#   scripts/bench_dashboard.sh     # REPEATS=2 OUT=runs/bench_dashboard PORT=8687 [WARMUP_CACHE=DIR]
#
# The first run fills the warm-up cache if it is empty (minutes); it is not counted. Needs
# target/release/rollflash (cargo build --release). Measure on a quiet machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REPEATS="${REPEATS:-2}"
OUT="${OUT:-runs/bench_dashboard}"
PORT="${PORT:-8687}"
BIN="$ROOT/target/release/rollflash"
[ -x "$BIN" ] || { echo "bench_dashboard.sh: no $BIN (cargo build --release)" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"
# The warm-up cache: the run's default unless WARMUP_CACHE names another.
COMMON=(--set metrics.progress=false)
[ -n "${WARMUP_CACHE:-}" ] && COMMON+=(--set "warmup.cache_dir=$WARMUP_CACHE")

"$BIN" train "${COMMON[@]}" --set "output_dir=$OUT/fill" --set train.steps=1 \
  --set train.eval_problems=0 >"$OUT/fill.log" 2>&1

viewer() { # polls the dashboard at PORT as the page does, until killed
  local base="http://127.0.0.1:$PORT"
  while true; do
    for route in metrics timeline trajectories live; do
      curl -s -o /dev/null "$base/api/$route" &
    done
    wait
    sleep 2
  done
}

for i in $(seq "$REPEATS"); do
  "$BIN" train "${COMMON[@]}" --set "output_dir=$OUT/off-$i" >"$OUT/off-$i.log" 2>&1
  viewer &
  V=$!
  "$BIN" train "${COMMON[@]}" --set "output_dir=$OUT/on-$i" --dashboard "127.0.0.1:$PORT" \
    >"$OUT/on-$i.log" 2>&1
  kill "$V"
  wait "$V" 2>/dev/null || true
done

python3 - "$OUT" "$REPEATS" <<'EOF'
import re, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
def sps(name):
    for line in open(f"{out}/{name}.log"):
        m = re.match(r"throughput: ([0-9.]+) trained samples/s", line)
        if m:
            return float(m.group(1))
    raise SystemExit(f"{name}: no throughput line")
off = [sps(f"off-{i}") for i in range(1, n + 1)]
on = [sps(f"on-{i}") for i in range(1, n + 1)]
print(f"dashboard off: {' '.join(f'{x:.1f}' for x in off)} trained samples/s (median {statistics.median(off):.1f})")
print(f"dashboard on + viewer: {' '.join(f'{x:.1f}' for x in on)} (median {statistics.median(on):.1f})")
print(f"on / off: x{statistics.median(on) / statistics.median(off):.3f}")
EOF
