#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a fresh machine:
#   bash .ci/test-all.sh                        (22 to 25 minutes on a 2-core machine)
#   TENURE_TEST_STRESS=1 bash .ci/test-all.sh   (the same beside a CPU burner on every core)
#   bash .ci/test-all.sh tests/kernel           (every step, with pytest given these arguments)
# 1. a virtual environment (.venv) with tenure, its test dependencies and the docs tools;
#    then, in the background while the rest goes on: pycharter 0.0.67 in .venv-pycharter
#    (tests/adapters/core/test_pycharter.py drives it as a real client) followed by the
#    wheel check (built once, installed into a clean environment, every module imported);
# 2. Chromium and its driver from Debian's packages if missing (the console's browser tests);
#    PostgreSQL from Debian's packages if missing, and a throwaway server on a free
#    loopback port, with PgBouncer in front (stopped on exit; a missing server is a
#    failure, never a skip);
# 3. mypy --strict and the documentation site (`mkdocs build --strict`, any warning fails);
# 4. the pytest suite in four processes (python -P: see tests/adapters/core/test_layout.py),
#    its long tests first (tests/support/long_tests.py), and beside it CrossHair over the
#    kernel contracts (a counterexample fails the run) and `tenure conform` on SQLite;
#    then every background step's result, with its time.
# The soak-sized runs (the explorer's two largest worlds, 20,000-step lockstep runs, the
# Run chaos soak) and the benchmark harness's smoke run are `bash .ci/soak`'s, not this
# script's: docs/testing.md has both.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python keeps each module it compiles in __pycache__ (ignored by git). A machine that sets
# PYTHONDONTWRITEBYTECODE=1 (this one does) makes every process compile tenure, its tests
# and pytest's rewritten asserts from source again: about a second of CPU for each of the
# hundreds of processes the suite starts (CLI commands, workers killed and restarted, the
# mutant runs, the benchmark's clients). The clone is CI's own, so the cache is written.
unset PYTHONDONTWRITEBYTECODE
ROOT=$(pwd)
START=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - START )) s)"; }
# What runs on exit, last registered first: background steps and servers end with the script.
CLEANUP=()
cleanup() { local i; for (( i=${#CLEANUP[@]}-1; i>=0; i-- )); do eval "${CLEANUP[i]}" || true; done; }
trap cleanup EXIT
# A process and everything it started (a background step left running by a failure).
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
# A background step, a command run under `set -e`: its output in LOG, its exit status in
# LOG.status, its seconds in LOG.seconds.
background() {
  local log=$1; shift
  ( started=$(date +%s); set +e; ( set -e; "$@" ) >"$log" 2>&1; status=$?
    echo $(( $(date +%s) - started )) >"$log.seconds"; echo "$status" >"$log.status" ) &
  CLEANUP+=("kill_tree $!")
}
# Wait for a background step (by its log) and print how it went; its exit status is returned.
finished() {
  local log=$1
  while [ ! -s "$log.status" ]; do sleep 1; done
  echo "(exit $(cat "$log.status") after $(cat "$log.seconds") s)"
  return "$(cat "$log.status")"
}
WORK=$(mktemp -d)
CLEANUP+=('rm -rf "$WORK"')

if [ "${TENURE_TEST_STRESS:-}" = 1 ]; then
  step "stress mode: a CPU burner on each of $(nproc) cores, for the whole run"
  # tests/support/stress.py: one busy process per core at normal priority. pytest is told
  # they run (it would otherwise start its own).
  python3 tests/support/stress.py &
  CLEANUP+=("kill_tree $!")
  export TENURE_TEST_STRESS=running
fi

step "python"
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "tenure needs Python 3.11 or newer"'
if [ ! -x .venv/bin/python ]; then "$PYTHON" -m venv .venv; fi
# pip's "Location ... is ignored" lines come from this machine's pip configuration.
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
# docs: the site's tools (mkdocs, mkdocs-material, mkdocstrings[python]); they share no
# dependency with the rest that pip check would refuse, so they live in .venv too.
.venv/bin/python -m pip install -q --config-settings editable_mode=strict -e '.[test,typecheck,saq,docs,metrics,tracing,console,alembic,conform]' \
  2> >(grep -v "is ignored" >&2)
.venv/bin/python -m pip check

step "in the background: pycharter 0.0.67's environment, then the wheel check"
# One after the other, beside everything that follows: pycharter's environment first
# (pytest waits for it); the wheel, built once, installed into a clean environment, every
# module imported (it catches a package or *.sql file left out of pyproject's list). The
# benchmark harness's smoke run is the soak's (.ci/soak): it checks bench/'s scripts, not
# tenure, and cost CI about 90 core-seconds (its clients and its own PostgreSQL), about
# 45 s of this CPU-bound run's wall time.
pycharter_environment() {
  if [ ! -x .venv-pycharter/bin/python ]; then "$PYTHON" -m venv .venv-pycharter; fi
  .venv-pycharter/bin/python -m pip install -q 'pycharter==0.0.67' 'psycopg[binary]' 2> >(grep -v "is ignored" >&2)
  touch .venv-pycharter/ready  # tests/adapters/core/test_pycharter.py builds it only when this is missing
}
wheel_check() {
  local wheels="$WORK/wheel"
  mkdir -p "$wheels"
  .venv/bin/python -m pip wheel -q --no-deps -w "$wheels" . 2> >(grep -v "is ignored" >&2)
  "$PYTHON" -m venv "$wheels/venv"
  # With the conform extra (tenure.conformance imports Hypothesis) and pytest (its plugin's host).
  "$wheels/venv/bin/python" -m pip install -q "$(ls "$wheels"/tenure-*.whl)[conform]" pytest \
    2> >(grep -v "is ignored" >&2)
  ( cd "$wheels" && "$wheels/venv/bin/python" "$ROOT/.ci/import-every-module.py" "$ROOT" )
}
one_after_the_other() {
  background "$WORK/pycharter.log" pycharter_environment
  wait $!
  background "$WORK/wheel.log" wheel_check
  wait $!
}
background "$WORK/environments.log" one_after_the_other

step "chromium and chromedriver (the console's browser tests: Debian's packages, never a download)"
# tests/apps/console/test_browser.py drives /usr/bin/chromium through /usr/bin/chromedriver;
# without them those tests fail (never skip), naming these packages.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "the browser tests need Debian's chromium and chromium-driver: as root," \
      "apt-get install -y --no-install-recommends chromium chromium-driver" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
/usr/bin/chromedriver --version

step "postgresql"
eval "$(bash .ci/pg-start.sh)"
export PGTMP PGBIN
CLEANUP+=('bash "$ROOT/.ci/pg-stop.sh"')
echo "throwaway server on port $PGPORT"

step "pgbouncer (transaction mode, in front of that server)"
# Debian's pgbouncer (installed if missing) on a free loopback port, a small pool:
# tests/adapters/core/test_pgbouncer.py and tests/conformance/drivers/test_facts.py run through it
# (a missing PgBouncer is a failure, never a skip).
eval "$(bash .ci/pgbouncer-start.sh)"
export PGBOUNCER_TMP TEST_PGBOUNCER_DSN
CLEANUP+=('bash "$ROOT/.ci/pgbouncer-stop.sh"')
echo "PgBouncer (transaction mode) on port $PGBOUNCER_PORT"

step "type check (mypy --strict)"
.venv/bin/python -m mypy -p tenure.model -p tenure.kernel -p tenure.adapters -p tenure.conformance -p tenure.apps

step "crosshair over the kernel contracts (in the background)"
# 1.5 CPU seconds per condition (CrossHair's per-condition timeout counts CPU time, so the
# budget does not shrink on a loaded machine): 108 conditions, about 160 CPU seconds. Each
# broken kernel of tests/kernel/test_contracts.py is found within a third of its own
# budget; the soak (.ci/soak) sweeps every condition again at ten seconds.
crosshair_kernel() {
  cd /tmp && "$ROOT/.venv/bin/python" "$ROOT/.ci/crosshair_kernel.py" check --analysis_kind=PEP316 \
    --per_condition_timeout="${CROSSHAIR_CONDITION_S:-1.5}" --report_all "$ROOT/kernel"
}
background "$WORK/crosshair.log" crosshair_kernel

step "documentation site (mkdocs build --strict: a broken link, anchor or API reference fails)"
# A few seconds on one core, beside CrossHair on the other. Never `--quiet`: it silences
# the warnings that --strict counts, and the build would pass. The site goes to a
# temporary folder; NO_MKDOCS_2_WARNING drops the theme's banner about MkDocs 2.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --config-file "$ROOT/mkdocs.yml" --site-dir "$WORK/site"

step "tenure conform against SQLite (in the background)"
# The README's command, as a user runs it (the installed console script): the server facts
# and a table per machine, in a scratch area it removes; a divergence, a failed fact or a
# refusal fails CI (its exit status is checked after pytest). On PostgreSQL, directly and
# through PgBouncer in transaction mode, the same command runs inside pytest
# (tests/conformance/command/test_conform.py: every machine, 200 steps, the user's tables
# untouched, no LISTEN or prepared statement reaching the pooler), so it is not run a
# second time here.
mkdir -p "$WORK/conform"
conform_everywhere() {
  cd "$WORK/conform"
  local failed=0 setup name status
  for setup in "sqlite sqlite:///$WORK/conform/app.db"; do
    name=${setup%% *}
    status=0
    "$ROOT/.venv/bin/tenure" conform --db "${setup#* }" --steps "${CONFORM_STEPS:-300}" --seed 20261205 \
      >"$name.log" 2>"$name.progress" || status=$?
    echo "$status" >"$name.status"
    if [ "$status" != 0 ]; then failed=1; fi
  done
  return "$failed"
}
background "$WORK/conform.log" conform_everywhere

step "pytest (four worker processes, the long tests first; each test's databases are its own)"
export CI=${CI:-true}
while [ ! -s "$WORK/pycharter.log.status" ]; do sleep 1; done  # the adoption test's client
if [ "$(cat "$WORK/pycharter.log.status")" != 0 ]; then cat "$WORK/pycharter.log"; echo "pycharter's environment failed"; exit 1; fi
# Four processes on two cores: much of the suite waits (on PostgreSQL, on subprocesses,
# on leases running out), so more workers than cores keep both busy. worksteal with the
# long tests dealt to the front of every worker's share (tests/support/long_tests.py)
# starts each worker on its long tests and lets the short ones fill in around them.
.venv/bin/python -P -m pytest -q -n "${PYTEST_WORKERS:-4}" --dist worksteal --durations=30 "$@"

step "tenure conform result"
CONFORM_STATUS=0
finished "$WORK/conform.log" || CONFORM_STATUS=$?
for name in sqlite; do
  echo "-- tenure conform on $name: exit $(cat "$WORK/conform/$name.status" 2>/dev/null || echo '?')"
  cat "$WORK/conform/$name.log"
done
if [ "$CONFORM_STATUS" != 0 ]; then cat "$WORK/conform.log"; echo "tenure conform failed"; exit 1; fi

step "crosshair result"
# A condition CrossHair could not even start (a precondition it cannot meet, or one that
# raises) checks nothing: that fails the gate too.
if finished "$WORK/crosshair.log" && ! grep -q "Unable to meet precondition" "$WORK/crosshair.log"; then
  echo "crosshair: no counterexample in $(grep -c 'info:' "$WORK/crosshair.log") conditions"
  sed 's/.*: info: //' "$WORK/crosshair.log" | sort | uniq -c
else
  echo "crosshair found a counterexample or failed:"
  cat "$WORK/crosshair.log"
  exit 1
fi

step "wheel result (built once, installed into a clean environment, every module imported)"
if finished "$WORK/wheel.log"; then
  cat "$WORK/wheel.log"
else
  cat "$WORK/wheel.log"; echo "the wheel check failed"; exit 1
fi

step "all checks passed"
