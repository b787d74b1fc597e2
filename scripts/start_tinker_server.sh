#!/usr/bin/env bash
# Starts a SkyRL 0.4.0 Tinker server (JAX backend on CPU) on 127.0.0.1:PORT, serving MODEL_DIR
# (default: the tiny random Qwen3 that scripts/setup_tinker_server.sh builds), and waits until
# its engine is ready. Run setup first (this script calls it; a finished setup costs nothing).
#
#   scripts/start_tinker_server.sh PORT RUN_DIR [MODEL_DIR]
#
# RUN_DIR gets the server's own SQLite database, its checkpoints, `server.log`, and
# `server.pid`: the pid of the `uv` process, which leads its own process group. Stop the
# server with `kill -TERM $(cat RUN_DIR/server.pid)`: uv passes the signal on and API and
# engine exit within a second. (`kill -9 -- -PID` kills the whole group.)
#
# Why uv: the API starts its engine by re-running its parent's `uv run` command line
# (`skyrl/tinker/api.py` `_get_parent_uv_run_args`), so the parent must be a real `uv run`.
#
# Environment: TINKER_READY_TIMEOUT (seconds, default 300) bounds the wait;
# TINKER_BACKEND_CONFIG overrides the JAX backend's JSON settings; ROLLFLASH_PARENT_PID (a pid)
# stops the server when that process exits (see the watchdog below).
# Exit codes: 1 = usage, 2/3/4/5 = setup failed (see setup_tinker_server.sh), 6 = the server
# exited, 7 = not ready in time (the server is stopped), 8 = the port is taken.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: start_tinker_server.sh PORT RUN_DIR [MODEL_DIR]" >&2
  exit 1
fi
PORT="$1"
RUN_DIR="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

SETUP_OUT="$("$ROOT/scripts/setup_tinker_server.sh")" || exit $?
TINKER_VENV="$(printf '%s\n' "$SETUP_OUT" | sed -n 's/^TINKER_VENV=//p')"
TINKER_MODEL="$(printf '%s\n' "$SETUP_OUT" | sed -n 's/^TINKER_MODEL=//p')"
TINKER_JAX_CACHE="$(printf '%s\n' "$SETUP_OUT" | sed -n 's/^TINKER_JAX_CACHE=//p')"
MODEL="${3:-$TINKER_MODEL}"
if [ ! -f "$MODEL/config.json" ]; then
  echo "start_tinker_server.sh: $MODEL is not a Hugging Face model directory (no config.json)" >&2
  exit 1
fi

mkdir -p "$RUN_DIR/ckpt"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
LOG="$RUN_DIR/server.log"
PIDFILE="$RUN_DIR/server.pid"
URL="http://127.0.0.1:$PORT"

if curl -s -o /dev/null --max-time 2 "$URL/api/v1/healthz"; then
  echo "start_tinker_server.sh: something already answers on $URL" >&2
  exit 8
fi

# max_lora_adapters counts slot 0, reserved for base-model sampling: 6 leaves 5 training
# models (the tests create several fresh ones). The micro-batch and sampler sizes keep the
# number of JIT shapes small on CPU.
BACKEND_CONFIG="${TINKER_BACKEND_CONFIG:-{\"max_lora_adapters\": 6, \"max_lora_rank\": 8, \"train_micro_batch_size\": 4, \"sample_max_num_sequences\": 4}}"

# setsid: uv leads a new process group, so the caller can stop everything it started.
# The offline flags: there is no Hugging Face hub here, and uv must not try PyPI.
PATH="$TINKER_VENV/bin:$PATH" \
JAX_PLATFORMS=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 UV_OFFLINE=1 UV_NO_PROGRESS=1 \
JAX_COMPILATION_CACHE_DIR="$TINKER_JAX_CACHE" \
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 \
setsid "$TINKER_VENV/bin/uv" run --no-project --python "$TINKER_VENV/bin/python" -m skyrl.tinker.api \
  --host 127.0.0.1 --port "$PORT" \
  --base-model "$MODEL" --backend jax \
  --backend-config "$BACKEND_CONFIG" \
  --checkpoints-base "$RUN_DIR/ckpt" --database-url "sqlite:///$RUN_DIR/tinker.db" \
  >"$LOG" 2>&1 </dev/null &
PID=$!
echo "$PID" >"$PIDFILE"

# ROLLFLASH_PARENT_PID: a watchdog outside the server's process group stops the server when
# that process (a test binary) dies without stopping it, so a killed test leaves nothing
# running. It exits on its own once the server is gone. Its output goes to /dev/null: a
# caller reading this script's stdout to the end must not wait for it.
if [ -n "${ROLLFLASH_PARENT_PID:-}" ]; then
  (
    while kill -0 "$ROLLFLASH_PARENT_PID" 2>/dev/null && kill -0 "$PID" 2>/dev/null; do
      sleep 2
    done
    if kill -0 "$PID" 2>/dev/null; then
      kill -TERM "$PID" 2>/dev/null || true
      sleep 5
      kill -KILL -- "-$PID" 2>/dev/null || true
    fi
  ) </dev/null >/dev/null 2>&1 &
  disown
fi

stop_and_fail() {
  local code="$1" msg="$2"
  echo "start_tinker_server.sh: $msg (log: $LOG)" >&2
  tail -n 20 "$LOG" >&2 || true
  kill -TERM "$PID" 2>/dev/null || true
  sleep 1
  kill -KILL -- "-$PID" 2>/dev/null || true
  exit "$code"
}

# Ready = the API answers healthz *and* the engine has started. healthz answers before the
# engine is up (requests made then are queued and wait), so the engine's start line in the
# log is the second half.
DEADLINE=$(( $(date +%s) + ${TINKER_READY_TIMEOUT:-300} ))
healthy=0
while :; do
  if ! kill -0 "$PID" 2>/dev/null; then
    stop_and_fail 6 "the server exited during startup"
  fi
  if [ "$healthy" = 0 ] && curl -s -o /dev/null --max-time 2 "$URL/api/v1/healthz"; then
    healthy=1
  fi
  if [ "$healthy" = 1 ] && grep -q "Starting background engine" "$LOG"; then
    break
  fi
  if [ "$(date +%s)" -ge "$DEADLINE" ]; then
    if [ "$healthy" = 0 ]; then
      stop_and_fail 7 "$URL/api/v1/healthz did not answer within ${TINKER_READY_TIMEOUT:-300} s"
    fi
    stop_and_fail 7 "the engine did not start within ${TINKER_READY_TIMEOUT:-300} s"
  fi
  sleep 0.5
done
echo "TINKER_URL=$URL"
echo "TINKER_PID=$PID"
echo "TINKER_MODEL=$MODEL"
echo "TINKER_VENV=$TINKER_VENV"
