#!/usr/bin/env bash
# The same RL run in TRL's GRPOTrainer and in `rollflash train`, one after the other on this
# machine's CPU: SmolLM2-135M-Instruct on reasoning-gym chain_sum (configs/reasoning_gym_chain_sum.toml),
# same model files, train and held-out rows, prompt token ids, grader (rollflash's verifier,
# which TRL calls through `rollflash verify --stdin`), group size, prompts per step, new tokens,
# temperature, learning rate and schedule, optimiser, steps and threads. Prints a markdown table
# per mode (wall time, trained samples/s, time per step split into generation and training,
# held-out greedy accuracy before/after, peak memory, and rollflash ÷ TRL), then every setting
# mapped between the two sides and each difference that could not be removed.
#
#   scripts/bench_vs_trl.sh [OUT]          # default OUT=runs/bench_vs_trl; ~30-40 min on 2 cores
#   SMOKE=1 scripts/bench_vs_trl.sh        # 1 step, 2 prompts × 2 samples, 8 new tokens, 4 eval problems
#
# Runs, in order: rollflash synchronous (α = 0: `controller.sync=true buffer.alpha=0`), TRL (fed the prompts
# that run trained on, step by step, and checking its prompt ids against rollflash's), rollflash
# asynchronous (α = 1, the default). TRL has no asynchronous mode on the CPU (its
# experimental AsyncGRPOTrainer generates on a vLLM server only), so the async table sets
# rollflash's α = 1 against the same synchronous TRL run, and says so.
#
# Installs what it needs: TRL's venv (scripts/trl/setup_venv.sh: pinned torch, transformers and
# trl under ${ROLLFLASH_CACHE_DIR:-~/.cache/rollflash}/trl-venv, ~5 GB from PyPI), the data
# (scripts/make_reasoning_gym_data.sh), the model (scripts/fetch_smollm2.sh + convert-gguf) and
# the binary (cargo build --release) when missing. Where the TRL side cannot be had (no python3,
# the install fails) it prints `SKIPPED: why` and exits 0.
#
# Variables (defaults in brackets): STEPS [10] PROMPTS [4] GROUP [8] MAX_NEW [40] TEMP [1.0]
# LR [2e-5] WARMUP [5] MICRO [8] EVAL [100] TRL_THREADS [2] RF_TRAIN_THREADS [2] RF_ENGINES [2]
# RF_ENGINE_THREADS [1] RUNS ["grad rf_sync trl_sync rf_async"] ROLLFLASH_BIN [target/release/rollflash]
# SEED [0: both sides' random draws — rollflash's `seed`, TRL's `--seed`; the prompts stay the
# config's `env.shuffle_seed` order, so seeds differ only in the samples drawn]
# VERIFIER_STUB [0: 1 grades TRL with scripts/trl/verifier_stub.py, for plumbing tests only;
# the table then flags the grader as different].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${1:-${OUT:-runs/bench_vs_trl}}"

if [ "${SMOKE:-0}" = 1 ]; then
  STEPS="${STEPS:-1}" PROMPTS="${PROMPTS:-2}" GROUP="${GROUP:-2}" MAX_NEW="${MAX_NEW:-8}" EVAL="${EVAL:-4}"
  WARMUP="${WARMUP:-1}" MICRO="${MICRO:-4}"
fi
STEPS="${STEPS:-10}"
PROMPTS="${PROMPTS:-4}"
GROUP="${GROUP:-8}"
MAX_NEW="${MAX_NEW:-40}"
TEMP="${TEMP:-1.0}"
LR="${LR:-2e-5}"
WARMUP="${WARMUP:-5}"
MICRO="${MICRO:-8}"
EVAL="${EVAL:-100}"
TRL_THREADS="${TRL_THREADS:-2}"
RF_TRAIN_THREADS="${RF_TRAIN_THREADS:-2}"
RF_ENGINES="${RF_ENGINES:-2}"
RF_ENGINE_THREADS="${RF_ENGINE_THREADS:-1}"
RUNS="${RUNS:-grad rf_sync trl_sync rf_async}"
VERIFIER_STUB="${VERIFIER_STUB:-0}"
SEED="${SEED:-0}"
BIN="${ROLLFLASH_BIN:-$ROOT/target/release/rollflash}"
MODEL="models/smollm2-hf"
DATA="data/reasoning_gym"
TRAIN="$DATA/chain_sum_train.jsonl"
TEST="$DATA/chain_sum_test.jsonl"
CONFIG="configs/reasoning_gym_chain_sum.toml"
# Prompt + response budget: far above any chain_sum prompt (~70 tokens with SmolLM2's default
# system turn) plus MAX_NEW, so only max_new_tokens bounds a response, as on TRL's side.
MAX_TOTAL=$((MAX_NEW + 256))

say() { echo "bench_vs_trl.sh: $*" >&2; }
die() { say "$*"; exit 1; }
skip() { echo "SKIPPED: $*"; exit 0; }

# --- TRL's python ------------------------------------------------------------------------
command -v python3 >/dev/null 2>&1 || skip "no python3 on PATH for TRL's side"
PY="$(scripts/trl/setup_venv.sh)" || skip "TRL's virtual environment could not be made (scripts/trl/setup_venv.sh, reason above)"

# --- the binary, data and model ----------------------------------------------------------
if [ ! -x "$BIN" ]; then
  command -v cargo >/dev/null 2>&1 || die "no $BIN and no cargo to build it"
  say "building $BIN (cargo build --release)"
  cargo build --release >&2
fi
[ -x "$BIN" ] || die "no $BIN"
if [ ! -f "$TRAIN" ] || [ ! -f "$TEST" ]; then
  say "making $DATA (scripts/make_reasoning_gym_data.sh)"
  scripts/make_reasoning_gym_data.sh "$DATA" >&2 || skip "the chain_sum data could not be made (scripts/make_reasoning_gym_data.sh)"
fi
if [ ! -f "$MODEL/config.json" ]; then
  say "making $MODEL (scripts/fetch_smollm2.sh, then rollflash convert-gguf)"
  GGUF="$(scripts/fetch_smollm2.sh)" || skip "SmolLM2 could not be fetched (scripts/fetch_smollm2.sh)"
  "$BIN" convert-gguf "$GGUF" "$MODEL" >&2
fi

# --- the grader --------------------------------------------------------------------------
if [ "$VERIFIER_STUB" = 1 ]; then
  VERIFIER="$PY $ROOT/scripts/trl/verifier_stub.py"
  say "VERIFIER_STUB=1: TRL is graded by scripts/trl/verifier_stub.py, not rollflash's verifier (plumbing test only)"
else
  VERIFIER="$BIN verify --stdin --extract boxed,last_number"
  probe='{"reference": "7", "response": "so the answer is 7"}'
  got="$(printf '%s\n' "$probe" | timeout 60 $VERIFIER 2>/dev/null | head -n 1)" || true
  case "$got" in
    *'"reward"'*) ;;
    *) die "$BIN has no working \`verify --stdin\` (answered '${got}'); rebuild it, or VERIFIER_STUB=1 for a plumbing test" ;;
  esac
fi

rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" - "$OUT/settings.json" <<EOF
import json, os, sys
json.dump({
    "label": "SMOKE" if "${SMOKE:-0}" == "1" else "full",
    "steps": $STEPS, "prompts": $PROMPTS, "group": $GROUP, "max_new": $MAX_NEW, "max_total": $MAX_TOTAL,
    "temperature": $TEMP, "lr": $LR, "warmup": $WARMUP, "micro": $MICRO, "eval": $EVAL,
    "trl_threads": $TRL_THREADS, "rf_train_threads": $RF_TRAIN_THREADS, "rf_engines": $RF_ENGINES,
    "rf_engine_threads": $RF_ENGINE_THREADS, "seed": $SEED, "model": "$MODEL", "train": "$TRAIN", "test": "$TEST",
    "verifier": "$VERIFIER".replace("$ROOT/", ""), "verifier_stub": "$VERIFIER_STUB" == "1",
    "cores": os.cpu_count(), "runs": "$RUNS".split(),
}, open(sys.argv[1], "w"), indent=2)
EOF

MEASURE=("$PY" "$ROOT/scripts/trl/measure.py")

rollflash_run() { # NAME, then extra --set overrides
  local name="$1"
  shift
  local sets=(
    output_dir="$OUT/$name"
    seed="$SEED"
    train.steps="$STEPS"
    buffer.groups_per_batch="$PROMPTS"
    buffer.group_size="$GROUP"
    rollout.max_new_tokens="$MAX_NEW"
    rollout.max_total_tokens="$MAX_TOTAL"
    rollout.temperature="$TEMP"
    rollout.top_p=1.0
    train.lr="$LR"
    train.lr_warmup_steps="$WARMUP"
    train.micro_batch_size="$MICRO"
    train.threads="$RF_TRAIN_THREADS"
    rollout.engines="$RF_ENGINES"
    rollout.engine_threads="$RF_ENGINE_THREADS"
    train.eval_problems="$EVAL"
    train.eval_samples=0
    train.eval_every=0
    metrics.progress=false
    metrics.report=false
    checkpoint.final=false
    dashboard.trajectories_per_step=$((PROMPTS * GROUP))
    "$@"
  )
  local args=()
  for s in "${sets[@]}"; do args+=(--set "$s"); done
  say "rollflash $name: $BIN train --config $CONFIG ${args[*]}"
  "${MEASURE[@]}" "$OUT/$name.measure.json" -- "$BIN" train --config "$CONFIG" "${args[@]}" \
    >"$OUT/$name.log" 2>&1 || say "rollflash $name failed (exit $?): tail of $OUT/$name.log:
$(tail -n 20 "$OUT/$name.log")"
}

trl_run() {
  local order=()
  [ -f "$OUT/rf_sync/trajectories.jsonl" ] && order=(--order "$OUT/rf_sync")
  say "TRL trl_sync: $PY scripts/trl/grpo_trl.py (log: $OUT/trl_sync.log)"
  "${MEASURE[@]}" "$OUT/trl_sync.measure.json" -- "$PY" scripts/trl/grpo_trl.py \
    --model "$MODEL" --train "$TRAIN" --test "$TEST" --verifier "$VERIFIER" --out "$OUT/trl_sync" \
    --steps "$STEPS" --prompts "$PROMPTS" --group "$GROUP" --micro "$MICRO" --max-new "$MAX_NEW" \
    --temperature "$TEMP" --lr "$LR" --warmup "$WARMUP" --threads "$TRL_THREADS" --eval "$EVAL" --seed "$SEED" \
    "${order[@]}" >"$OUT/trl_sync.log" 2>&1 || say "TRL failed (exit $?): tail of $OUT/trl_sync.log:
$(tail -n 30 "$OUT/trl_sync.log")"
}

# The first step's gradient, rollflash's against PyTorch's of TRL's loss on the same samples
# (scripts/trl/grad_check.py): one synchronous step that logs every trajectory and writes the
# step's checkpoint, whose AdamW first moment holds rollflash's gradient.
grad_run() {
  rollflash_run rf_grad controller.sync=true buffer.alpha=0 train.steps=1 train.eval_problems=0 \
    checkpoint.every=1
  say "grad: $PY scripts/trl/grad_check.py (log: $OUT/grad_check.log)"
  # One forward and backward of 32 short sequences: minutes at most on a slow machine.
  timeout -k 10 1200 "$PY" scripts/trl/grad_check.py "$OUT/rf_grad" "$MODEL" "$OUT/grad_check.json" \
    --threads "$TRL_THREADS" >"$OUT/grad_check.log" 2>&1 || say "grad check failed (exit $?): tail of $OUT/grad_check.log:
$(tail -n 20 "$OUT/grad_check.log")"
}

for run in $RUNS; do
  start=$(date +%s)
  case "$run" in
    grad) grad_run ;;
    rf_sync) rollflash_run rf_sync controller.sync=true buffer.alpha=0 ;;
    rf_async) rollflash_run rf_async controller.sync=false buffer.alpha=1 ;;
    trl_sync) trl_run ;;
    *) die "unknown run '$run' in RUNS (grad, rf_sync, trl_sync, rf_async)" ;;
  esac
  say "$run done in $(($(date +%s) - start)) s"
done

python3 scripts/trl/compare.py "$OUT"
say "results: $OUT/results.md and $OUT/results.json"
