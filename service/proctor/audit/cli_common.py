"""What the ``proctor audit`` commands share: where the store is, how it is opened, how they fail."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from proctor.audit.store import AuditStore
from proctor.config import Settings


def store_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--db", help="SQLite audit database (default: PROCTOR_AUDIT_DB or .proctor/audit/audit.db)")
    group.add_argument("--dsn", help="PostgreSQL audit store, postgresql://…")


def key_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key-dir", help="the subjects' keys, which open sealed records (default: the server's, "
                        "<db>.keys)")


def settings_of(args: argparse.Namespace) -> Settings:
    """The server's conventions for where the store, keys and checkpoint file are (one home: audit/setup.py)."""
    return Settings.load({"audit_db": args.db, "audit_dsn": args.dsn, "audit_key_dir": getattr(args, "key_dir", None)})


def open_readonly(args: argparse.Namespace) -> AuditStore:
    from proctor.audit.setup import open_store

    return open_store(settings_of(args), readonly=True)


def fail(message: str, status: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def parse_time(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        raise ValueError(f"{flag} {value!r}: use ISO 8601 (2026-11-30T08:00:00Z) or epoch milliseconds") from None
