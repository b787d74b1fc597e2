#!/usr/bin/env bash
# Starts vLLM's OpenAI server (CPU build from scripts/setup_vllm.sh) on a Hugging Face model
# directory — our SmolLM2-135M conversion (`rollflash convert-gguf`) — with the RL routes on
# (VLLM_SERVER_DEV_MODE=1: /pause, /resume, /abort_requests, /collective_rpc,
# /reset_prefix_cache, /update_weight_version, /weight_info), the token-in/token-out route
# POST /inference/v1/generate (--enable-scale-out; it reports per-token weight-version spans), eager mode (no compile: ready in
# about 2 minutes instead of 6–11), float32 (what our trainer computes in), and
# `--logprobs-mode processed_logprobs`, so the log-probs it returns are those of the
# distribution it sampled from (after temperature, top-k/top-p), which a trainer reproduces.
#
#   scripts/start_vllm.sh MODEL_DIR PORT [extra vllm args...]
#
# Runs in the foreground (exec): start it in the background and poll GET /health. Prints
# nothing of its own on stdout. ROLLFLASH_CACHE_DIR as for setup_vllm.sh.
set -euo pipefail

if [ "$#" -lt 2 ]; then
  echo "usage: $0 MODEL_DIR PORT [extra vllm args...]" >&2
  exit 2
fi
MODEL="$1"
PORT="$2"
shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$ROOT/scripts/setup_vllm.sh")"

[ -f "$MODEL/config.json" ] || {
  echo "start_vllm.sh: $MODEL has no config.json (convert it first: rollflash convert-gguf)" >&2
  exit 2
}

# With ROLLFLASH_PARENT_PID set (the real-vLLM test sets its own pid), the server does not
# outlive that process: a test killed by a signal runs no destructor, and the test starts the
# server in a session of its own (so that it can end the server's whole process group), where
# no signal to the test's group reaches it. A watcher, forked before the exec below, ends this
# process group once the parent is gone: TERM, then KILL after 10 s.
if [ -n "${ROLLFLASH_PARENT_PID:-}" ]; then
  GROUP="$(ps -o pgid= -p $$ | tr -d ' ')"
  (
    trap '' TERM
    while kill -0 "$ROLLFLASH_PARENT_PID" 2>/dev/null; do sleep 2; done
    kill -TERM -- "-$GROUP" 2>/dev/null || true
    sleep 10
    kill -KILL -- "-$GROUP" 2>/dev/null || true
  ) </dev/null >/dev/null 2>&1 &
fi

export VLLM_SERVER_DEV_MODE=1
# The CPU backend: no usage reports from a test machine, a modest KV cache (GiB), the cores
# this machine has.
export VLLM_NO_USAGE_STATS=1
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
exec "$PY" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL" \
  --served-model-name "${VLLM_SERVED_NAME:-smollm2}" \
  --host 127.0.0.1 --port "$PORT" \
  --enforce-eager --dtype float32 \
  --logprobs-mode processed_logprobs \
  --enable-scale-out \
  --max-model-len "${VLLM_MAX_MODEL_LEN:-2048}" \
  --seed 0 \
  "$@"
