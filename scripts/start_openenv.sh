#!/usr/bin/env bash
# Starts the OpenEnv test environment (scripts/openenv_guess.py, a number-guessing game on
# openenv-core's own server) after installing openenv-core with scripts/setup_openenv.sh.
# Arguments go to the server; the first line on stdout is `listening on http://HOST:PORT`.
#
#   scripts/start_openenv.sh --port 8100 --max-sessions 64
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$("$ROOT/scripts/setup_openenv.sh")"
exec "$PY" "$ROOT/scripts/openenv_guess.py" "$@"
