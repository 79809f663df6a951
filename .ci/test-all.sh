#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a fresh machine:
#   bash .ci/test-all.sh
# 1. a virtual environment (.venv) with tenure, its test dependencies and the docs tools;
# 2. pycharter 0.0.67 in .venv-pycharter (tests/adapters/core/test_pycharter.py drives it as a real client);
#    Chromium and its driver from Debian's packages if missing (the console's browser tests);
#    PostgreSQL from Debian's packages if missing, and a throwaway server on a free
#    loopback port (stopped on exit; a missing server is a failure, never a skip);
# 3. the pytest suite in four processes (python -P: see tests/adapters/core/test_layout.py) and, alongside it,
#    CrossHair over the kernel contracts (a counterexample fails the run); the documentation
#    site built with `mkdocs build --strict` first, while CrossHair starts (any warning fails);
# 4. the wheel, built once, installed into a clean environment, every module imported.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - START )) s)"; }

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

step "pycharter 0.0.67 in its own environment (the real-client adoption test)"
if [ ! -x .venv-pycharter/bin/python ]; then "$PYTHON" -m venv .venv-pycharter; fi
.venv-pycharter/bin/python -m pip install -q 'pycharter==0.0.67' 'psycopg[binary]' 2> >(grep -v "is ignored" >&2)
touch .venv-pycharter/ready  # tests/adapters/core/test_pycharter.py builds it only when this is missing

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
trap 'bash "$ROOT/.ci/pg-stop.sh"' EXIT
echo "throwaway server on port $PGPORT"

step "pgbouncer (transaction mode, in front of that server)"
# Debian's pgbouncer (installed if missing) on a free loopback port, a small pool:
# tests/adapters/core/test_pgbouncer.py and tests/conformance/drivers/test_facts.py run through it
# (a missing PgBouncer is a failure, never a skip).
eval "$(bash .ci/pgbouncer-start.sh)"
export PGBOUNCER_TMP TEST_PGBOUNCER_DSN
trap 'bash "$ROOT/.ci/pgbouncer-stop.sh"; bash "$ROOT/.ci/pg-stop.sh"' EXIT
echo "PgBouncer (transaction mode) on port $PGBOUNCER_PORT"

step "type check (mypy --strict)"
.venv/bin/python -m mypy -p tenure.model -p tenure.kernel -p tenure.adapters -p tenure.conformance -p tenure.apps

step "crosshair over the kernel contracts (in the background)"
CROSSHAIR_LOG=$(mktemp)
( cd /tmp && "$ROOT/.venv/bin/python" "$ROOT/.ci/crosshair_kernel.py" check --analysis_kind=PEP316 \
    --per_condition_timeout=3 --report_all "$ROOT/kernel" ) >"$CROSSHAIR_LOG" 2>&1 &
CROSSHAIR_PID=$!

step "documentation site (mkdocs build --strict: a broken link, anchor or API reference fails)"
# A few seconds on one core, beside CrossHair on the other. Never `--quiet`: it silences
# the warnings that --strict counts, and the build would pass. The site goes to a
# temporary folder; NO_MKDOCS_2_WARNING drops the theme's banner about MkDocs 2.
DOCS_SITE=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --config-file "$ROOT/mkdocs.yml" --site-dir "$DOCS_SITE"
rm -rf "$DOCS_SITE"

step "tenure conform against SQLite, PostgreSQL and PgBouncer in transaction mode (in the background)"
# The README's command, as a user runs it, on each setup CI has: the server facts and a
# table per machine. Each run works in a scratch area it removes; a divergence, a failed
# fact or a refusal fails CI (their exit status is checked after pytest).
CONFORM_DIR=$(mktemp -d)
(
  cd "$CONFORM_DIR"
  for setup in "sqlite sqlite:///$CONFORM_DIR/app.db" "postgresql $TEST_PG_DSN" \
               "pgbouncer $TEST_PGBOUNCER_DSN?pooler=transaction"; do
    name=${setup%% *}
    if "$ROOT/.venv/bin/tenure" conform --db "${setup#* }" --steps "${CONFORM_STEPS:-500}" --seed 20261205 \
        >"$CONFORM_DIR/$name.log" 2>"$CONFORM_DIR/$name.progress"; then
      echo 0 >"$CONFORM_DIR/$name.status"
    else
      echo $? >"$CONFORM_DIR/$name.status"
    fi
  done
) &
CONFORM_PID=$!

step "the explorer over the kernel's standard bounds (in the background)"
# Every interleaving of the queue, attempt and Run worlds to their standard depths
# (tenure.conformance.explore): one line per world with its states, transitions and depth; a
# broken property prints its shortest trace and fails CI (checked after pytest).
EXPLORE_LOG=$(mktemp)
( "$ROOT/.venv/bin/python" -P -m tenure.conformance.explore >"$EXPLORE_LOG" 2>&1; echo $? >>"$EXPLORE_LOG.status" ) &
EXPLORE_PID=$!

step "pytest (four worker processes; each test's databases are its own)"
export CI=${CI:-true}
# Four processes on two cores: much of the suite waits (on PostgreSQL, on subprocesses,
# on leases running out), so more workers than cores keep both busy. worksteal hands
# the long tail (lockstep runs, mutants, chaos) to whichever worker is free.
.venv/bin/python -P -m pytest -q -n "${PYTEST_WORKERS:-4}" --dist worksteal --durations=30

step "tenure conform result"
wait "$CONFORM_PID"
CONFORM_FAILED=0
for name in sqlite postgresql pgbouncer; do
  echo "-- tenure conform on $name: exit $(cat "$CONFORM_DIR/$name.status")"
  cat "$CONFORM_DIR/$name.log"
  if [ "$(cat "$CONFORM_DIR/$name.status")" != 0 ]; then CONFORM_FAILED=1; fi
done
rm -rf "$CONFORM_DIR"
if [ "$CONFORM_FAILED" != 0 ]; then echo "tenure conform failed"; exit 1; fi

step "explorer result"
wait "$EXPLORE_PID"
cat "$EXPLORE_LOG"
if [ "$(cat "$EXPLORE_LOG.status")" != 0 ]; then echo "the explorer found a broken property"; exit 1; fi
rm -f "$EXPLORE_LOG" "$EXPLORE_LOG.status"

step "crosshair result"
# A condition CrossHair could not even start (a precondition it cannot meet, or one that
# raises) checks nothing: that fails the gate too.
if wait "$CROSSHAIR_PID" && ! grep -q "Unable to meet precondition" "$CROSSHAIR_LOG"; then
  echo "crosshair: no counterexample in $(grep -c 'info:' "$CROSSHAIR_LOG") conditions"
  sed 's/.*: info: //' "$CROSSHAIR_LOG" | sort | uniq -c
else
  echo "crosshair found a counterexample or failed:"
  cat "$CROSSHAIR_LOG"
  exit 1
fi

step "benchmark harness smoke run (checks the harness; asserts no timing)"
SMOKE_LOG=$(mktemp)
if bash bench/run.sh --smoke >"$SMOKE_LOG" 2>&1; then
  echo "benchmark harness ran every benchmark and wrote its report:"
  sed -n '/^## Targets/,$p' "$SMOKE_LOG"
else
  cat "$SMOKE_LOG"
  echo "benchmark smoke run failed"
  exit 1
fi

step "wheel: build once, install into a clean environment, import every module"
WHEEL_DIR=$(mktemp -d)
.venv/bin/python -m pip wheel -q --no-deps -w "$WHEEL_DIR" . 2> >(grep -v "is ignored" >&2)
"$PYTHON" -m venv "$WHEEL_DIR/venv"
# With the conform extra (tenure.conformance imports Hypothesis) and pytest (its plugin's host).
"$WHEEL_DIR/venv/bin/python" -m pip install -q "$(ls "$WHEEL_DIR"/tenure-*.whl)[conform]" pytest \
  2> >(grep -v "is ignored" >&2)
( cd "$WHEEL_DIR" && "$WHEEL_DIR/venv/bin/python" - "$ROOT" <<'PY'
# Every module in the source tree must import from the installed wheel (a package left
# out of pyproject's list would be missing here), and nothing may come from the tree.
import importlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
names = []
for folder in ("model", "kernel", "adapters", "conformance", "apps"):
    for path in sorted((root / folder).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append("tenure." + ".".join(parts))
for name in names:
    module = importlib.import_module(name)
    assert "site-packages" in (module.__file__ or ""), name
import shutil
assert shutil.which("tenure", path=str(pathlib.Path(sys.executable).parent)), "console script missing"
print(f"imported {len(names)} modules from the installed wheel; the tenure command is installed")
PY
)
rm -rf "$WHEEL_DIR"

step "all checks passed"
