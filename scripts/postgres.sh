#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the test suite: the audit-trail store is tested against a real
# server, not a mock. `make test` runs `start`; tests read PROCTOR_TEST_POSTGRES_DSN (= `dsn`).
# The cluster lives in .proctor/postgres/ (git-ignored), listens on 127.0.0.1:54329 only, and runs
# as an unprivileged user because PostgreSQL refuses to run as root.
#
# Usage: scripts/postgres.sh start|stop|status|dsn      (every subcommand is idempotent)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PGDIR=$ROOT/.proctor/postgres   # also the unix socket directory
DATA=$PGDIR/data
LOG=$PGDIR/server.log
STAMP=$PGDIR/provisioned   # roles and database exist
HOST=127.0.0.1
PORT=54329
DB=proctor_audit_test
DSN="postgresql://proctor_owner:proctor_owner@$HOST:$PORT/$DB"

die() { echo "postgres.sh: error: $*" >&2; exit 1; }
say() { echo "postgres.sh: $*" >&2; }

# Directory holding initdb, pg_ctl, pg_isready and psql of one PostgreSQL version: PATH first.
find_bindir() {
    local d p
    p=$(command -v pg_ctl 2>/dev/null) && p=$(dirname "$(readlink -f "$p")")
    for d in $p $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
        [[ -x $d/initdb && -x $d/pg_ctl && -x $d/pg_isready && -x $d/psql ]] && { echo "$d"; return; }
    done
    return 1
}

install_postgres() {
    [[ $(id -u) == 0 ]] || die "PostgreSQL server binaries (initdb, pg_ctl) not found; install the 'postgresql' package"
    command -v apt-get >/dev/null || die "PostgreSQL server binaries not found and apt-get is not available"
    say "installing PostgreSQL with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -q postgresql || { apt-get update -q && apt-get install -y -q postgresql; }; } >&2 \
        || die "apt-get install postgresql failed"
}

# Run a command as the cluster's OS user: 'postgres' (or 'proctor-pg') when root, else the caller.
PGUSER_OS=$(id -un)
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u "$PGUSER_OS" -- "$@"; else "$@"; fi; }

setup_user() {
    mkdir -p "$PGDIR" && chmod 700 "$PGDIR"   # the socket here accepts the superuser without a password
    if [[ $(id -u) == 0 ]]; then
        if id postgres >/dev/null 2>&1; then PGUSER_OS=postgres
        else
            PGUSER_OS=proctor-pg
            id "$PGUSER_OS" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin \
                "$PGUSER_OS" || die "could not create the system user $PGUSER_OS"
        fi
        [[ $(stat -c %U "$PGDIR") == "$PGUSER_OS" ]] || chown -R "$PGUSER_OS:" "$PGDIR"
    fi
    as_pg test -w "$PGDIR" || die "user $PGUSER_OS cannot write to $PGDIR (owned by another user, or a parent not searchable?)"
}

running() { [[ -f $DATA/PG_VERSION ]] && as_pg "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }
ready() { "$BIN/pg_isready" -q -h "$HOST" -p "$PORT" -d postgres -t 1; }
up() { running && ready; }   # our server, accepting connections (not some other one on the port)
psql_admin() { as_pg "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PGDIR" -p "$PORT" -U postgres "$@"; }

# Roles and database; idempotent, so an interrupted first start heals on the next one.
provision() {
    psql_admin -d postgres >/dev/null <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'proctor_owner') THEN CREATE ROLE proctor_owner; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'proctor_appender') THEN CREATE ROLE proctor_appender; END IF;
END \$\$;
ALTER ROLE proctor_owner LOGIN NOSUPERUSER NOCREATEROLE PASSWORD 'proctor_owner';
ALTER ROLE proctor_appender LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD 'proctor_appender';
SELECT 'CREATE DATABASE $DB OWNER proctor_owner'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB') \gexec
ALTER DATABASE $DB OWNER TO proctor_owner;
SQL
    # Same on every PostgreSQL version: the owner owns schema public, nobody else may create in it.
    psql_admin -d "$DB" -c "ALTER SCHEMA public OWNER TO proctor_owner; REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
}

start_server() {
    say "starting PostgreSQL on $HOST:$PORT"
    as_pg "$BIN/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 60 -o "-c listen_addresses=$HOST -p $PORT -k '$PGDIR'" \
        >/dev/null 9>&- || { tail -n 20 "$LOG" >&2; die "the server did not start (log: $LOG)"; }
}

start() {
    setup_user
    exec 9>>"$PGDIR/.lock"; flock 9   # concurrent `make test` runs share one cluster (server: 9>&-)
    if up && [[ -f $STAMP ]]; then return; fi
    if [[ ! -f $DATA/PG_VERSION ]]; then
        say "initialising a cluster in $DATA"
        rm -rf "$DATA" "$STAMP"
        as_pg "$BIN/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C --auth-local=trust \
            --auth-host=scram-sha-256 >"$PGDIR/initdb.log" 2>&1 || { cat "$PGDIR/initdb.log" >&2; die "initdb failed"; }
    fi
    # Not running: start it. Running but not ready: starting up, or a killed server not yet reaped.
    for _ in $(seq 50); do
        up && break
        running || start_server
        sleep 0.2
    done
    up || { tail -n 20 "$LOG" >&2; die "the server does not accept connections on $HOST:$PORT (log: $LOG)"; }
    if [[ ! -f $STAMP ]]; then provision || die "could not create the roles and database $DB"; touch "$STAMP"; fi
}

stop() {
    setup_user
    if running; then as_pg "$BIN/pg_ctl" stop -D "$DATA" -m fast -w >/dev/null || die "pg_ctl stop failed"; say "stopped"
    else say "not running"; fi
}

case ${1:-} in
    dsn) echo "$DSN"; exit 0 ;;
    start|stop|status) ;;
    *) echo "usage: $0 start|stop|status|dsn" >&2; exit 2 ;;
esac
BIN=$(find_bindir) || { install_postgres; BIN=$(find_bindir) || die "no initdb/pg_ctl even after installing postgresql"; }
case $1 in
    start) start ;;
    stop) stop ;;
    status) setup_user; if up; then echo "running: $DSN"; else echo "not running"; exit 3; fi ;;
esac
