#!/usr/bin/env bash
# The GPU check (issue 16), for a machine with an NVIDIA GPU: builds rollflash with `cuda`
# (scripts/check_cuda_build.sh: the CUDA toolkit from PyPI, its own target dir), then, for the
# built-in default model and SmolLM2-135M-Instruct:
#   1. checks the training forward's per-token log-probs on the GPU against the CPU's (f32),
#      same weights, same 4 x 128 tokens, with these stated tolerances:
#        GPU f32:  max |Δ| <= 2e-3
#        GPU bf16: mean |Δ| <= 0.1 and max |Δ| <= 1.0  (bf16 weights, f32 log-softmax)
#   2. runs `rollflash bench-engine` on the GPU (decode at batch 1/16/64, prefill, training
#      steps of 16 x 128 tokens) in f32 and bf16;
#   3. runs the same shapes in PyTorch on the same GPU (scripts/bench_torch.py --device), with
#      $TORCH_PYTHON or the project's .venv (scripts/setup_torch.sh installs PyPI's CUDA torch),
#      printing SKIPPED where no CUDA torch imports.
# Prints a summary (also in $OUT/summary.txt); exits 1 when a log-prob check fails. Compiling
# candle's CUDA kernels takes most of the time on a first run (minutes on 16 cores); the checks
# and benchmarks take 2-4 minutes on an H200-class GPU. Not part of .ci/run (no GPU there).
#
#   scripts/device_check.sh
#   DEVICE=cuda:1 OUT=/tmp/dc CUDA_COMPUTE_CAP=80 scripts/device_check.sh
#
# Environment (defaults in brackets): DEVICE [cuda:0], OUT [runs/device_check], THREADS [8],
# TORCH_PYTHON [.venv/bin/python after scripts/setup_torch.sh], and check_cuda_build.sh's
# ROLLFLASH_CUDA_CACHE, CUDA_TARGET_DIR, CUDA_COMPUTE_CAP [90].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEVICE="${DEVICE:-cuda:0}"
OUT="${OUT:-$ROOT/runs/device_check}"
THREADS="${THREADS:-8}"
CACHE="${ROLLFLASH_CUDA_CACHE:-$ROOT/.cache/cuda-13.4}"
TARGET="${CUDA_TARGET_DIR:-$ROOT/.cache/target-cuda}"
die() { echo "device_check.sh: $*" >&2; exit 2; }
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  | sed 's/^/gpu: /' | tee -a "$SUMMARY" || echo "device_check.sh: no nvidia-smi; trying $DEVICE anyway" >&2

scripts/check_cuda_build.sh >&2 || die "the cuda build failed (scripts/check_cuda_build.sh)"
BIN="$TARGET/release/rollflash"
[ -x "$BIN" ] || die "no binary at $BIN after the build"
# The toolkit's runtime libraries (cuBLAS, cuRAND, NVRTC); the driver's libcuda comes from the
# system, never the link stub.
export LD_LIBRARY_PATH="$CACHE/py/nvidia/cu13/lib:$CACHE/py/nvidia/cu13/nvvm/lib64:${LD_LIBRARY_PATH:-}"

GGUF="$(scripts/fetch_smollm2.sh)" || die "could not fetch SmolLM2 (scripts/fetch_smollm2.sh)"
SMOL="$ROOT/models/smollm2-hf"
[ -f "$SMOL/config.json" ] || "$BIN" convert-gguf "$GGUF" "$SMOL" >&2

PY="${TORCH_PYTHON:-}"
if [ -z "$PY" ]; then
  if scripts/setup_torch.sh >&2; then PY="$ROOT/.venv/bin/python"; fi
fi
TORCH_OK=0
if [ -n "$PY" ] && "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  TORCH_OK=1
fi

# compare CPU.json GPU.json DTYPE WHAT: the tolerances above; prints one line, fails on a miss.
compare() {
  python3 - "$@" <<'PY' | tee -a "$SUMMARY"
import json, sys
cpu_path, gpu_path, dtype, what = sys.argv[1:5]
cpu, gpu = json.load(open(cpu_path)), json.load(open(gpu_path))
if len(cpu) != len(gpu) or not cpu:
    print(f"{what} {dtype}: FAIL (token counts {len(cpu)} vs {len(gpu)})")
    sys.exit(1)
d = [abs(a - b) for a, b in zip(cpu, gpu)]
mx, mean = max(d), sum(d) / len(d)
ok = mx <= 2e-3 if dtype == "f32" else (mean <= 0.1 and mx <= 1.0)
print(f"{what} log-probs, GPU {dtype} vs CPU f32 over {len(d)} tokens: max |d| {mx:.2e}, "
      f"mean |d| {mean:.2e}: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
}

fail=0
for model in default smollm2; do
  margs=()
  [ "$model" = smollm2 ] && margs=(--model "$SMOL")
  lp=(--no-decode --train-seqs 4 --train-len 128 --threads "$THREADS" --logprobs-only)
  "$BIN" bench-engine "${margs[@]}" "${lp[@]}" --device cpu --dtype f32 \
    --logprobs-out "$OUT/$model.cpu.json" >&2
  for dt in f32 bf16; do
    "$BIN" bench-engine "${margs[@]}" "${lp[@]}" --device "$DEVICE" --dtype "$dt" \
      --logprobs-out "$OUT/$model.gpu.$dt.json" >&2
    compare "$OUT/$model.cpu.json" "$OUT/$model.gpu.$dt.json" "$dt" "$model" || fail=1
  done
  if [ "$model" = smollm2 ]; then new=16; else new=64; fi
  for dt in f32 bf16; do
    say "== $model, $DEVICE, $dt: rollflash"
    "$BIN" bench-engine "${margs[@]}" --device "$DEVICE" --dtype "$dt" --threads "$THREADS" \
      --new-tokens "$new" --train-seqs 16 --train-len 128 --train-steps 3 2>&1 \
      | tee "$OUT/$model.rollflash.$dt.txt" | grep -E "decode batch|train step" | tee -a "$SUMMARY"
    if [ "$TORCH_OK" = 1 ]; then
      say "== $model, $DEVICE, $dt: PyTorch"
      targs=()
      [ "$model" = smollm2 ] && targs=(--model "$SMOL")
      "$PY" scripts/bench_torch.py "${targs[@]}" --device "$DEVICE" --dtype "$dt" --threads "$THREADS" \
        --new-tokens "$new" --train-seqs 16 --train-len 128 --train-steps 3 2>&1 \
        | tee "$OUT/$model.torch.$dt.txt" | grep -E "decode batch|train step" | tee -a "$SUMMARY"
    else
      say "== $model: PyTorch SKIPPED (no torch with CUDA at ${PY:-<none>})"
    fi
  done
done
say "device_check.sh: $([ "$fail" = 0 ] && echo PASS || echo FAIL); raw outputs in $OUT"
exit "$fail"
