#!/usr/bin/env bash
# The embedded learner against the Tinker learner on the same real model, task and data:
# SmolLM2-135M-Instruct on reasoning-gym chain_sum (configs/reasoning_gym_chain_sum.toml),
# LoRA rank 8 with alpha 32 on both sides (SkyRL fixes alpha at 32), the same learning rate,
# loss, batches and seed; rollout on one embedded engine here in both runs (on the Tinker run
# it loads each version's adapter as the server exports it). One run trains here; the other
# on a local SkyRL 0.4.0 Tinker server (JAX on this CPU) serving models/smollm2-hf. The
# server is stopped before the embedded run, so neither shares the cores with the other.
# Prints per run: wall, trained samples/s, learner step time, weight sync, behav_kl, reward.
#
#   scripts/bench_tinker_smollm2.sh        # STEPS=4 OUT=/tmp/bench-tinker-smollm2 PORT=8796
#
# Needs models/smollm2-hf and data/reasoning_gym (see the config's header), Python 3.12 for
# the server (scripts/setup_tinker_server.sh), and target/release/rollflash.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STEPS="${STEPS:-4}"
OUT="${OUT:-/tmp/bench-tinker-smollm2}"
PORT="${PORT:-8796}"
URL="http://127.0.0.1:$PORT"
BIN="$ROOT/target/release/rollflash"
die() { echo "bench_tinker_smollm2.sh: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "no $BIN (cargo build --release)"
[ -f models/smollm2-hf/config.json ] || die "no models/smollm2-hf (see configs/reasoning_gym_chain_sum.toml)"
[ -f data/reasoning_gym/chain_sum_train.jsonl ] || die "no data/reasoning_gym (see configs/reasoning_gym_chain_sum.toml)"
rm -rf "$OUT"
mkdir -p "$OUT"

common=(--config configs/reasoning_gym_chain_sum.toml --set "train.steps=$STEPS"
  --set train.eval_problems=0 --set train.eval_every=0 --set metrics.progress=false
  --set metrics.report=false --set checkpoint.final=false --set train.lr=1e-4
  --set train.lr_warmup_steps=0 --set rollout.engines=1
  --set train.loss.pg_variant=\"decoupled_ppo\" --set train.loss.behav_imp_weight_cap=inf)

scripts/start_tinker_server.sh "$PORT" "$OUT/server" "$ROOT/models/smollm2-hf" >&2
trap 'kill -TERM "$(cat "$OUT/server/server.pid")" 2>/dev/null || true' EXIT
"$BIN" train "${common[@]}" --set "output_dir=\"$OUT/tinker\"" \
  --set "learner={kind=\"tinker\", url=\"$URL\", lora_rank=8, timeout_secs=1800}" \
  >"$OUT/tinker.log" 2>&1 || die "the Tinker run failed (see $OUT/tinker.log)"
kill -TERM "$(cat "$OUT/server/server.pid")"
sleep 3
"$BIN" train "${common[@]}" --set "output_dir=\"$OUT/embedded\"" \
  --set "train.lora={rank=8, alpha=32}" \
  >"$OUT/embedded.log" 2>&1 || die "the embedded run failed (see $OUT/embedded.log)"

python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
print("| learner | wall | trained samples/s | learner step s, median | weight sync ms, median | behav_kl median | reward per step |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
for name in ("tinker", "embedded"):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl") if l.strip()]
    s = json.load(open(f"{out}/{name}/summary.json"))
    step = [r.get("tinker_step_s", r.get("train_s")) for r in rows]
    step = [x for x in step if x is not None]
    kl = [r["behav_kl"] for r in rows if r.get("behav_kl") is not None]
    print(f"| {name} | {s['wall_s']:.1f} s | {s['samples_per_s']:.3f} | "
          f"{statistics.median(step) if step else float('nan'):.2f} | "
          f"{statistics.median(r['weight_sync_ms'] for r in rows):.0f} | "
          f"{statistics.median(kl) if kl else float('nan'):.2e} | "
          f"{' '.join('%.2f' % r['reward'] for r in rows)} |")
PY
