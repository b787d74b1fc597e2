#!/usr/bin/env bash
# Training through a Tinker server, measured side by side in one invocation: where the
# learner's step time goes (protocol vs server compute, from the `tinker_*` metrics of each
# step), and α = 1 against the synchronous baseline with sampling on the server's own
# sampler (one process: nothing can overlap) and on an embedded engine here that loads each
# version's adapter as the server exports it (sampling here, training there).
#
#   scripts/bench_tinker.sh [STEPS] [REPEATS]      (defaults 12 and 2)
#
# Needs the release binary (`cargo build --release`) and the SkyRL server install
# (scripts/setup_tinker_server.sh; started here on port 8795 serving the default run's
# warmed-up built-in model, stopped at the end). Runs alternate (A, B, C, A, B, C, …) so a
# drift of the machine reaches every variant alike. Prints one line per run and a table of
# medians with their ranges; everything else goes to $OUT (default /tmp/bench-tinker).
set -euo pipefail

STEPS="${1:-12}"
REPEATS="${2:-2}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/target/release/rollflash"
OUT="${OUT:-/tmp/bench-tinker}"
PORT="${PORT:-8795}"
URL="http://127.0.0.1:$PORT"
[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"

# The default run's warm-up (600 supervised steps of the built-in model): the directory the
# server serves and the engine starts from.
"$BIN" train --set train.steps=1 --set train.eval_problems=0 --set metrics.progress=false \
  --set metrics.report=false --set "warmup.cache_dir=\"$OUT/warmup-cache\"" \
  --set "output_dir=\"$OUT/warmup-run\"" >"$OUT/warmup.log" 2>&1
MODEL="$(dirname "$(ls "$OUT"/warmup-cache/*/model.safetensors | head -1)")"
echo "warmed-up model: $MODEL" >&2

"$ROOT/scripts/start_tinker_server.sh" "$PORT" "$OUT/server" "$MODEL" >&2
trap 'kill -TERM "$(cat "$OUT/server/server.pid")" 2>/dev/null || true' EXIT

common=(--config "$ROOT/configs/tinker.toml" --set "learner.url=\"$URL\""
  --set "train.steps=$STEPS" --set train.eval_problems=0 --set metrics.progress=false
  --set metrics.report=false --set checkpoint.final=false)
sampler=(--set "rollout.servers=[{ kind = \"tinker\", url = \"$URL\", max_running_requests = 32 }]")
engine=(--set rollout.servers=[] --set rollout.engines=1 --set "model.path=\"$MODEL\"")
sync=(--set controller.sync=true --set buffer.alpha=0)

run() { # NAME ARGS...
  local name="$1" dir
  shift
  dir="$OUT/runs/$name-$(date +%s%N)"
  "$BIN" train "${common[@]}" "$@" --set "output_dir=\"$dir\"" >"$dir.log" 2>&1 ||
    { echo "run $name failed, see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
  python3 - "$name" "$dir" <<'EOF'
import json, sys
name, d = sys.argv[1], sys.argv[2]
s = json.load(open(f"{d}/summary.json"))
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if l.strip()]
steps = [r for r in rows if "tinker_step_s" in r]
tot = lambda k: sum(r.get(k, 0.0) for r in steps)
step = tot("tinker_step_s") or 1.0
print(json.dumps({"variant": name, "wall_s": s["wall_s"], "samples_per_s": s["samples_per_s"],
    "steps": len(steps), "learner_step_s": step / max(len(steps), 1),
    "wait": tot("tinker_wait_s") / step, "codec": tot("tinker_codec_s") / step,
    "backoff": tot("tinker_backoff_s") / step, "local": tot("tinker_local_s") / step,
    "requests_per_step": tot("tinker_requests") / max(len(steps), 1),
    "mb_out_per_step": tot("tinker_mb_out") / max(len(steps), 1),
    "mb_in_per_step": tot("tinker_mb_in") / max(len(steps), 1)}))
EOF
}

mkdir -p "$OUT/runs"
for _ in $(seq "$REPEATS"); do
  run sampler-sync "${sampler[@]}" "${sync[@]}"
  run sampler-alpha1 "${sampler[@]}"
  run engine-sync "${engine[@]}" "${sync[@]}"
  run engine-alpha1 "${engine[@]}"
done | tee "$OUT/runs.jsonl"

python3 - "$OUT/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault(r["variant"], []).append(r)
med = lambda v, k: statistics.median(x[k] for x in v)
rng = lambda v, k: f"{min(x[k] for x in v):.2f}–{max(x[k] for x in v):.2f}"
print("\n| variant | samples/s (median, range) | vs its sync | learner step s | wait | codec | backoff | local | requests/step | MB out/in per step |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, v in by.items():
    base = by.get(name.split("-")[0] + "-sync")
    ratio = med(v, "samples_per_s") / med(base, "samples_per_s") if base else float("nan")
    print(f"| {name} | {med(v, 'samples_per_s'):.2f} ({rng(v, 'samples_per_s')}) | {ratio:.2f} | "
          f"{med(v, 'learner_step_s'):.2f} | {med(v, 'wait'):.3f} | {med(v, 'codec'):.4f} | "
          f"{med(v, 'backoff'):.3f} | {med(v, 'local'):.3f} | {med(v, 'requests_per_step'):.1f} | "
          f"{med(v, 'mb_out_per_step'):.3f} / {med(v, 'mb_in_per_step'):.3f} |")
EOF
