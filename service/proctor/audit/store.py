"""What an audit store does (SQLite and PostgreSQL implement the same protocol and schema).

A row: ``seq`` (1, 2, …), ``audit_id``, ``kind`` ("request" or "checkpoint"), ``time_ms``,
``caller``, ``request_id``, ``finish_reason``, ``body`` (canonical JSON of the record),
``prev_hash`` and ``hash``. The filter columns are copies of body fields, checked by ``verify``.
The stores refuse UPDATE and DELETE.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Row:
    seq: int
    audit_id: str
    kind: str
    time_ms: int
    caller: str
    request_id: str
    finish_reason: str
    body: bytes
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class Filters:
    since_ms: int | None = None
    until_ms: int | None = None
    caller: str | None = None
    request_id: str | None = None
    finish_reason: str | None = None
    include_checkpoints: bool = False


class AuditStore(Protocol):
    description: str

    def append_chained(self, build: Callable[[int, str], list[Row]]) -> list[Row]:
        """In one durable write transaction: read the head (last seq and hash; 0 and GENESIS when
        empty), insert ``build(seq, hash)``, commit; return the rows. Writers are serialised."""

    def last(self) -> Row | None: ...

    def get(self, audit_id: str) -> Row | None: ...

    def iterate(self, filters: Filters | None = None, start_seq: int = 1) -> Iterator[Row]:
        """Rows in ``seq`` order (all rows when ``filters`` is None)."""

    def count(self) -> int: ...

    def close(self) -> None: ...


def row_matches(row: Row, filters: Filters) -> bool:
    if row.kind == "checkpoint" and not filters.include_checkpoints:
        return False
    return ((filters.since_ms is None or row.time_ms >= filters.since_ms)
            and (filters.until_ms is None or row.time_ms < filters.until_ms)
            and (filters.caller is None or row.caller == filters.caller)
            and (filters.request_id is None or row.request_id == filters.request_id)
            and (filters.finish_reason is None or row.finish_reason == filters.finish_reason))
