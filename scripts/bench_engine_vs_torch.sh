#!/usr/bin/env bash
# Side-by-side benchmark: rollflash's engine (`rollflash bench-engine`) against the same model in
# PyTorch (scripts/bench_torch.py), same threads, same shapes, for the built-in default model and
# SmolLM2-135M. Each (model, side) runs --repeats times, alternating which side goes first; the
# table gives min / median / max of each metric and the ratio of medians (rollflash / PyTorch,
# all metrics are "higher is better", so > 1 means rollflash is faster).
#
#   scripts/bench_engine_vs_torch.sh                         # threads 2, 3 repeats, both models
#   scripts/bench_engine_vs_torch.sh --repeats 1 --models default
#
# Options (defaults in brackets):
#   --threads N            threads for both sides [2]
#   --repeats N            runs per model and side [3]
#   --models LIST          comma list of: default, smollm2 [default,smollm2]
#   --batch LIST           decode batch sizes [1,16,64]
#   --prompt-len N         prompt tokens per request [32]
#   --new-tokens N         tokens per request, built-in default model [64]
#   --train-seqs N / --train-len N / --train-steps N      built-in default model [16 / 128 / 3]
#   --smol-new-tokens N    tokens per request for SmolLM2 [16]   (batch 64 x 64 tokens is minutes)
#   --smol-train-seqs N    training sequences for SmolLM2 [4]    (16 x 128 needs ~14 GB on our side)
#   --smol-train-steps N   timed training steps for SmolLM2 [1] (after one warm-up step)
#   --isa native|avx2      the instruction set both sides run with [native]. avx2 measures, on an
#                          AVX-512 machine, how an AVX2-only one runs: rollflash is built without
#                          its `avx512` feature (in .cache/target-avx2) and PyTorch runs with
#                          ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
#                          ONEDNN_MAX_CPU_ISA=AVX2. Each run's "cpu kernels" line is checked.
#   --wait-idle SECS       before each run, wait up to SECS for the CPUs to be idle [0 = don't]
#   --log-dir DIR          keep every raw output there [a temp dir]
#
# Environment: TORCH_PYTHON (see below), ROLLFLASH_BIN (default target/release/rollflash; built with
# `cargo build --release -p rollflash` when missing). Both sides run with their default
# threading behaviour, and both spin-wait between parallel ops, so measure on a quiet machine:
# with another busy process on a 2-core machine, rollflash (candle's barrier pool) and PyTorch
# (OpenMP, ~8 ms stalls per small matmul) both slow down several-fold. On a busy machine,
# OMP_WAIT_POLICY=PASSIVE rescues PyTorch (but costs it ~25% when idle); for rollflash,
# CANDLE_NUM_THREADS=1 (elementwise ops on one thread; matmuls still use --threads) helps.
# Each run's line in the log records the CPU time other processes used during the run
# ("others busy"): numbers taken while something else was running are not comparable.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

THREADS=2
REPEATS=3
MODELS=default,smollm2
BATCH=1,16,64
PROMPT_LEN=32
NEW_TOKENS=64
TRAIN_SEQS=16
TRAIN_LEN=128
TRAIN_STEPS=3
SMOL_NEW_TOKENS=16
SMOL_TRAIN_SEQS=4
SMOL_TRAIN_STEPS=1
WAIT_IDLE=0
ISA=native
LOG_DIR=""

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --prompt-len) PROMPT_LEN="$2"; shift 2 ;;
    --new-tokens) NEW_TOKENS="$2"; shift 2 ;;
    --train-seqs) TRAIN_SEQS="$2"; shift 2 ;;
    --train-len) TRAIN_LEN="$2"; shift 2 ;;
    --train-steps) TRAIN_STEPS="$2"; shift 2 ;;
    --smol-new-tokens) SMOL_NEW_TOKENS="$2"; shift 2 ;;
    --smol-train-seqs) SMOL_TRAIN_SEQS="$2"; shift 2 ;;
    --smol-train-steps) SMOL_TRAIN_STEPS="$2"; shift 2 ;;
    --wait-idle) WAIT_IDLE="$2"; shift 2 ;;
    --isa) ISA="$2"; shift 2 ;;
    --log-dir) LOG_DIR="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench_engine_vs_torch.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "bench_engine_vs_torch.sh: $*" >&2; exit 1; }

case "$ISA" in
  native)
    BIN="${ROLLFLASH_BIN:-$ROOT/target/release/rollflash}"
    build=(cargo build --release -p rollflash) ;;
  avx2)
    BIN="${ROLLFLASH_BIN:-$ROOT/.cache/target-avx2/release/rollflash}"
    build=(env CARGO_TARGET_DIR="$ROOT/.cache/target-avx2" cargo build --release -p rollflash --no-default-features)
    export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ;;
  *) die "--isa must be native or avx2, not '$ISA'" ;;
esac
if [ ! -x "$BIN" ]; then
  echo "bench_engine_vs_torch.sh: $BIN missing; building it (${build[*]})" >&2
  "${build[@]}" >&2 || die "${build[*]} failed"
fi
# TORCH_PYTHON: a python whose torch to use instead of installing one into .venv (for example
# the cached vLLM venv's, ~/.cache/rollflash/vllm-venv/bin/python: torch 2.13, not the pinned
# 2.15; say which in any table).
if [ -n "${TORCH_PYTHON:-}" ]; then
  PY="$TORCH_PYTHON"
  "$PY" -c 'import torch' || die "TORCH_PYTHON=$PY cannot import torch"
else
  "$ROOT/scripts/setup_torch.sh" || die "no working PyTorch (scripts/setup_torch.sh failed)"
  PY="$ROOT/.venv/bin/python"
fi

SMOL_DIR="$ROOT/models/smollm2-hf"
if [[ ",$MODELS," == *,smollm2,* ]] && [ ! -f "$SMOL_DIR/config.json" ]; then
  gguf="$("$ROOT/scripts/fetch_smollm2.sh")" || die "scripts/fetch_smollm2.sh failed"
  "$BIN" convert-gguf "$gguf" "$SMOL_DIR" >&2 || die "convert-gguf $gguf failed"
fi

if [ -z "$LOG_DIR" ]; then
  LOG_DIR="$(mktemp -d -t rollflash-vs-torch.XXXXXX)"
fi
mkdir -p "$LOG_DIR"

# Jiffies of CPU time spent by everything (user+nice+system+irq+softirq+steal) since boot.
busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
own_jiffies() { # user+system of children of this shell that have been waited for
  awk '{print $14+$15+$16+$17}' "/proc/$$/stat"
}
wait_idle() {
  [ "$WAIT_IDLE" -gt 0 ] || return 0
  local deadline=$(( $(date +%s) + WAIT_IDLE ))
  while :; do
    local a b
    a=$(busy_jiffies); sleep 2; b=$(busy_jiffies)
    # < 10% of one CPU used by anything over 2 s counts as idle.
    if [ $(( b - a )) -lt $(( $(getconf CLK_TCK) * 2 / 10 )) ]; then return 0; fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "  (CPUs still busy after ${WAIT_IDLE}s of waiting; running anyway)" >&2
      return 0
    fi
  done
}

# run_one SIDE MODEL REPEAT ARGS...: runs one side once, output in $LOG_DIR/MODEL.SIDE.REPEAT.txt
run_one() {
  local side="$1" model="$2" rep="$3"; shift 3
  local out="$LOG_DIR/$model.$side.$rep.txt"
  wait_idle
  local b0 o0 t0 b1 o1 t1
  b0=$(busy_jiffies); o0=$(own_jiffies); t0=$(date +%s.%N)
  if [ "$side" = rollflash ]; then
    "$BIN" bench-engine "$@" >"$out" 2>&1 || { cat "$out" >&2; die "rollflash bench-engine failed ($model, repeat $rep)"; }
  else
    "$PY" "$ROOT/scripts/bench_torch.py" "$@" >"$out" 2>&1 || { cat "$out" >&2; die "bench_torch.py failed ($model, repeat $rep)"; }
  fi
  b1=$(busy_jiffies); o1=$(own_jiffies); t1=$(date +%s.%N)
  # CPU the benchmark did not use itself, as a share of one CPU over the run.
  local others
  others=$(awk -v b=$((b1 - b0)) -v o=$((o1 - o0)) -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { d = (b - o) / hz / (t1 - t0); if (d < 0) d = 0; printf "%.0f%%", 100 * d }')
  # Both sides print the instruction set their kernels ran with; --isa avx2 must get AVX2.
  local isa
  isa=$(grep -o 'cpu kernels: [a-z0-9_]*' "$out" | head -1 | cut -d' ' -f3)
  if [ "$ISA" = avx2 ] && [ "$isa" != avx2 ]; then
    die "$side ran with '${isa:-unknown}' kernels, not avx2 ($out)"
  fi
  printf '  %-9s %-8s repeat %s: %5.1f s, others busy %s of a CPU, %s kernels\n' \
    "$side" "$model" "$rep" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$others" "${isa:-unknown}" >&2
  echo "# others_busy $others" >>"$out"
}

IFS=',' read -r -a model_list <<<"$MODELS"
echo "bench_engine_vs_torch: threads $THREADS, repeats $REPEATS, models $MODELS, isa $ISA, logs in $LOG_DIR" >&2
echo "  OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset} CANDLE_NUM_THREADS=${CANDLE_NUM_THREADS:-unset}; $(nproc) CPUs; $("$PY" -c 'import torch; print("torch", torch.__version__)')" >&2
cmd_lines=()
for model in "${model_list[@]}"; do
  common=(--threads "$THREADS" --batch "$BATCH" --prompt-len "$PROMPT_LEN" --train-len "$TRAIN_LEN")
  case "$model" in
    default)
      common+=(--new-tokens "$NEW_TOKENS" --train-seqs "$TRAIN_SEQS" --train-steps "$TRAIN_STEPS") ;;
    smollm2)
      common+=(--model "$SMOL_DIR" --new-tokens "$SMOL_NEW_TOKENS" --train-seqs "$SMOL_TRAIN_SEQS"
        --train-steps "$SMOL_TRAIN_STEPS") ;;
    *) die "unknown model '$model' (default, smollm2)" ;;
  esac
  cmd_lines+=("$model: ${common[*]}")
  for ((r = 1; r <= REPEATS; r++)); do
    if (( r % 2 == 1 )); then order=(rollflash torch); else order=(torch rollflash); fi
    for side in "${order[@]}"; do
      run_one "$side" "$model" "$r" "${common[@]}"
    done
  done
done

"$PY" - "$LOG_DIR" "$REPEATS" "${model_list[@]}" <<'EOF'
import re, statistics, sys
from pathlib import Path

log_dir, repeats, models = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
dec = re.compile(r"decode batch\s+(\d+):\s+([\d.]+) tok/s .*prefill (\d+) tok in ([\d.]+) s")
pre = re.compile(r"prefill batch\s+(\d+):\s+([\d.]+) tok/s over")
trn = re.compile(r"train step \((\d+) x (\d+) tokens.*\): ([\d.]+) s, (\d+) tok/s")

def parse(text):
    m = {}
    for b, tps, ptok, ps in dec.findall(text):
        m[f"decode b{b} tok/s"] = float(tps)
        m[f"prefill b{b} tok/s"] = int(ptok) / float(ps) if float(ps) > 0 else float("nan")
    # The repeated prefill (timed over >= 0.5 s) replaces the single one timed with the decode.
    for b, tps in pre.findall(text):
        m[f"prefill b{b} tok/s"] = float(tps)
    for s, l, secs, tps in trn.findall(text):
        m[f"train {s}x{l} tok/s"] = float(tps)
    return m

def fmt(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"

def mmm(vals):
    if not vals:
        return "-"
    return f"{fmt(min(vals))} / {fmt(statistics.median(vals))} / {fmt(max(vals))}"

print()
print("rollflash vs PyTorch (min / median / max over repeats; ratio = median rollflash / median PyTorch)")
hdr = f"{'model':<8} {'metric':<18} {'rollflash':>24} {'PyTorch':>24} {'ratio':>6}"
print(hdr)
print("-" * len(hdr))
for model in models:
    runs = {side: [parse((log_dir / f"{model}.{side}.{r}.txt").read_text()) for r in range(1, repeats + 1)]
            for side in ("rollflash", "torch")}
    keys = list(dict.fromkeys(k for r in runs["rollflash"] + runs["torch"] for k in r))
    order = lambda k: (k.startswith("train"), k.startswith("prefill"), int(re.sub(r"\D", "", k.split()[1]) or 0))
    for k in sorted(keys, key=order):
        a = [r[k] for r in runs["rollflash"] if k in r]
        b = [r[k] for r in runs["torch"] if k in r]
        ratio = statistics.median(a) / statistics.median(b) if a and b else float("nan")
        print(f"{model:<8} {k:<18} {mmm(a):>24} {mmm(b):>24} {ratio:>6.2f}")
    busy = []
    for side in ("rollflash", "torch"):
        for r in range(1, repeats + 1):
            m = re.search(r"# others_busy (\d+)%", (log_dir / f"{model}.{side}.{r}.txt").read_text())
            if m:
                busy.append(int(m.group(1)))
    if busy and max(busy) > 10:
        print(f"{'':<8} (other processes used up to {max(busy)}% of a CPU during these runs: noisy)")
EOF
echo
for l in "${cmd_lines[@]}"; do echo "args, $l"; done
echo "raw outputs: $LOG_DIR"
