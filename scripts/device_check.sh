#!/usr/bin/env bash
# The device check (issues 16 and 33), run on a lent GPU machine from a bundle prepared here
# (scripts/build_gpu_bundle.sh): no download, no compile. That machine reaches no network and
# has no Rust toolchain; it has the NVIDIA driver, CUDA 13 (its libraries as the nvidia-*
# wheels of the image's PyTorch) and python3 with torch. Four parts, each with its own time
# limit, so one hang cannot eat the rest:
#   env       what the machine is (nvidia-smi, its glibc beside the one the binary needs, the
#             CUDA library folders found), the bundle's SHA-256s, the binary's libraries and
#             start-up, torch's version and CUDA
#   logprobs  the training forward's per-token log-probs, GPU vs CPU, same weights and tokens
#             (4 x 128): the warmed-up built-in model and seeded random weights of SmolLM2-135M,
#             Qwen2.5-0.5B and Qwen2.5-1.5B's shapes. Tolerances:
#               GPU f32:  max |d| <= 2e-3
#               GPU bf16: mean |d| <= 0.1 and max |d| <= 1.0  (bf16 weights, f32 log-softmax)
#   bench     `rollflash bench-engine` (decode at batch 1/16/64, prefill, training steps of
#             8 x 128 tokens) in f32 and bf16 for the three shapes, beside the image's PyTorch
#             (bench_torch.py) on the same shapes, and each line's ratio ours/PyTorch
#   train     a short `rollflash train` of the built-in task on the GPU from the warmed-up
#             built-in model: every step's sample accounting must balance and its reward be
#             recorded
# Writes $OUT/summary.txt (what to read), $OUT/details.log (every command's output) and
# $OUT/train_metrics.jsonl. Exit status: 0 when every part passed, else the sum of the failed
# parts' bits: env 1, logprobs 2, bench 4, train 8.
#
#   scripts/device_check.sh --bundle gpu-bundle            # on the GPU machine (~5-9 minutes)
#   scripts/device_check.sh --bundle gpu-bundle --dry-run  # here, on the CPU: every step that
#       needs no GPU (bundle integrity, the binary against the toolkit and the driver's link
#       stub, which must refuse model.device = "cuda:0" naming the field, the CPU side of
#       `logprobs`, `bench`'s commands on the CPU at tiny sizes, ours and PyTorch's, and
#       `train` on the CPU), so the first GPU minutes are not spent on a typo
#
# Options: --bundle DIR [gpu-bundle], --out DIR [$OUT, else runs/device_check], --dry-run,
# --parts LIST [env,logprobs,bench,train; env always runs]. Environment: DEVICE [cuda:0],
# THREADS [nproc], TORCH_PYTHON [python3, else .venv/bin/python], the parts' limits in seconds
# ENV_S [45], LOGPROBS_S [150], BENCH_S [270], TRAIN_S [120], and for --dry-run the toolkit of
# scripts/check_cuda_build.sh (ROLLFLASH_CUDA_CACHE [.cache/cuda-13.4]).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUNDLE="$ROOT/gpu-bundle"
OUTDIR="${OUT:-$ROOT/runs/device_check}"
DRY=0
PARTS="env,logprobs,bench,train"
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE="${2:?--bundle needs a folder}"; shift 2 ;;
    --out) OUTDIR="${2:?--out needs a folder}"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --parts) PARTS="env,${2:?--parts needs a list}"; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (--bundle DIR, --out DIR, --dry-run, --parts LIST)" >&2; exit 2 ;;
  esac
done
BUNDLE="$(cd "$BUNDLE" 2>/dev/null && pwd)" || { echo "device_check.sh: no bundle folder (make one with scripts/build_gpu_bundle.sh)" >&2; exit 2; }
DEVICE="${DEVICE:-cuda:0}"
THREADS="${THREADS:-$(nproc)}"
ENV_S="${ENV_S:-45}" LOGPROBS_S="${LOGPROBS_S:-150}" BENCH_S="${BENCH_S:-270}" TRAIN_S="${TRAIN_S:-120}"
CACHE="${ROLLFLASH_CUDA_CACHE:-$ROOT/.cache/cuda-13.4}"
# A dry run does every step on this machine's few cores, which are far slower than the
# device's 16 and whose time is not lent: its limits are 4 times the device's.
SCALE=1
[ "$DRY" = 1 ] && { DEVICE=cpu; SCALE=4; }
SHAPES=(smollm2-135m qwen2.5-0.5b qwen2.5-1.5b)

mkdir -p "$OUTDIR"
SUMMARY="$OUTDIR/summary.txt"
DETAILS="$OUTDIR/details.log"
: >"$SUMMARY"
: >"$DETAILS"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# The binary travels gzipped (scripts/build_gpu_bundle.sh): unpacked here, checked below.
BIN="$WORK/rollflash"
{ gzip -dc "$BUNDLE/bin/rollflash.gz" >"$BIN" 2>/dev/null \
  || python3 -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$BUNDLE/bin/rollflash.gz" "$BIN"; } && chmod +x "$BIN"
say() { echo "$*" | tee -a "$SUMMARY"; }
FAILED=0
fail() { # fail BIT MESSAGE
  FAILED=$(( FAILED | $1 ))
  say "FAIL: $2"
}
want() { [[ ",$PARTS," == *",$1,"* ]]; }

# Part deadlines: each command gets at most its own cap and what is left of its part.
PART_END=0
begin_part() {
  PART_END=$(( $(date +%s) + $2 * SCALE ))
  say "== $1 (limit $(( $2 * SCALE )) s)$([ "$DRY" = 1 ] && echo ', dry run on the CPU')"
}
# run_t CAP LABEL CMD...: runs CMD under a timeout, its output in $WORK/LABEL.out and the
# details log; returns its status (124 after a timeout, which it names).
run_t() {
  local cap=$(( $1 * SCALE )) label="$2"; shift 2
  local left=$(( PART_END - $(date +%s) ))
  [ "$left" -lt "$cap" ] && cap="$left"
  if [ "$cap" -lt 3 ]; then
    say "   $label: not run, no time left in this part"
    return 124
  fi
  echo "### $label: $*" >>"$DETAILS"
  local t0=$(date +%s) rc=0
  timeout -k 5 "$cap" "$@" >"$WORK/$label.out" 2>&1 || rc=$?
  cat "$WORK/$label.out" >>"$DETAILS"
  echo "### $label: exit $rc after $(( $(date +%s) - t0 )) s" >>"$DETAILS"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    say "   $label: TIMED OUT after $cap s"
    return 124
  fi
  return "$rc"
}

# ---- env ----------------------------------------------------------------------------------
begin_part env "$ENV_S"
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ), host: $(uname -srm), cores: $(nproc), threads: $THREADS"
lddv="$(ldd --version 2>&1)"
have_glibc="$(echo "${lddv%%$'\n'*}" | grep -oE '[0-9]+\.[0-9]+$')" || have_glibc=unknown
need_glibc="$(sed -n 's/^glibc_min: //p' "$BUNDLE/manifest.txt" 2>/dev/null)"
say "glibc: this machine $have_glibc, the binary needs >= ${need_glibc:-?} ($(sed -n 's/^commit: //p' "$BUNDLE/manifest.txt" 2>/dev/null), $(sed -n 's/^compute_cap: //p' "$BUNDLE/manifest.txt" 2>/dev/null))"
if [ -n "$need_glibc" ] && [ "$have_glibc" != unknown ] \
  && [ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | head -1)" != "$need_glibc" ]; then
  fail 1 "this machine's glibc $have_glibc is older than the $need_glibc the binary needs: rebuild the bundle against an older sysroot"
fi
if [ "$DRY" = 1 ]; then
  say "gpu: none (dry run)"
elif command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$SUMMARY"
else
  say "gpu: no nvidia-smi; trying $DEVICE anyway"
fi
if (cd "$BUNDLE" && sha256sum --quiet -c SHA256SUMS) >"$WORK/sums.out" 2>&1; then
  say "bundle: $BUNDLE, $(du -sb "$BUNDLE" | cut -f1) bytes, every SHA-256 matches"
else
  fail 1 "bundle files differ from SHA256SUMS: $(tr '\n' ' ' <"$WORK/sums.out")"
fi
want_sha="$(sed -n 's/^binary: .*sha256 //p' "$BUNDLE/manifest.txt" 2>/dev/null)"
have_sha="$(sha256sum "$BIN" 2>/dev/null | cut -d' ' -f1)"
if [ -z "$want_sha" ] || [ "$have_sha" != "$want_sha" ]; then
  fail 1 "the unpacked binary's SHA-256 ${have_sha:-(none)} is not the manifest's ${want_sha:-(none)}"
fi

# The CUDA libraries: the image's nvidia-* wheel folders (cu13 layout: nvidia/cu13/lib), a
# system toolkit's lib64; the driver's libcuda.so.1 from the system. In a dry run the toolkit
# of scripts/check_cuda_build.sh and its link stub stand in for them.
PY="${TORCH_PYTHON:-}"
if [ -z "$PY" ]; then
  for p in python3 "$ROOT/.venv/bin/python"; do
    if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then PY="$p"; break; fi
  done
fi
libdirs=()
if [ "$DRY" = 1 ]; then
  mkdir -p "$WORK/stub"
  ln -sf "$CACHE/py/nvidia/cu13/lib/stubs/libcuda.so" "$WORK/stub/libcuda.so.1"
  libdirs=("$CACHE/py/nvidia/cu13/lib" "$WORK/stub")
else
  for p in ${PY:-python3} python3; do
    while IFS= read -r d; do libdirs+=("$d"); done < <("$p" - 2>/dev/null <<'PYEOF'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "cu*", "lib")) + glob.glob(os.path.join(r, "*", "lib"))):
        if glob.glob(os.path.join(d, "lib*.so*")):
            print(d)
PYEOF
)
  done
  for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && libdirs+=("$d")
  done
fi
LIBPATH="$(printf '%s\n' "${libdirs[@]}" | awk 'NF && !seen[$0]++' | paste -sd:)"
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "cuda library folders: ${LIBPATH:-none found}"
STARTS=0
if missing="$(ldd "$BIN" 2>&1 | grep 'not found')"; then
  fail 1 "the binary's libraries are missing here: $(echo "$missing" | awk '{print $1}' | tr '\n' ' ')"
else
  ldd "$BIN" | grep -E 'libcuda|libcublas\.|libcurand|libnvrtc|libcudart' | awk '{print "   " $1 " -> " $3}' | tee -a "$SUMMARY"
  if run_t 20 version "$BIN" --version; then
    STARTS=1
    say "binary: $(cat "$WORK/version.out")"
  else
    fail 1 "the binary does not start: $(tail -3 "$WORK/version.out" | tr '\n' ' ')"
  fi
fi
TORCH_OK=0
if [ -n "$PY" ] && run_t 30 torch "$PY" -c "import torch; print(torch.__version__, 'cuda' if torch.cuda.is_available() else 'no-cuda', torch.version.cuda)"; then
  say "torch ($PY): $(tail -1 "$WORK/torch.out")"
  if [ "$DEVICE" = cpu ] || tail -1 "$WORK/torch.out" | grep -q ' cuda '; then TORCH_OK=1; fi
else
  say "torch: none importable (TORCH_PYTHON, python3, .venv): PyTorch columns SKIPPED"
fi
if [ "$DRY" = 1 ] && [ "$STARTS" = 1 ]; then
  # Against the link stub the cuda binary must refuse a GPU by the field's name, not crash.
  if run_t 30 refuse "$BIN" train --set model.device=cuda:0 --set warmup.steps=0 --set train.steps=1 \
      --set output_dir="$WORK/refuse"; then
    fail 1 "with the link stub, model.device = \"cuda:0\" was accepted"
  elif grep -q 'model.device' "$WORK/refuse.out"; then
    say "refusal: model.device = \"cuda:0\" refused naming the field: $(grep -m1 'model.device' "$WORK/refuse.out")"
  else
    fail 1 "model.device = \"cuda:0\" failed without naming the field: $(tail -2 "$WORK/refuse.out" | tr '\n' ' ')"
  fi
fi
if [ "$STARTS" != 1 ]; then
  say "device_check.sh: FAIL (status $FAILED): the binary cannot run here, the other parts are not run"
  exit "$FAILED"
fi

# ---- logprobs -----------------------------------------------------------------------------
# compare CPU.json OTHER.json DTYPE WHAT: the tolerances above; prints one line, fails on a miss.
compare() {
  python3 - "$@" <<'PY' | tee -a "$SUMMARY"
import json, sys
cpu_path, other_path, dtype, what = sys.argv[1:5]
cpu, other = json.load(open(cpu_path)), json.load(open(other_path))
if len(cpu) != len(other) or not cpu:
    print(f"   {what} {dtype}: FAIL (token counts {len(cpu)} vs {len(other)})")
    sys.exit(1)
d = [abs(a - b) for a, b in zip(cpu, other)]
mx, mean = max(d), sum(d) / len(d)
ok = mx <= 2e-3 if dtype == "f32" else (mean <= 0.1 and mx <= 1.0)
print(f"   {what}: {dtype} vs CPU f32 over {len(d)} tokens: max |d| {mx:.2e}, mean |d| {mean:.2e}: "
      f"{'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
}
# model_args NAME: sets MARGS to bench-engine's model flags for the built-in (warmed-up
# weights) or a shape (an array, so a bundle path with spaces stays one argument).
model_args() {
  if [ "$1" = builtin ]; then MARGS=(--model "$BUNDLE/builtin"); else MARGS=(--model "$BUNDLE/shapes/$1" --random-weights); fi
}
if want logprobs; then
  begin_part logprobs "$LOGPROBS_S"
  if [ "$DRY" = 1 ]; then lp_size=(--train-seqs 2 --train-len 32); else lp_size=(--train-seqs 4 --train-len 128); fi
  for m in builtin "${SHAPES[@]}"; do
    lp=(--no-decode "${lp_size[@]}" --threads "$THREADS" --logprobs-only)
    model_args "$m"
    if ! run_t 60 "lp-$m-cpu" "$BIN" bench-engine "${MARGS[@]}" "${lp[@]}" --device cpu --dtype f32 \
        --logprobs-out "$WORK/$m.cpu.json"; then
      fail 2 "$m: the CPU log-probs failed: $(tail -2 "$WORK/lp-$m-cpu.out" | tr '\n' ' ')"
      continue
    fi
    if [ "$DRY" = 1 ]; then
      compare "$WORK/$m.cpu.json" "$WORK/$m.cpu.json" f32 "$m (CPU against itself: the comparison runs)" || fail 2 "$m: comparison"
      continue
    fi
    for dt in f32 bf16; do
      if run_t 60 "lp-$m-$dt" "$BIN" bench-engine "${MARGS[@]}" "${lp[@]}" --device "$DEVICE" --dtype "$dt" \
          --logprobs-out "$WORK/$m.gpu.$dt.json"; then
        compare "$WORK/$m.cpu.json" "$WORK/$m.gpu.$dt.json" "$dt" "$m $DEVICE" || fail 2 "$m $dt log-probs out of tolerance"
      else
        fail 2 "$m $dt on $DEVICE failed: $(tail -2 "$WORK/lp-$m-$dt.out" | tr '\n' ' ')"
      fi
    done
  done
fi

# ---- bench --------------------------------------------------------------------------------
if want bench; then
  begin_part bench "$BENCH_S"
  if [ "$DRY" = 1 ]; then
    dtypes=(f32)
    size=(--batch 1 --prompt-len 4 --new-tokens 2 --train-seqs 1 --train-len 8 --train-steps 1)
  else
    dtypes=(f32 bf16)
    size=(--batch 1,16,64 --prompt-len 32 --new-tokens 32 --train-seqs 8 --train-len 128 --train-steps 2)
  fi
  for m in "${SHAPES[@]}"; do
    for dt in "${dtypes[@]}"; do
      ours=("$BIN" bench-engine --model "$BUNDLE/shapes/$m" --random-weights --device "$DEVICE" --dtype "$dt"
        --threads "$THREADS" "${size[@]}")
      theirs=("$PY" "$BUNDLE/bench_torch.py" --model "$BUNDLE/shapes/$m" --random-weights --device "$DEVICE"
        --dtype "$dt" --threads "$THREADS" "${size[@]}")
      if [ "$DRY" = 1 ] && [ "$m" != smollm2-135m ]; then
        # A 1.5B model's AdamW state does not fit a small CPU machine: decode and the
        # forward only.
        ours+=(--logprobs-out "$WORK/bench-$m.json" --logprobs-only)
        theirs+=(--skip-train)
      fi
      run_t 75 "bench-$m-$dt-ours" "${ours[@]}" || fail 4 "$m $dt: rollflash bench-engine failed: $(tail -2 "$WORK/bench-$m-$dt-ours.out" | tr '\n' ' ')"
      if [ "$TORCH_OK" = 1 ]; then
        run_t 75 "bench-$m-$dt-torch" "${theirs[@]}" || fail 4 "$m $dt: bench_torch.py failed: $(tail -2 "$WORK/bench-$m-$dt-torch.out" | tr '\n' ' ')"
      fi
    done
  done
  # Each measurement side by side, and the ratio ours / PyTorch.
  python3 - "$WORK" "$DEVICE" "${dtypes[*]}" "${SHAPES[@]}" <<'PY' | tee -a "$SUMMARY"
import os, re, sys
work, device, dtypes, shapes = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
pat = re.compile(r"^(decode batch +\d+|prefill batch +\d+|train step)\b.*?([\d.]+) tok/s")
def read(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            m = pat.search(line.strip())
            if m:
                out[re.sub(" +", " ", m.group(1))] = float(m.group(2))
    return out
print(f"   {'shape':<14}{'dtype':<6}{'measurement':<18}{'ours tok/s':>12}{'PyTorch':>12}{'ours/PyTorch':>14}")
for s in shapes:
    for dt in dtypes:
        ours = read(os.path.join(work, f"bench-{s}-{dt}-ours.out"))
        theirs = read(os.path.join(work, f"bench-{s}-{dt}-torch.out"))
        for k in list(dict.fromkeys(list(ours) + list(theirs))):
            a, b = ours.get(k), theirs.get(k)
            r = f"{a / b:.2f}x" if a and b else "-"
            fa = f"{a:.0f}" if a else "-"
            fb = f"{b:.0f}" if b else "-"
            print(f"   {s:<14}{dt:<6}{k:<18}{fa:>12}{fb:>12}{r:>14}")
PY
fi

# ---- train --------------------------------------------------------------------------------
if want train; then
  begin_part train "$TRAIN_S"
  steps=5
  [ "$DRY" = 1 ] && steps=2
  if run_t 110 train "$BIN" train --set model.path="$BUNDLE/builtin" --set warmup.steps=0 \
      --set model.device="$DEVICE" --set train.steps="$steps" --set output_dir="$WORK/train"; then
    cp "$WORK/train/metrics.jsonl" "$OUTDIR/train_metrics.jsonl" 2>/dev/null
    grep -E 'greedy eval|samples/s' "$WORK/train.out" | head -4 | sed 's/^/   /' | tee -a "$SUMMARY"
    python3 - "$WORK/train/metrics.jsonl" "$steps" <<'PY' | tee -a "$SUMMARY" || fail 8 "the train run's metrics do not add up"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "step" in r and "started" in r]
want = int(sys.argv[2])
ok = len(rows) == want
ended = ["trained", "filtered", "dropped_stale", "aborted", "failed", "running", "buffered"]
for r in rows:
    bal = r["started"] == sum(r[k] for k in ended)
    rew = isinstance(r.get("reward"), (int, float)) and math.isfinite(r["reward"])
    ok = ok and bal and rew
    print(f"   step {r['step']}: reward {r.get('reward')}, samples {r['samples']}, "
          f"started {r['started']} = ended {sum(r[k] for k in ended)}: {'balanced' if bal else 'UNBALANCED'}")
print(f"   {len(rows)} of {want} steps recorded: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
  else
    fail 8 "rollflash train on $DEVICE failed: $(tail -3 "$WORK/train.out" | tr '\n' ' ')"
  fi
fi

if [ "$FAILED" = 0 ]; then
  say "device_check.sh: PASS$([ "$DRY" = 1 ] && echo ' (dry run)'); summary $SUMMARY, details $DETAILS"
else
  say "device_check.sh: FAIL (status $FAILED: env 1, logprobs 2, bench 4, train 8); details $DETAILS"
fi
exit "$FAILED"
