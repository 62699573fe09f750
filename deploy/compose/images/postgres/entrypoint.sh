#!/bin/bash
# The part of the official postgres image's entrypoint that compose.yaml relies on.
set -euo pipefail
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [[ -n "${POSTGRES_PASSWORD_FILE:-}" ]]; then POSTGRES_PASSWORD="$(< "$POSTGRES_PASSWORD_FILE")"; fi
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD_FILE (or POSTGRES_PASSWORD)}"
export POSTGRES_USER POSTGRES_DB
if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
    initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") --auth-local=trust \
           --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
    printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [[ "$POSTGRES_DB" != postgres ]]; then
        psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
             -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    for script in /docker-entrypoint-initdb.d/*; do
        case "$script" in
            *.sh) echo "init: $script"; bash "$script" ;;
            *.sql) echo "init: $script"; psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -f "$script" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "init: done"
fi
exec "$@"
