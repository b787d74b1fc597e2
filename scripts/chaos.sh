#!/usr/bin/env bash
# The chaos run of issue 18 (by hand, not in CI): `rollflash train` for DURATION seconds against
# two `rollflash serve` processes (one through its SGLang-native API, one through its
# OpenAI-compatible one) and a `rollflash env-serve`, while this script SIGKILLs one of the three
# at random every 30-90 s and restarts it on the same port 1-5 s later. Then it stops the run
# with SIGINT (a clean stop: checkpoint, counts) and checks, from the run's own files:
#   - every step's sample accounting balances, and the cumulative trained count equals the sum
#     of the steps' batches (no sample trained twice, none lost);
#   - every trained trajectory (all of them are saved: dashboard.trajectories_per_step covers the
#     batch) appears once, and each model token's version lies between its trajectory's start
#     version and the version the step trained from (no token older than its sample's start:
#     a restarted server, back at its initial weights, must be caught up before it serves);
#   - staleness never above ceil(alpha);
#   - the trainer's resident memory stays flat (sampled every 10 s).
#
#   scripts/chaos.sh                       # DURATION=1200 OUT=runs/chaos SEED=1
#
# Needs target/release/rollflash (cargo build --release). Ports 30100-30102 must be free.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DURATION="${DURATION:-1200}"
OUT="${OUT:-runs/chaos}"
SEED="${SEED:-1}"
BIN="$ROOT/target/release/rollflash"
PORTS=(30100 30101 30102)
NAMES=(serve-sglang serve-openai env-serve)

die() { echo "chaos.sh: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "no $BIN (cargo build --release)"
rm -rf "$OUT"
mkdir -p "$OUT/published"
OUT="$(cd "$OUT" && pwd)"
RANDOM=$SEED

PIDS=(0 0 0)
start() { # start I: the I-th process, on its port, logging to OUT/NAME.log
  local i=$1
  case $i in
    0 | 1) "$BIN" serve --port "${PORTS[$i]}" --threads 1 --init-seed 9 \
             --weights-root "$OUT/published" >>"$OUT/${NAMES[$i]}.log" 2>&1 & ;;
    2) "$BIN" env-serve --port "${PORTS[$i]}" --env frozen_lake >>"$OUT/${NAMES[$i]}.log" 2>&1 & ;;
  esac
  PIDS[$i]=$!
}
up() { # up I: true once the I-th process answers /health
  curl -sf "http://127.0.0.1:${PORTS[$1]}/health" >/dev/null 2>&1
}
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${TRAIN:-}" ] && kill -9 "$TRAIN" 2>/dev/null || true
}
trap cleanup EXIT

for i in 0 1 2; do start "$i"; done
for i in 0 1 2; do
  for _ in $(seq 60); do up "$i" && break; sleep 0.5; done
  up "$i" || die "${NAMES[$i]} did not come up (see $OUT/${NAMES[$i]}.log)"
done

cat >"$OUT/chaos.toml" <<EOF
output_dir = "$OUT/run"
seed = $SEED

[env.remote]
url = "http://127.0.0.1:${PORTS[2]}"
timeout_secs = 30

[env.remote.spec]
name = "frozen_lake"
map = { random = { size = 4, p = 0.8 } }
is_slippery = false
max_steps = 5

[warmup]
steps = 0

[rollout]
engines = 0
weights_dir = "$OUT/published"
max_new_tokens = 6
max_turns = 5
max_total_tokens = 220
weight_sync_timeout_secs = 20
server_check_timeout_secs = 20

[[rollout.servers]]
kind = "sglang"
url = "http://127.0.0.1:${PORTS[0]}"
max_running_requests = 16
timeout_secs = 30
connect_timeout_secs = 2

[[rollout.servers]]
kind = "openai"
url = "http://127.0.0.1:${PORTS[1]}"
max_running_requests = 16
timeout_secs = 30
connect_timeout_secs = 2

[buffer]
alpha = 1.0
groups_per_batch = 4
group_size = 4

[train]
steps = 1000000
eval_problems = 0

[checkpoint]
every = 25

[controller]
serve_timeout_secs = 120

[metrics]
progress = false
report = false

[dashboard]
trajectories_per_step = 64
trajectories_max_mb = 0.0
EOF

"$BIN" train --config "$OUT/chaos.toml" >"$OUT/train.out" 2>"$OUT/train.err" &
TRAIN=$!
t0=$(date +%s)
next_kill=$((t0 + 30 + RANDOM % 61))
next_rss=$t0
echo "t_s rss_kib" >"$OUT/rss.tsv"
echo "t_s event" >"$OUT/events.tsv"
while [ $(($(date +%s) - t0)) -lt "$DURATION" ]; do
  kill -0 "$TRAIN" 2>/dev/null || die "the run ended early (see $OUT/train.err)"
  now=$(date +%s)
  if [ "$now" -ge "$next_rss" ]; then
    echo "$((now - t0)) $(awk '/VmRSS/ {print $2}' "/proc/$TRAIN/status")" >>"$OUT/rss.tsv"
    next_rss=$((now + 10))
  fi
  if [ "$now" -ge "$next_kill" ]; then
    i=$((RANDOM % 3))
    kill -9 "${PIDS[$i]}" 2>/dev/null || true
    wait "${PIDS[$i]}" 2>/dev/null || true
    echo "$((now - t0)) killed ${NAMES[$i]}" >>"$OUT/events.tsv"
    sleep $((1 + RANDOM % 5))
    start "$i"
    echo "$(($(date +%s) - t0)) restarted ${NAMES[$i]}" >>"$OUT/events.tsv"
    next_kill=$(($(date +%s) + 30 + RANDOM % 61))
  fi
  sleep 1
done

kill -INT "$TRAIN"
stop=$(date +%s)
while kill -0 "$TRAIN" 2>/dev/null; do
  [ $(($(date +%s) - stop)) -lt 300 ] || die "the run did not stop within 300 s of SIGINT"
  sleep 1
done
set +e
wait "$TRAIN"
code=$?
set -e
TRAIN=
echo "train exited with $code (130 = stopped by the signal, cleanly)" >&2

python3 - "$OUT" <<'EOF'
import json, math, statistics, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl") if l.endswith("\n")]
ended = ("trained", "filtered", "dropped_stale", "aborted", "failed", "running", "buffered")
total = 0
for r in rows:
    assert r["started"] == sum(r[k] for k in ended), f"step {r['step']}: unbalanced {r}"
    total += r["samples"]
    assert r["trained"] == total, f"step {r['step']}: trained {r['trained']} != {total}"
    assert r["staleness_max"] <= 1, f"step {r['step']}: staleness {r['staleness_max']}"
trajs = [json.loads(l) for l in open(f"{out}/run/trajectories.jsonl") if l.endswith("\n")]
keys = [(t["seed"], t["index"]) for t in trajs]
assert len(set(keys)) == len(keys), "a trajectory was trained twice"
assert len(trajs) == total, f"{len(trajs)} trajectories saved, {total} trained"
tokens = 0
for t in trajs:
    for p in t["pieces"]:
        if p["role"] == "model":
            tokens += 1
            assert t["start_version"] <= p["version"] <= t["trained_version"], \
                f"step {t['step']}: a model piece at v{p['version']}, start v{t['start_version']}, trained from v{t['trained_version']}"
last = rows[-1]
print(f"{len(rows)} steps, {total} samples trained, all balanced; every trajectory once; "
      f"{tokens} model tokens within [start, trained] versions; max staleness "
      f"{max(r['staleness_max'] for r in rows)}")
print("last step: " + ", ".join(f"{k} {last[k]}" for k in ("started",) + ended))
ev = [l.split(maxsplit=2) for l in open(f"{out}/events.tsv").read().splitlines()[1:]]
kills = [e[2] for e in ev if e[1] == "killed"]
print(f"{len(kills)} kills: " + ", ".join(f"{n} {kills.count(n)}" for n in sorted(set(kills))))
rss = [tuple(map(int, l.split())) for l in open(f"{out}/rss.tsv").read().splitlines()[1:] if len(l.split()) == 2]
rss = [(t, kb) for t, kb in rss if kb > 0]
if len(rss) >= 12:
    k = max(3, len(rss) // 10)
    a, b = statistics.median(kb for _, kb in rss[k:2 * k]), statistics.median(kb for _, kb in rss[-k:])
    print(f"trainer RSS: {a / 1024:.0f} MiB early (median of samples {k}-{2 * k}), "
          f"{b / 1024:.0f} MiB at the end (last {k}): x{b / a:.3f}; max {max(kb for _, kb in rss) / 1024:.0f} MiB")
EOF
