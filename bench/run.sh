#!/usr/bin/env bash
# The benchmark suite, from a fresh clone:
#   bash bench/run.sh            # full run: writes bench/RESULTS.md and bench/results.png
#   bash bench/run.sh --smoke    # one-minute harness check (CI): writes into a temporary folder
# It installs tenure (not editable, with psycopg for one floor) into .bench/tenure, the peer queues (procrastinate,
# pgqueuer, saq) with matplotlib into .bench/peers (never into tenure's environment),
# starts a throwaway PostgreSQL server, runs bench/tenure_bench.py (tenure, its floors and
# its Worker), bench/peers.py (the peers' own worker loops at concurrency 1, 4 and 16),
# bench/pycharter_cycle.py (pycharter 0.0.67's own cycle, in .venv-pycharter),
# bench/runs.py with bench/absurd_tasks.py (Runs beside SAQ and Absurd) and
# bench/recovery.py against it, then bench/call_counts.py (Python calls per owned call, counted),
# and turns their JSON lines into the report. Figures are only compared
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
.bench/tenure/bin/python -m pip install -q '.[saq]' 'psycopg[binary]==3.*' 2> >(grep -v "is ignored" >&2)
[ -x .bench/peers/bin/python ] || python3 -m venv .bench/peers
.bench/peers/bin/python -m pip install -q 'procrastinate==3.10.*' 'pgqueuer==1.6.*' 'saq==0.26.*' asyncpg matplotlib \
  'absurd-sdk==0.5.*' 'absurdctl==0.5.*' 2> >(grep -v "is ignored" >&2)
# pycharter 0.0.67, the seed's own system, in the environment the test suite also uses.
[ -x .venv-pycharter/bin/python ] || python3 -m venv .venv-pycharter
.venv-pycharter/bin/python -m pip install -q 'pycharter==0.0.67' 'psycopg[binary]' 2> >(grep -v "is ignored" >&2)
touch .venv-pycharter/ready

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
echo "== the seed's own system: pycharter's cycle"
CYCLE_JOBS=2000; CYCLE_ROUNDS=3
[ -n "$SMOKE" ] && CYCLE_JOBS=64 && CYCLE_ROUNDS=1
( cd "$WORK" && "$ROOT/.venv-pycharter/bin/python" "$ROOT/bench/pycharter_cycle.py" "$TEST_PG_DSN" "$CYCLE_JOBS" \
    "$CYCLE_ROUNDS" ) | grep '^{' | tee "$WORK/pycharter.jsonl"
echo "== Runs: on SAQ, on tenure's queue, in memory; Absurd's one-step tasks; recovery"
RUN_ITEMS=400; RUN_ROUNDS=3; RECOVERY_RUNS=2000
[ -n "$SMOKE" ] && RUN_ITEMS=40 && RUN_ROUNDS=1 && RECOVERY_RUNS=100
new_database() { "$PGBIN/psql" -q "$TEST_PG_DSN" -c "CREATE DATABASE $1" >&2; echo "${TEST_PG_DSN%/*}/$1"; }
( cd "$WORK" && "$ROOT/.bench/tenure/bin/python" "$ROOT/bench/runs.py" "$(new_database bench_runs)" "$RUN_ITEMS" \
    --rounds "$RUN_ROUNDS" --json ) | tee "$WORK/runs.jsonl"
( cd "$WORK" && "$ROOT/.bench/peers/bin/python" "$ROOT/bench/absurd_tasks.py" "$TEST_PG_DSN" "$RUN_ITEMS" \
    "$RUN_ROUNDS" ) | grep '^{' | tee -a "$WORK/runs.jsonl"
( cd "$WORK" && "$ROOT/.bench/tenure/bin/python" "$ROOT/bench/recovery.py" "$(new_database bench_recovery)" \
    "$RECOVERY_RUNS" --json ) | tee -a "$WORK/runs.jsonl"
echo "== Python calls per owned call (counted, not timed: issue 51's table)"
CALLS=200
[ -n "$SMOKE" ] && CALLS=20
( cd "$WORK" && "$ROOT/.bench/tenure/bin/python" "$ROOT/bench/call_counts.py" "$TEST_PG_DSN" "$CALLS" \
    "--json=$OUT/call_counts.json" )
echo "== report"
cat "$WORK/pycharter.jsonl" "$WORK/runs.jsonl" >> "$WORK/tenure.jsonl"
# The measurements are written beside the report (commit them with it), so a report fix
# can be rendered again without a new run: python bench/report.py bench/tenure.jsonl bench/peers.jsonl bench
cp "$WORK/tenure.jsonl" "$WORK/peers.jsonl" "$OUT/"
.bench/peers/bin/python bench/report.py "$OUT/tenure.jsonl" "$OUT/peers.jsonl" "$OUT" $SMOKE
