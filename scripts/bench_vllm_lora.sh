#!/usr/bin/env bash
# LoRA RL on a real vLLM server, the weights synced two ways on the same server and cores:
# adapter only (each version a PEFT directory loaded with /v1/load_lora_adapter, the base
# loaded once) and the merged model (each version a whole safetensors reloaded with
# reload_weights), at LoRA rank 8 and 32. SmolLM2-135M-Instruct on reasoning-gym chain_sum
# (configs/reasoning_gym_chain_sum.toml). Prints per run: weight-sync ms per update, bytes
# written per update, throughput, behav_kl (train-inference mismatch), reward, accounting.
#
#   scripts/bench_vllm_lora.sh        # STEPS=6 OUT=runs/bench_vllm_lora PORT=8012
#
# Needs models/smollm2-hf, data/reasoning_gym (see the config's header) and vLLM's CPU build
# (scripts/setup_vllm.sh). One vLLM server for all four runs, started with runtime LoRA; the
# adapter runs go first, because a merged run leaves its last merged weights as the server's
# base. The binary is target/release/rollflash (cargo build --release first).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STEPS="${STEPS:-6}"
OUT="${OUT:-runs/bench_vllm_lora}"
PORT="${PORT:-8012}"
BIN="$ROOT/target/release/rollflash"
READY_SECS="${READY_SECS:-900}"

die() { echo "bench_vllm_lora.sh: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "no $BIN (cargo build --release)"
[ -f models/smollm2-hf/config.json ] || die "no models/smollm2-hf (see configs/reasoning_gym_chain_sum.toml)"
[ -f data/reasoning_gym/chain_sum_train.jsonl ] || die "no data/reasoning_gym (see configs/reasoning_gym_chain_sum.toml)"
rm -rf "$OUT"
mkdir -p "$OUT"

VLLM_ALLOW_RUNTIME_LORA_UPDATING=True setsid scripts/start_vllm.sh models/smollm2-hf "$PORT" \
  --enable-lora --max-lora-rank 32 --max-loras 2 >"$OUT/vllm.log" 2>&1 &
VLLM=$!
trap 'kill -- -$VLLM 2>/dev/null || true' EXIT
trap 'exit 143' INT TERM
start=$(date +%s)
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 "$VLLM" 2>/dev/null || die "vLLM exited while starting (see $OUT/vllm.log)"
  [ $(($(date +%s) - start)) -lt "$READY_SECS" ] || die "vLLM not ready after $READY_SECS s (see $OUT/vllm.log)"
  sleep 2
done
echo "vLLM ready in $(($(date +%s) - start)) s" >&2

run() { # name weights rank
  local name="$1" weights="$2" rank="$3"
  echo "run $name" >&2
  "$BIN" train --config configs/reasoning_gym_chain_sum.toml --set "train.steps=$STEPS" \
    --set train.eval_problems=0 --set train.eval_every=0 --set metrics.progress=false \
    --set metrics.report=false --set train.lr=2e-4 \
    --set "train.lora={rank=$rank, alpha=$((2 * rank))}" \
    --set "output_dir=$OUT/$name" --set rollout.engines=0 \
    --set "rollout.weights_dir=$OUT/$name/published" \
    --set "rollout.servers=[{kind=\"vllm\", url=\"http://127.0.0.1:$PORT\", max_running_requests=32, weights=\"$weights\"}]" \
    >"$OUT/$name-run.log" 2>&1 || die "run $name failed (see $OUT/$name-run.log)"
}
run adapter-r8 disk 8
run adapter-r32 disk 32
run merged-r8 merged 8
run merged-r32 merged 32

python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
print("| run | weight sync per update, ms: median (min-max) | bytes per update | whole-run samples/s | behav_kl median | reward first -> last | accounting |")
print("| --- | ---: | ---: | ---: | ---: | --- | --- |")
for name in ("adapter-r8", "adapter-r32", "merged-r8", "merged-r32"):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if l.strip()]
    sync = [r["weight_sync_ms"] for r in rows]
    kl = [r["behav_kl"] for r in rows if r.get("behav_kl") is not None]
    pub = f"{out}/{name}/published"
    dirs = [os.path.join(pub, d) for d in os.listdir(pub) if os.path.isdir(os.path.join(pub, d))]
    nbytes = max(size(d) for d in dirs) if dirs else 0
    samples = sum(r["samples"] for r in rows)
    acc = next((l.strip() for l in open(f"{out}/{name}-run.log") if l.startswith("samples:")), "no accounting line")
    print(f"| {name} | {statistics.median(sync):.0f} ({min(sync):.0f}-{max(sync):.0f}) | {nbytes/1e6:.1f} MB | "
          f"{samples / rows[-1]['elapsed_s']:.2f} | {statistics.median(kl) if kl else float('nan'):.2e} | "
          f"{rows[0]['reward']:.3f} -> {rows[-1]['reward']:.3f} | {acc} |")
PY
