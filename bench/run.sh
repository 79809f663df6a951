#!/usr/bin/env bash
# The benchmark suite, from a fresh clone:
#   bash bench/run.sh            # full run: writes bench/RESULTS.md and bench/results.png
#   bash bench/run.sh --smoke    # one-minute harness check (CI): writes into a temporary folder
# It installs tenure (not editable, with psycopg for one floor) into .bench/tenure, the peer queues (procrastinate,
# pgqueuer, saq) with matplotlib into .bench/peers (never into tenure's environment),
# starts a throwaway PostgreSQL server, runs bench/tenure_bench.py (tenure, its floors and
# its Worker) and bench/peers.py (the peers' own worker loops at concurrency 1, 4 and 16)
# against it, and turns their JSON lines into the report. Figures are only compared
# within one run: machines are noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SMOKE=""
OUT="$ROOT/bench"
for argument in "$@"; do
  case "$argument" in
    --smoke) SMOKE="--smoke" ;;
    *) echo "usage: bash bench/run.sh [--smoke]" >&2; exit 2 ;;
  esac
done
WORK=$(mktemp -d)
if [ -n "$SMOKE" ]; then OUT="$WORK/report"; mkdir -p "$OUT"; fi

echo "== environments"
[ -x .bench/tenure/bin/python ] || python3 -m venv .bench/tenure
# psycopg only for the pipelined floor; tenure itself does not depend on it.
.bench/tenure/bin/python -m pip install -q . 'psycopg[binary]==3.*' 2> >(grep -v "is ignored" >&2)
[ -x .bench/peers/bin/python ] || python3 -m venv .bench/peers
.bench/peers/bin/python -m pip install -q 'procrastinate==3.10.*' 'pgqueuer==1.6.*' 'saq==0.26.*' asyncpg matplotlib \
  2> >(grep -v "is ignored" >&2)

echo "== postgresql"
eval "$(bash .ci/pg-start.sh)"
export PGTMP PGBIN
trap 'bash "$ROOT/.ci/pg-stop.sh"; rm -rf "$WORK"' EXIT

echo "== tenure and its floors"
( cd "$WORK" && "$ROOT/.bench/tenure/bin/python" "$ROOT/bench/tenure_bench.py" "$TEST_PG_DSN" $SMOKE ) \
  | tee "$WORK/tenure.jsonl"
echo "== peers"
# The same job counts and rounds as tenure_bench.py's burn-downs and Workers: concurrency 4
# (three rounds) doubles as the burn-down comparison; 1 and 16 get one round each (the
# full run took 34 minutes on a shared 2-core machine).
JOBS=20000
ROUNDS=3
LATENCY_SAMPLES=200
[ -n "$SMOKE" ] && JOBS=200 && ROUNDS=1 && LATENCY_SAMPLES=20
( cd "$WORK" && "$ROOT/.bench/peers/bin/python" "$ROOT/bench/peers.py" "$TEST_PG_DSN" "$JOBS" 1:1,4,16:1 "$ROUNDS" \
    "$LATENCY_SAMPLES" ) \
  | grep '^{' | tee "$WORK/peers.jsonl"
echo "== report"
.bench/peers/bin/python bench/report.py "$WORK/tenure.jsonl" "$WORK/peers.jsonl" "$OUT" $SMOKE
