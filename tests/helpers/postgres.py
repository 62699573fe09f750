"""PostgreSQL for tests: the throwaway cluster that `make test` starts with scripts/postgres.sh.

The Makefile exports its owner DSN as PROCTOR_TEST_POSTGRES_DSN. Tests that need the server should
skip when :func:`postgres_dsn` returns None (variable unset, or server not reachable).
"""

from __future__ import annotations

import os

import psycopg
from psycopg.conninfo import make_conninfo

DSN_ENV_VAR = "PROCTOR_TEST_POSTGRES_DSN"
APPENDER_USER = "proctor_appender"
APPENDER_PASSWORD = "proctor_appender"


def postgres_dsn() -> str | None:
    """The owner DSN from the environment if a server answers on it, else None."""
    dsn = os.environ.get(DSN_ENV_VAR)
    if not dsn:
        return None
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return None
    return dsn


def appender_dsn(owner_dsn: str) -> str:
    """The same server and database, as the least-privileged role (INSERT/SELECT only once granted).

    Accepts a URL or key=value DSN and returns a key=value one (libpq and psycopg accept both).
    """
    return make_conninfo(owner_dsn, user=APPENDER_USER, password=APPENDER_PASSWORD)


def audit_schema(owner: str) -> tuple[str, str]:
    """A fresh schema holding an initialised audit table: (owner DSN, appender DSN), both scoped to it.

    Each test gets its own schema, so tests never see each other's rows.
    """
    import uuid

    from proctor.audit.postgres_store import init_schema

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {APPENDER_USER}")
    owner_dsn = make_conninfo(owner, options=f"-c search_path={schema}")
    init_schema(owner_dsn, APPENDER_USER)
    return owner_dsn, make_conninfo(appender_dsn(owner), options=f"-c search_path={schema}")
