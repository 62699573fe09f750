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
