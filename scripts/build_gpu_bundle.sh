#!/usr/bin/env bash
# Prepares, on this CPU machine, everything a lent GPU machine lacks for the device check
# (issue 33): that machine reaches no network, has no Rust toolchain, and receives the working
# tree plus a few ignored folders of 64 MiB in all. So this script writes `gpu-bundle/`
# (ignored by git) holding only:
#   bin/rollflash.gz       rollflash built with `cuda` for sm_$CUDA_COMPUTE_CAP, stripped and
#                          gzipped (93 MB of mostly PTX text stripped; 26 MB gzipped):
#                          scripts/device_check.sh unpacks it and checks its SHA-256
#   builtin/               the built-in model after its supervised warm-up (weights, config,
#                          tokenizer): what the GPU's short `rollflash train` starts from
#   shapes/NAME/config.json  SmolLM2-135M, Qwen2.5-0.5B and Qwen2.5-1.5B's published dimensions
#                          (scripts/gpu_shapes): both sides build seeded random weights of them
#   bench_torch.py         the PyTorch reference the GPU's numbers are set beside
#   manifest.txt           what was built from what (commit, compute capability, the binary's
#                          dynamic libraries and newest GLIBC symbol), each file's size
#   SHA256SUMS             `sha256sum -c` input: scripts/device_check.sh checks it first
# and fails if the bundle exceeds $BUNDLE_LIMIT_MIB (60) MiB, if the binary needs a library
# the device image lacks (anything beyond the driver's libcuda.so.1, the CUDA 13 wheels'
# cuBLAS/cuBLASLt/cuRAND/cudart/NVRTC and the C runtime), or if it does not start.
#
#   scripts/build_gpu_bundle.sh                  # -> gpu-bundle/
#   scripts/build_gpu_bundle.sh --out /tmp/gb
#
# The cuda build is scripts/check_cuda_build.sh's (CUDA 13.4 toolkit from PyPI into
# .cache/cuda-13.4, its own target dir .cache/target-cuda): 12 minutes cold on the 2-core
# VM with nothing else running (45-87 beside other work), under a minute after a change to
# our crates. The warm-up is `rollflash train`'s own, cached as every run's
# is (about 3 minutes on two cores when not cached yet).
#
# Environment: BUNDLE_LIMIT_MIB [60], and check_cuda_build.sh's ROLLFLASH_CUDA_CACHE,
# CUDA_TARGET_DIR, CUDA_COMPUTE_CAP [90].
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUTDIR="$ROOT/gpu-bundle"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUTDIR="${2:?--out needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "build_gpu_bundle.sh: unknown argument $1 (--out DIR)" >&2; exit 2 ;;
  esac
done
LIMIT_MIB="${BUNDLE_LIMIT_MIB:-60}"
CACHE="${ROLLFLASH_CUDA_CACHE:-$ROOT/.cache/cuda-13.4}"
TARGET="${CUDA_TARGET_DIR:-$ROOT/.cache/target-cuda}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
die() { echo "build_gpu_bundle.sh: $*" >&2; exit 1; }
for tool in strip readelf objdump sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is needed (apt-get install binutils coreutils)"
done
start=$(date +%s)

# 1. The cuda binary.
ROLLFLASH_CUDA_CACHE="$CACHE" CUDA_TARGET_DIR="$TARGET" scripts/check_cuda_build.sh >&2 \
  || die "the cuda build failed (scripts/check_cuda_build.sh)"
SRC_BIN="$TARGET/release/rollflash"
build_s=$(( $(date +%s) - start ))

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/bundle"
mkdir -p "$STAGE/bin"
BIN="$WORK/rollflash"
strip -o "$BIN" "$SRC_BIN"

# 2. Its dynamic libraries: only what the device image has. The driver's libcuda.so.1 (never
# our link stub), the CUDA 13 libraries the image carries as nvidia-* wheels, and the C
# runtime.
allowed='^(libcuda\.so\.1|libcublas\.so\.13|libcublasLt\.so\.13|libcurand\.so\.10|libcudart\.so\.13|libnvrtc\.so\.13|libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libstdc\+\+\.so\.6|ld-linux-x86-64\.so\.2|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1)$'
needed="$(readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
[ -n "$needed" ] || die "readelf found no NEEDED entries in $BIN"
bad="$(echo "$needed" | grep -Ev "$allowed" || true)"
[ -z "$bad" ] || die "the binary needs libraries the device image does not have: $(echo $bad)"
echo "$needed" | grep -qx 'libcuda.so.1' || die "the binary does not link the driver (libcuda.so.1)"
# The newest glibc symbol version it needs: the device's glibc must be at least this (the
# device check prints the device's first, so a mismatch is named in its first second).
glibc="$(objdump -T "$BIN" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -Vu | tail -1)"
glibcxx="$(objdump -T "$BIN" | grep -o 'GLIBCXX_[0-9][0-9.]*' | sort -Vu | tail -1 || true)"

# The binary must start here against the toolkit's libraries and a libcuda.so.1 that is the
# link stub (it reports "no driver" when asked for a GPU; the CPU paths run).
STUB="$WORK/stub"
mkdir -p "$STUB"
ln -s "$CACHE/py/nvidia/cu13/lib/stubs/libcuda.so" "$STUB/libcuda.so.1"
export LD_LIBRARY_PATH="$CACHE/py/nvidia/cu13/lib:$STUB:${LD_LIBRARY_PATH:-}"
version="$("$BIN" --version)" || die "the stripped binary does not start (ldd: $(ldd "$BIN" | grep 'not found' | tr '\n' ' '))"

# Sent gzipped: candle's kernels are embedded as PTX text, which compresses about 3.5x.
gzip -9 -n -c "$BIN" >"$STAGE/bin/rollflash.gz"
bin_sha="$(sha256sum "$BIN" | cut -d' ' -f1)"

# 3. The built-in model after its warm-up: `rollflash train`'s own warm-up, from the shared
# cache when an earlier run made it. One RL step after it (train.steps must be >= 1); the
# folder the plan names is what is copied.
cache_line="$("$BIN" train --dry-run | grep -o 'warm-up cache [^ ]*' | head -1 || true)"
[ -n "$cache_line" ] || die "\`rollflash train --dry-run\` names no warm-up cache"
warm="${cache_line#warm-up cache }"
if [ ! -f "$warm/model.safetensors" ]; then
  echo "build_gpu_bundle.sh: running the default warm-up (cached in $warm)" >&2
  "$BIN" train --set train.steps=1 --set output_dir="$WORK/warmup-run" >"$WORK/warmup.log" 2>&1 \
    || { tail -20 "$WORK/warmup.log" >&2; die "the warm-up run failed"; }
fi
[ -f "$warm/model.safetensors" ] || die "no model.safetensors in the warm-up cache $warm"
mkdir -p "$STAGE/builtin"
for f in "$warm"/*; do
  case "$(basename "$f")" in
    *.json|*.safetensors|*.txt) cp "$f" "$STAGE/builtin/" ;;
  esac
done

# 4. Real shapes, and the PyTorch reference.
for d in scripts/gpu_shapes/*/; do
  name="$(basename "$d")"
  mkdir -p "$STAGE/shapes/$name"
  cp "$d/config.json" "$STAGE/shapes/$name/config.json"
done
cp scripts/bench_torch.py "$STAGE/bench_torch.py"

# 5. Manifest and checksums.
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
dirty="$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ' (uncommitted changes)' || true)"
(
  cd "$STAGE"
  {
    echo "# rollflash GPU bundle (scripts/build_gpu_bundle.sh), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "version: $version"
    echo "commit: $commit$dirty"
    echo "compute_cap: sm_$CUDA_COMPUTE_CAP"
    echo "toolkit: $("$CACHE/py/nvidia/cu13/bin/nvcc" --version | grep -o 'release [0-9.]*' || echo unknown)"
    echo "needed: $(echo $needed)"
    echo "binary: bin/rollflash.gz unpacks to $(stat -c %s "$BIN") bytes, sha256 $bin_sha"
    echo "glibc_min: ${glibc#GLIBC_}"
    [ -z "$glibcxx" ] || echo "glibcxx_min: ${glibcxx#GLIBCXX_}"
    echo "built_on: $(ldd --version | head -1)"
    echo "files (bytes, path):"
    find . -type f ! -name manifest.txt ! -name SHA256SUMS | sort | while read -r f; do
      printf '  %10d %s\n' "$(stat -c %s "$f")" "${f#./}"
    done
    echo "payload: $(du -cb --apparent-size $(find . -type f) | tail -1 | cut -f1) bytes"
  } >manifest.txt
  find . -type f ! -name SHA256SUMS | sort | sed 's|^\./||' | xargs sha256sum >SHA256SUMS
)
bytes="$(du -sb "$STAGE" | cut -f1)"
limit=$(( LIMIT_MIB * 1024 * 1024 ))
mib="$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
[ "$bytes" -le "$limit" ] || die "the bundle is $mib MiB, over the $LIMIT_MIB MiB limit (files: $(cd "$STAGE" && du -ab . | sort -rn | head -5 | tr '\n' ' '))"

rm -rf "$OUTDIR"
mkdir -p "$(dirname "$OUTDIR")"
cp -r "$STAGE" "$OUTDIR"
echo "build_gpu_bundle.sh: OK, $OUTDIR: $mib MiB (limit $LIMIT_MIB), binary needs glibc >= ${glibc#GLIBC_}; cuda build $build_s s, total $(( $(date +%s) - start )) s" >&2
cat "$OUTDIR/manifest.txt"
