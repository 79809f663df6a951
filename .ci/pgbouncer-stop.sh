#!/usr/bin/env bash
# Stop the PgBouncer .ci/pgbouncer-start.sh started (PGBOUNCER_TMP from its export lines).
set -uo pipefail
[ -n "${PGBOUNCER_TMP:-}" ] && [ -d "$PGBOUNCER_TMP" ] || exit 0
if [ -s "$PGBOUNCER_TMP/pgbouncer.pid" ]; then
  PID=$(cat "$PGBOUNCER_TMP/pgbouncer.pid")
  # SIGTERM: immediate shutdown (a throwaway pooler has nothing to drain).
  kill -TERM "$PID" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
fi
rm -rf "$PGBOUNCER_TMP"
