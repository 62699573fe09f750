#!/bin/bash
# PostgreSQL's first start (docker-entrypoint-initdb.d): the server's role, allowed to log in and nothing
# else yet. `proctor audit init-postgres` (the audit-init service) then creates the audit table as
# proctor_owner and grants proctor_appender only SELECT and INSERT on it.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v password="$(cat /run/secrets/pg_appender_password)" <<'SQL'
CREATE ROLE proctor_appender LOGIN PASSWORD :'password';
GRANT CONNECT ON DATABASE proctor TO proctor_appender;
SQL
