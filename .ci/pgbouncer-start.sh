#!/usr/bin/env bash
# Start a throwaway PgBouncer in TRANSACTION pooling mode in front of the server
# .ci/pg-start.sh started (PGPORT from its export lines; PGHOST defaults to 127.0.0.1),
# on a free loopback port, and print `export` lines (PGBOUNCER_TMP, PGBOUNCER_PORT,
# TEST_PGBOUNCER_DSN). Stop it with .ci/pgbouncer-stop.sh.
# Debian's pgbouncer package is installed first when this machine has none. PgBouncer
# refuses to run as root, so as root it runs as the postgres user.
# The pool is deliberately small (PGBOUNCER_POOL_SIZE, default 4 server connections per
# database and user): tests drive more clients than that through it.
set -euo pipefail
: "${PGPORT:?pgbouncer-start: PGPORT is unset (source the export lines of .ci/pg-start.sh first)}"
PGHOST=${PGHOST:-127.0.0.1}
if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
  # Only the export lines may reach stdout: the caller evaluates it.
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade pgbouncer >/dev/null
fi
PGBOUNCER=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
BOUNCER_TMP=$(mktemp -d /tmp/tenure-pgbouncer.XXXXXX)
chmod 755 "$BOUNCER_TMP"
RUN=()
if [ "$(id -u)" = 0 ]; then
  chown postgres:postgres "$BOUNCER_TMP"
  RUN=(runuser -u postgres --)
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# auth_type=trust: the throwaway server trusts every local user too; the user list only
# names who may connect. max_client_conn well above the pool: clients wait for a server
# connection inside PgBouncer, which is the behaviour under test.
cat >"$BOUNCER_TMP/pgbouncer.ini" <<INI
[databases]
* = host=$PGHOST port=$PGPORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $BOUNCER_TMP/userlist.txt
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-4}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = 0
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = $BOUNCER_TMP/pgbouncer.log
pidfile = $BOUNCER_TMP/pgbouncer.pid
admin_users = postgres
INI
echo '"postgres" ""' >"$BOUNCER_TMP/userlist.txt"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$BOUNCER_TMP"/*
"${RUN[@]}" "$PGBOUNCER" -d "$BOUNCER_TMP/pgbouncer.ini" >"$BOUNCER_TMP/start.log" 2>&1
# -d returns once it forked; wait until it accepts connections.
for _ in $(seq 1 100); do
  if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $PORT), 0.2).close()" 2>/dev/null; then
    echo "export PGBOUNCER_TMP=$BOUNCER_TMP PGBOUNCER_PORT=$PORT"
    echo "export TEST_PGBOUNCER_DSN=postgresql://postgres@127.0.0.1:$PORT/postgres"
    exit 0
  fi
  sleep 0.1
done
echo "pgbouncer-start: PgBouncer did not accept connections on port $PORT (see $BOUNCER_TMP/pgbouncer.log)" >&2
exit 1
