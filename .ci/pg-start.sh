#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on a free loopback port and print `export` lines
# (PGTMP, PGBIN, PGPORT, TEST_PG_DSN). Stop it with .ci/pg-stop.sh.
# Debian's PostgreSQL server is installed first when this machine has none.
# initdb and pg_ctl refuse to run as root, so as root they run as the postgres user.
set -euo pipefail
if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
  # Only the export lines may reach stdout: the caller evaluates it.
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade postgresql >/dev/null
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ -z "$PGBIN" ]; then
  echo "pg-start: no PostgreSQL server binaries under /usr/lib/postgresql" >&2
  exit 1
fi
PGTMP=$(mktemp -d /tmp/tenure-pg.XXXXXX)
chmod 755 "$PGTMP"
RUN=()
if [ "$(id -u)" = 0 ]; then
  chown postgres:postgres "$PGTMP"
  RUN=(runuser -u postgres --)
fi
"${RUN[@]}" "$PGBIN/initdb" -D "$PGTMP/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-sync \
  >"$PGTMP/initdb.log" 2>&1
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${RUN[@]}" "$PGBIN/pg_ctl" -D "$PGTMP/data" -l "$PGTMP/server.log" -w -t 60 \
  -o "-p $PORT -k $PGTMP -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
  start >/dev/null
echo "export PGTMP=$PGTMP PGBIN=$PGBIN PGPORT=$PORT"
echo "export TEST_PG_DSN=postgresql://postgres@127.0.0.1:$PORT/postgres"
