#!/usr/bin/env bash
# Stop the server .ci/pg-start.sh started (PGTMP and PGBIN from its export lines).
set -uo pipefail
[ -n "${PGTMP:-}" ] && [ -d "$PGTMP" ] || exit 0
RUN=()
if [ "$(id -u)" = 0 ]; then RUN=(runuser -u postgres --); fi
"${RUN[@]}" "$PGBIN/pg_ctl" -D "$PGTMP/data" -m fast -w stop >/dev/null 2>&1
rm -rf "$PGTMP"
