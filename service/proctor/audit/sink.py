"""The audit sink: a bounded queue feeding one writer thread that commits records in batches.

``submit`` returns a future that resolves (to ``Committed``: the record's row number, its Merkle leaf hash and the
commit time, what a receipt states) once the record is durably committed, or fails with the write error. In
compliance mode the API waits for it before completing a response, so no output leaves unaudited. A full queue
blocks ``submit``: that is back-pressure on admission, never on the decode loop (which does not touch the sink).

The writer tracks whether the store takes writes (``store_healthy``, reported to ``on_store_health``):
a failed commit marks it down; while down and idle, the writer asks the store for its head every
``STORE_PROBE_S`` and marks it up again when it answers (the server's health follows: README "Scale out").

A waiter may give up on its future (a call cancelled or past its deadline while it waits): the
writer claims each future as it takes the record (``set_running_or_notify_cancel``), writes the record
whatever the waiter did, and resolves only futures still waited on. The writer never dies of one
batch: an unexpected error fails that batch's waiters, is logged, and the writer takes the next
(``alive`` and ``stalled_s`` tell the server's watchdog otherwise).

The writer also appends a signed checkpoint every ``checkpoint_every`` records or
``checkpoint_interval_s`` seconds (whichever comes first, only when records arrived), to the
store and to the checkpoint file, and one at shutdown.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proctor.audit import FORMAT
from proctor.audit.canonical import canonical
from proctor.audit.chain import checkpoint_message, log_signer, public_key_text, row_hash, row_head, sign
from proctor.audit.kinds import CHECKPOINT, Columns, filter_columns
from proctor.audit.store import AuditStore, Row, TreeBorder
from proctor.audit.stored_body import compress
from proctor.audit.tree import head_digests, row_leaf_hash
from proctor_client.tlog.note import Checkpoint, sign_checkpoint

if TYPE_CHECKING:
    from proctor.observability.hooks import AuditObserver

log = logging.getLogger("proctor.audit")
BATCH_MAX = 256
STORE_PROBE_S = 1.0  # while the store is down and no record waits: how often the writer asks it again
CHECKPOINT_NOW: dict[str, Any] = {}  # queued in place of a record: a checkpoint is asked for (request_checkpoint)


@dataclass(frozen=True, slots=True)
class Committed:
    """Where a record landed: its row (``seq``; leaf index ``seq - 1``), its leaf hash, and when it was committed."""

    seq: int
    leaf_hash: bytes
    time_ms: int


_Item = tuple[bytes, Columns, "Future[Committed]"]  # stored body, kind and filter columns, its future
_Queued = tuple[dict[str, Any], "Future[Any]"]  # a record (Future[Committed]) or CHECKPOINT_NOW (Future[int])


class AuditUnavailable(RuntimeError):
    """The audit trail cannot take records (closed, or its store failed)."""


class AuditSink:
    def __init__(self, store: AuditStore, key: Ed25519PrivateKey, *, checkpoint_file: Path | None,
                 checkpoint_every: int = 1000, checkpoint_interval_s: float = 60.0, queue_size: int = 1024,
                 origin: str = "") -> None:
        self.store = store
        self._key = key
        self.public_key = public_key_text(key.public_key())
        self.signer = log_signer(key, origin)  # signs the checkpoints' C2SP notes; its name is the log's origin
        self._checkpoint_file = checkpoint_file
        self._every = checkpoint_every
        self._interval = checkpoint_interval_s
        self._queue: queue.Queue[_Queued | None] = queue.Queue(maxsize=queue_size)
        last = store.last()
        self._since_checkpoint = 0 if last is None or last.kind == "checkpoint" else 1
        self._last_checkpoint = time.monotonic()
        self._closed = False
        self._dead = False  # the writer is ending on an exception it does not survive
        self.written = 0
        self._progress = time.monotonic()  # when the writer last took a batch or found the queue empty
        self.observer: AuditObserver | None = None  # metrics: write latency and failures per batch
        self.store_healthy = True
        self.on_store_health: Callable[[bool, str], None] | None = None  # called on the writer thread on changes
        self._thread = threading.Thread(target=self._run, name="proctor-audit-writer", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The writer thread runs (False once closed, or if it died)."""
        return self._thread.is_alive()

    def stalled_s(self, now: float | None = None) -> float:
        """Seconds records have waited without the writer taking any (0 while the queue is empty or moving)."""
        if self._queue.empty():
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self._progress)

    def _check_open(self) -> None:
        if self._closed:
            raise AuditUnavailable("the audit trail is closed")
        if self._dead or not self._thread.is_alive():
            raise AuditUnavailable("the audit writer has stopped; no record can be written")

    def submit(self, body: dict[str, Any]) -> Future[Committed]:
        self._check_open()
        future: Future[Committed] = Future()
        self._queue.put((body, future))
        self._after_put()
        return future

    def try_submit(self, body: dict[str, Any]) -> Future[Committed] | None:
        """``submit`` if the queue has room now, else None (without blocking: for the event loop)."""
        self._check_open()
        future: Future[Committed] = Future()
        try:
            self._queue.put_nowait((body, future))
        except queue.Full:
            return None
        self._after_put()
        return future

    def _after_put(self) -> None:
        """A record queued while the writer was dying (after its last look at the queue) is failed here."""
        if self._dead:
            self._fail_queued([])

    def request_checkpoint(self) -> Future[int]:
        """Ask the writer for a checkpoint now (after what is queued), not at the next cadence: the future
        resolves once it is committed (to its ``seq``; 0 when the last row already was one)."""
        self._check_open()
        future: Future[int] = Future()
        self._queue.put((CHECKPOINT_NOW, future))
        self._after_put()
        return future

    def depth(self) -> int:
        """Records waiting for the writer (approximate, for the metrics scrape)."""
        return self._queue.qsize()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, a final checkpoint, and stop."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)

    # --- writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        # (Serialising the next batch on this thread while another commits measured only ~8% faster:
        # the committer needs the GIL for every row it binds, and orjson holds it ~100 µs a record.)
        stopping = False
        while not stopping:
            batch: list[_Queued] = []
            asked: list[Future[Any]] = []
            try:
                batch, stopping = self._next_batch()
                self._progress = time.monotonic()
                asked = [future for body, future in batch if body is CHECKPOINT_NOW]
                batch = [item for item in batch if item[0] is not CHECKPOINT_NOW]
                self._commit(self._serialise(batch), final=stopping or bool(asked), waiting=asked)
                if not batch and not self.store_healthy:
                    self._probe_store()
            except Exception as exc:  # a bug here must not leave every later call waiting on a dead writer
                log.exception("audit writer: a batch of %d records failed unexpectedly", len(batch))
                for future in [future for _, future in batch] + asked:
                    _reject(future, AuditUnavailable(f"the audit record could not be written: {exc}"))
            except BaseException as exc:  # the thread ends (SystemExit, KeyboardInterrupt...): no waiter may hang
                log.critical("audit writer: stopping on %s; no record can be written any more", type(exc).__name__)
                self._dead = True
                self._fail_queued(batch)
                raise

    def _fail_queued(self, batch: list[_Queued]) -> None:
        """Fail the records of a dying writer: its batch and every one still queued."""
        error = AuditUnavailable("the audit writer has stopped; no record can be written")
        for _, future in batch:
            _reject(future, error)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                _reject(self._claim(item)[1], error)

    def _probe_store(self) -> None:
        try:
            self.store.last()
        except Exception as exc:
            log.debug("audit store still unavailable: %s", exc)
            return
        self._set_store_health(True, "the store answers again")

    def _set_store_health(self, healthy: bool, reason: str) -> None:
        if healthy == self.store_healthy:
            return
        self.store_healthy = healthy
        log.log(logging.INFO if healthy else logging.ERROR, "audit store %s: %s", "available again" if healthy
                else "unavailable", reason)
        if self.on_store_health is not None:
            try:
                self.on_store_health(healthy, reason)
            except Exception:  # a listener must not stop the writer
                log.exception("audit store health listener failed")

    def _next_batch(self) -> tuple[list[_Queued], bool]:
        """Up to BATCH_MAX queued records (waiting at most until the next checkpoint is due); and "stop"."""
        batch: list[_Queued] = []
        wait = max(0.05, self._interval - (time.monotonic() - self._last_checkpoint))
        if not self.store_healthy:
            wait = min(wait, STORE_PROBE_S)
        try:
            item = self._queue.get(timeout=wait)
        except queue.Empty:
            return batch, False
        while True:
            if item is None:
                return batch, True
            batch.append(self._claim(item))
            if len(batch) >= BATCH_MAX:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False

    @staticmethod
    def _claim(item: _Queued) -> _Queued:
        """Mark the record's future as being written: from here its waiter can no longer cancel it
        (a future cancelled before stays cancelled; its record is written all the same)."""
        item[1].set_running_or_notify_cancel()
        return item
    def _serialise(self, batch: list[_Queued]) -> list[_Item]:
        """Stored body (compressed canonical JSON) and filter columns of each record; a record that
        has none fails alone."""
        items: list[_Item] = []
        for body, future in batch:
            try:
                items.append((compress(canonical(body)), filter_columns(body), future))
            except Exception as exc:
                log.exception("audit record %s cannot be serialised", body.get("audit_id"))
                _reject(future, AuditUnavailable(f"the audit record cannot be serialised: {exc}"))
        return items

    def _commit(self, items: list[_Item], final: bool, waiting: list[Future[Any]] | None = None) -> None:
        """Chain, checkpoint and commit one batch in one transaction; then resolve its futures.

        The chain continues from the head the store reads *inside* the write transaction, so
        several servers can share one store (PostgreSQL) without forking the chain.
        """
        due = final or time.monotonic() - self._last_checkpoint >= self._interval
        if not items and not (due and self._since_checkpoint):
            for future in waiting or []:  # nothing new since the last checkpoint: it is the one asked for
                if future.running():
                    future.set_result(0)
            return

        def build(head_seq: int, head_hash: str, tree: TreeBorder) -> list[Row]:
            rows: list[Row] = []
            seq, prev, pending = head_seq, head_hash, self._since_checkpoint
            for data, (kind, audit_id, time_ms, caller, request_id, finish), _ in items:
                seq += 1
                head = row_head(seq, prev, kind, audit_id, time_ms, caller, request_id, finish)
                digest, leaf = head_digests(head, data)
                tree.append(leaf)
                rows.append(Row(seq, audit_id, kind, time_ms, caller, request_id, finish, data, prev, digest))
                prev, pending = digest, pending + 1
                if pending >= self._every:
                    seq += 1
                    rows.append(self._checkpoint_row(seq, seq - 1, prev, tree))
                    prev, pending = rows[-1].hash, 0
            if pending and due:
                seq += 1
                rows.append(self._checkpoint_row(seq, seq - 1, prev, tree))
            return rows

        start = time.perf_counter()
        try:
            rows = self.store.append_chained(build)
        except Exception as exc:
            log.exception("audit write failed (%d records)", len(items))
            if self.observer is not None:
                self.observer.audit_written(time.perf_counter() - start, len(items), False)
            for future in [future for _, _, future in items] + (waiting or []):
                _reject(future, AuditUnavailable(f"the audit record could not be written: {exc}"))
            self._set_store_health(False, f"{type(exc).__name__}: {exc}")
            return
        self._set_store_health(True, "a write succeeded")
        if self.observer is not None:
            self.observer.audit_written(time.perf_counter() - start, len(items), True)
        committed_ms = int(time.time() * 1000)
        records = [row for row in rows if row.kind != CHECKPOINT]
        for row in rows:
            if row.kind == "checkpoint":
                self._since_checkpoint = 0
                self._last_checkpoint = time.monotonic()
                self._append_checkpoint_file(row)
            else:
                self._since_checkpoint += 1
        self.written += len(records)
        for (_, _, future), row in zip(items, records, strict=True):
            if future.running():  # not cancelled by its waiter (the record is written either way)
                future.set_result(Committed(row.seq, row_leaf_hash(row), committed_ms))
        checkpoint = max((row.seq for row in rows if row.kind == "checkpoint"), default=0)
        for future in waiting or []:
            if future.running():
                future.set_result(checkpoint)

    def _checkpoint_row(self, seq: int, covers_seq: int, covers_hash: str, tree: TreeBorder) -> Row:
        """A checkpoint: the chain's signature over the row before it, and the C2SP signed note of the
        Merkle tree over every row up to it (``tree`` holds ``covers_seq`` leaves; the row is appended to it)."""
        now_ms = int(time.time() * 1000)
        note = sign_checkpoint(Checkpoint(self.signer.name, tree.size, tree.root()), self.signer)
        body = {"format": FORMAT, "kind": "checkpoint", "checkpoint_seq": covers_seq, "checkpoint_hash": covers_hash,
                "time_ms": now_ms, "public_key": self.public_key, "note": note,
                "signature": sign(self._key, checkpoint_message(covers_seq, covers_hash, now_ms))}
        data, audit_id = compress(canonical(body)), f"checkpoint-{seq}"
        row = Row(seq, audit_id, "checkpoint", now_ms, "", "", "", data, covers_hash,
                  row_hash(seq, covers_hash, "checkpoint", audit_id, now_ms, "", "", "", data))
        tree.append(row_leaf_hash(row))
        return row

    def _append_checkpoint_file(self, row: Row) -> None:
        if self._checkpoint_file is None:
            return
        body = json.loads(row.record_json())
        line = json.dumps({"seq": row.seq, "hash": row.hash, "checkpoint_seq": body["checkpoint_seq"],
                           "checkpoint_hash": body["checkpoint_hash"], "time_ms": body["time_ms"],
                           "public_key": body["public_key"], "signature": body["signature"]})
        with open(self._checkpoint_file, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def _reject(future: Future[Any], exc: Exception) -> None:
    """Fail a record's future unless its waiter gave up on it or it is already settled."""
    if future.running():
        future.set_exception(exc)
