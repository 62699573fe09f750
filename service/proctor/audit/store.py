"""What an audit store does (SQLite and PostgreSQL implement the same protocol and schema).

A row: ``seq`` (1, 2, …), ``audit_id``, ``kind`` ("request" or "checkpoint"), ``time_ms``,
``caller``, ``request_id``, ``finish_reason``, ``body`` (the record's canonical JSON, compressed
since ``proctor.audit/3``: ``stored_body``), ``prev_hash`` and ``hash``. The filter columns are
copies of record fields; the hash covers them (``proctor.audit/2`` on; for ``proctor.audit/1``
rows ``verify`` compares them with the record).
The stores refuse UPDATE and DELETE. Beside the rows, ``audit_tree_nodes`` holds the Merkle tree over
them (``id``, ``hash``: each node under its post-order number, audit/tree.py) and ``audit_cosignatures``
the witnesses' cosignatures of its checkpoints, append-only in the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from proctor.audit import stored_body

COLUMNS = "seq, audit_id, kind, time_ms, caller, request_id, finish_reason, body, prev_hash, hash"
RawRow = tuple[int, str, str, int, str, str, str, bytes, str, str]  # a row as selected: COLUMNS, Row's field order


class TreeBorder(Protocol):
    """The Merkle tree's right border as a write transaction sees it (``tree.CompactRange``)."""

    size: int

    def append(self, digest: bytes) -> None: ...

    def root(self) -> bytes: ...


Build = Callable[[int, str, TreeBorder], list["Row"]]  # (head seq, head hash, the tree's border) -> new rows


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

    def record_json(self) -> bytes:
        """The record's canonical JSON (``body`` as stored may be compressed)."""
        return stored_body.record_json(self.body)


@dataclass(frozen=True, slots=True)
class Filters:
    since_ms: int | None = None
    until_ms: int | None = None
    caller: str | None = None
    request_id: str | None = None
    finish_reason: str | None = None
    include_checkpoints: bool = False  # every row, whatever its kind (else only ``kind``'s)
    kind: str = "request"  # audit/kinds.py: request (calls) or access (reads of the log)


class AuditStore(Protocol):
    description: str

    def append_chained(self, build: Build) -> list[Row]:
        """In one durable write transaction: read the head (last seq and hash; 0 and GENESIS when
        empty) and the Merkle tree's border (``audit/tree.py``), insert ``build(seq, hash, border)``
        and the tree nodes its rows complete (the build may append its rows' leaves to the border
        itself, to sign a root; the store appends the rest), commit; return the rows. Writers are
        serialised."""

    def append_leaves(self, start: int, leaves: list[bytes]) -> int:
        """Append leaf hashes of rows already in the log if the tree has exactly ``start`` leaves (the
        first-start build); the tree's size after."""

    def tree_size(self) -> int | None:
        """Leaves in the tree; None when the store has no tree table (a log from before it, opened read-only)."""

    def tree_nodes(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """The stored nodes among ``keys`` ((level, index) pairs)."""

    def tree_leaves(self, first: int, count: int) -> list[bytes]:
        """The stored leaf hashes among leaves ``first``..``first + count - 1``, in order; a missing one is
        absent (the ones after it move up: callers compare positions with rows)."""

    def tree_span(self, first_id: int, last_id: int) -> list[tuple[int, bytes]]:
        """The stored nodes with post-order ids ``first_id``..``last_id`` (``tree.node_id``), in id order."""

    def add_cosignature(self, tree_size: int, witness: str, line: str, time_ms: int) -> bool:
        """Keep a witness's (checked) cosignature line of the checkpoint of ``tree_size``; False if it had one."""

    def cosignatures(self, tree_size: int) -> list[str]:
        """The cosignature lines kept for the checkpoint of ``tree_size``."""

    def row(self, seq: int) -> Row | None: ...

    def last_checkpoint(self, before_seq: int | None = None) -> Row | None: ...

    def last(self) -> Row | None: ...

    def get(self, audit_id: str) -> Row | None: ...

    def iterate(self, filters: Filters | None = None, start_seq: int = 1) -> Iterator[Row]:
        """Rows in ``seq`` order (all rows when ``filters`` is None)."""

    def read_page(self, first_seq: int, limit: int) -> list[RawRow]:
        """Up to ``limit`` rows with ``seq >= first_seq`` in ``seq`` order, as plain tuples (the
        verifier's bulk read: no ``Row`` built per record; safe to call from several threads)."""

    def count(self) -> int: ...

    def reader(self) -> Callable[[], AuditStore]:
        """A picklable callable that opens another reading connection to the same store (verify's
        processes each open one)."""

    def local_file(self) -> Path | None:
        """The database file when this process reads it directly (SQLite), for reading it ahead
        (``audit/readahead.py``); None for a server's store (PostgreSQL)."""

    def close(self) -> None: ...


def filter_sql(filters: Filters | None, placeholder: str) -> tuple[list[str], list[object]]:
    """WHERE terms and parameters for ``filters`` (``placeholder`` is "?" or "%s"); the first term,
    ``seq >= ?``, is the paging cursor, its parameter set by the caller."""
    where: list[str] = [f"seq >= {placeholder}"]
    params: list[object] = [0]
    if filters is None:
        return where, params
    if not filters.include_checkpoints:
        where.append(f"kind = {placeholder}")
        params.append(filters.kind)
    for column, op, value in (("time_ms", ">=", filters.since_ms), ("time_ms", "<", filters.until_ms),
                              ("caller", "=", filters.caller), ("request_id", "=", filters.request_id),
                              ("finish_reason", "=", filters.finish_reason)):
        if value is not None:
            where.append(f"{column} {op} {placeholder}")
            params.append(value)
    return where, params


def row_from_columns(raw: tuple[object, ...]) -> Row:
    """A stored row from the database's columns (TypeError when one has a type no honest row has)."""
    seq, audit_id, kind, time_ms, caller, request_id, finish, body, prev, hash_ = raw
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"row {seq}: the body column holds {type(body).__name__}, not bytes")
    return Row(_integer(seq), str(audit_id), str(kind), _integer(time_ms), str(caller), str(request_id), str(finish),
               bytes(body), str(prev), str(hash_))


def _integer(value: object) -> int:
    if not isinstance(value, int | str | float):
        raise TypeError(f"an integer column holds {type(value).__name__}")
    return int(value)
