#!/usr/bin/env bash
# The same short RL run twice, back to back on the same cores: SmolLM2-135M-Instruct learning
# reasoning-gym chain_sum (configs/reasoning_gym_chain_sum.toml), rollout once on a real vLLM
# server (`kind = "vllm"`: each version published to disk and reloaded by vLLM, served version
# read back) and once on the embedded engine. Prints each run's throughput, weight sync,
# train-inference mismatch and accounting, and the ratio of their throughputs.
#
#   scripts/bench_vllm_fleet.sh                  # STEPS=6 OUT=runs/bench_vllm PORT=8011
#
# Needs what the config's header lists (models/smollm2-hf, data/reasoning_gym) and vLLM's CPU
# build (scripts/setup_vllm.sh installs it). The vLLM server is stopped before the embedded run,
# so neither run shares the machine with the other's rollout. The binary is
# target/release/rollflash (cargo build --release first).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STEPS="${STEPS:-6}"
OUT="${OUT:-runs/bench_vllm}"
PORT="${PORT:-8011}"
BIN="$ROOT/target/release/rollflash"
READY_SECS="${READY_SECS:-900}"

die() { echo "bench_vllm_fleet.sh: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "no $BIN (cargo build --release)"
[ -f models/smollm2-hf/config.json ] || die "no models/smollm2-hf (see configs/reasoning_gym_chain_sum.toml)"
[ -f data/reasoning_gym/chain_sum_train.jsonl ] || die "no data/reasoning_gym (see configs/reasoning_gym_chain_sum.toml)"
rm -rf "$OUT"
mkdir -p "$OUT"

scripts/start_vllm.sh models/smollm2-hf "$PORT" >"$OUT/vllm.log" 2>&1 &
VLLM=$!
trap 'kill $VLLM 2>/dev/null || true' EXIT
start=$(date +%s)
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 "$VLLM" 2>/dev/null || die "vLLM exited while starting (see $OUT/vllm.log)"
  [ $(($(date +%s) - start)) -lt "$READY_SECS" ] || die "vLLM not ready after $READY_SECS s (see $OUT/vllm.log)"
  sleep 2
done
echo "vLLM ready in $(($(date +%s) - start)) s" >&2

COMMON=(--config configs/reasoning_gym_chain_sum.toml --set "train.steps=$STEPS"
  --set train.eval_problems=0 --set metrics.progress=false --set metrics.report=false)
"$BIN" train "${COMMON[@]}" --set "output_dir=$OUT/vllm" --set rollout.engines=0 \
  --set "rollout.servers=[{kind=\"vllm\", url=\"http://127.0.0.1:$PORT\", max_running_requests=32}]" \
  >"$OUT/vllm-run.log" 2>&1 || die "the vLLM run failed (see $OUT/vllm-run.log)"
kill "$VLLM"
wait "$VLLM" 2>/dev/null || true
"$BIN" train "${COMMON[@]}" --set "output_dir=$OUT/embedded" \
  >"$OUT/embedded-run.log" 2>&1 || die "the embedded run failed (see $OUT/embedded-run.log)"

python3 - "$OUT" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
def load(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if l.strip()]
    wall = rows[-1]["elapsed_s"]
    samples = sum(r["samples"] for r in rows) if "samples" in rows[0] else None
    sync = [r["weight_sync_ms"] for r in rows]
    kl = [r["behav_kl"] for r in rows if r.get("behav_kl") is not None]
    return dict(steps=len(rows), wall=wall, samples=samples,
                sps=statistics.median(r["samples_per_s"] for r in rows),
                tps=statistics.median(r["tokens_per_s"] for r in rows),
                sync_med=statistics.median(sync), sync_min=min(sync), sync_max=max(sync),
                kl=statistics.median(kl) if kl else float("nan"),
                run_sps=samples / wall,
                ridle=statistics.median(r["rollout_idle"] for r in rows),
                tidle=statistics.median(r["trainer_idle"] for r in rows),
                acc=next((l.strip() for l in open(f"{out}/{name}-run.log") if l.startswith("samples:")), "no accounting line"),
                reward_first=rows[0]["reward"], reward_last=rows[-1]["reward"])
v, e = load("vllm"), load("embedded")
for name, r in (("vLLM server", v), ("embedded engine", e)):
    print(f"{name:16} {r['steps']} steps in {r['wall']:.1f} s ({r['run_sps']:.2f} samples/s); median per step {r['sps']:.2f} samples/s, "
          f"{r['tps']:.0f} tokens/s; weight sync median {r['sync_med']:.0f} ms ({r['sync_min']:.0f}-{r['sync_max']:.0f}); "
          f"idle: rollout {r['ridle']:.0%}, trainer {r['tidle']:.0%}; behav_kl median {r['kl']:.2e}; reward {r['reward_first']:.3f} -> {r['reward_last']:.3f}; {r['acc']}")
print(f"vLLM / embedded: whole-run samples/s x{v['run_sps'] / e['run_sps']:.2f}, "
      f"median step samples/s x{v['sps'] / e['sps']:.2f}")
EOF
