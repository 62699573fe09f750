"""The audit writer and the callers that wait on it (issue 30).

A call that waits for its record in compliance mode can give up while it waits: its client cancels, or
its deadline passes. Cancelling the wait used to cancel the record's future; the writer then failed to
resolve it (``InvalidStateError``), its thread died, and every later call in compliance mode waited
forever for a writer that was gone. Here a real SQLite store behind the real sink, paused on a latch
so the order of events is exact: whatever a waiter does, its record is written, the writer lives on,
and the next record is committed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_audit_store import body

from proctor.audit.chain import load_or_create_signing_key
from proctor.audit.sink import AuditSink, AuditUnavailable
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.audit.store import Build, Row
from proctor.audit.verify import verify_log
from proctor_client.tlog.note import load_public_key


class LatchedStore(SQLiteAuditStore):
    """A real SQLite store whose next write waits until ``release`` (``entered`` says the writer is in it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self._gate = threading.Event()
        self._gate.set()

    def hold(self) -> None:
        self._gate.clear()
        self.entered.clear()

    def release(self) -> None:
        self._gate.set()

    def append_chained(self, build: Build) -> list[Row]:
        self.entered.set()
        assert self._gate.wait(10), "the test never released the store"
        return super().append_chained(build)


@pytest.fixture
def latched(tmp_path: Path) -> Iterator[tuple[AuditSink, LatchedStore]]:
    store = LatchedStore(tmp_path / "audit.db")
    sink = AuditSink(store, load_or_create_signing_key(tmp_path / "k.pem"), checkpoint_file=tmp_path / "c",
                     checkpoint_every=1000)
    yield sink, store
    store.release()
    sink.close()


def records_in(tmp_path: Path) -> int:
    result = verify_log(SQLiteAuditStore(tmp_path / "audit.db", readonly=True),
                        public_key=load_public_key(str(tmp_path / "k.pem")), checkpoint_file=tmp_path / "c")
    assert result.ok, result
    return result.records


def test_a_future_cancelled_before_the_writer_takes_it_is_still_written(
        latched: tuple[AuditSink, LatchedStore], tmp_path: Path) -> None:
    sink, store = latched
    store.hold()
    first = sink.submit(body(1))
    assert store.entered.wait(10)  # the writer holds record 1; record 2 waits in the queue
    second = sink.submit(body(2))
    assert second.cancel()  # its waiter gave up while the record was queued
    store.release()
    assert first.result(10).seq == 1
    assert sink.submit(body(3)).result(10).seq == 3  # the writer lives on; record 2 took seq 2
    assert sink.alive and second.cancelled()
    sink.close()
    assert records_in(tmp_path) == 3


def test_a_future_the_writer_took_cannot_be_cancelled_and_resolves(
        latched: tuple[AuditSink, LatchedStore]) -> None:
    sink, store = latched
    store.hold()
    future = sink.submit(body(1))
    assert store.entered.wait(10)
    assert not future.cancel()  # being written: the waiter may stop waiting, the record stays
    store.release()
    assert future.result(10).seq == 1


def test_an_asyncio_waiter_past_its_deadline_leaves_the_writer_serving(
        latched: tuple[AuditSink, LatchedStore], tmp_path: Path) -> None:
    """What the servicer does in compliance mode: ``await asyncio.wrap_future(future)`` under a deadline."""
    sink, store = latched
    store.hold()
    sink.submit(body(1))
    assert store.entered.wait(10)

    async def wait_with_deadline(future: Any) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.wrap_future(future), 0.05)

    asyncio.run(wait_with_deadline(sink.submit(body(2))))
    store.release()
    assert sink.submit(body(3)).result(10).seq == 3
    assert sink.alive
    sink.close()
    assert records_in(tmp_path) == 3


class FailingOnce:
    """An observer whose first report raises: an unexpected error inside the writer's loop."""

    def __init__(self) -> None:
        self.calls = 0

    def audit_written(self, seconds: float, records: int, ok: bool) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("observer bug")


def test_an_unexpected_error_fails_its_batch_and_the_writer_goes_on(
        latched: tuple[AuditSink, LatchedStore]) -> None:
    sink, _ = latched
    sink.observer = FailingOnce()  # type: ignore[assignment]
    with pytest.raises(AuditUnavailable, match="observer bug"):
        sink.submit(body(1)).result(10)
    assert sink.alive
    assert sink.submit(body(2)).result(10).seq == 2  # (record 1 was committed; only its report failed)


def test_stalled_counts_only_while_records_wait_untaken(latched: tuple[AuditSink, LatchedStore]) -> None:
    sink, store = latched
    assert sink.stalled_s() == 0.0  # nothing queued
    store.hold()
    sink.submit(body(1))
    assert store.entered.wait(10)
    sink.submit(body(2))  # queued behind the held write, untaken
    assert sink.stalled_s(time.monotonic() + 100) >= 99
    store.release()


def test_a_closed_sink_refuses_records_and_says_why(latched: tuple[AuditSink, LatchedStore]) -> None:
    sink, _ = latched
    sink.close()
    assert not sink.alive
    with pytest.raises(AuditUnavailable, match="closed"):
        sink.submit(body(1))


class WriterKilled(BaseException):
    """Not an ``Exception`` (as SystemExit or KeyboardInterrupt): the writer does not survive it."""


class DyingStore(LatchedStore):
    """A latched store whose held write raises ``WriterKilled`` once released (issue 26: a dead writer)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.dying = False

    def append_chained(self, build: Build) -> list[Row]:
        self.entered.set()
        assert self._gate.wait(10), "the test never released the store"
        if self.dying:
            raise WriterKilled("the writer thread ends")
        return super().append_chained(build)


@pytest.fixture
def dying(tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AuditSink, DyingStore, list[BaseException]]]:
    ended: list[BaseException] = []  # how the writer thread ended (caught here instead of a pytest warning)
    monkeypatch.setattr(threading, "excepthook", lambda args: ended.append(args.exc_value))
    store = DyingStore(tmp_path / "audit.db")
    sink = AuditSink(store, load_or_create_signing_key(tmp_path / "k.pem"), checkpoint_file=tmp_path / "c")
    yield sink, store, ended
    store.release()
    sink.close(timeout_s=5)


def wait_dead(sink: AuditSink, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while sink.alive and time.monotonic() < end:
        time.sleep(0.01)
    assert not sink.alive, "the writer survived a BaseException"


def test_a_writer_killed_mid_write_fails_its_record_and_every_queued_one(
        dying: tuple[AuditSink, DyingStore, list[BaseException]]) -> None:
    """Before issue 26 these futures were never resolved: each waiter in compliance mode sat out its deadline."""
    sink, store, ended = dying
    store.hold()
    store.dying = True
    taken = sink.submit(body(1))
    assert store.entered.wait(10)  # the writer holds record 1; records 2 and 3 wait in the queue
    queued = [sink.submit(body(2)), sink.submit(body(3))]
    store.release()
    for future in (taken, *queued):
        with pytest.raises(AuditUnavailable, match="audit writer has stopped"):
            future.result(10)
    wait_dead(sink)
    assert [type(e) for e in ended] == [WriterKilled]  # the thread ended on the exception, not on its own
    with pytest.raises(AuditUnavailable, match="audit writer has stopped"):
        sink.submit(body(4))


def test_a_record_queued_as_the_writer_died_is_failed_not_left_waiting(
        dying: tuple[AuditSink, DyingStore, list[BaseException]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The window between a caller's check that the writer runs and its record reaching the queue."""
    sink, store, _ = dying
    store.dying = True
    with pytest.raises(AuditUnavailable):
        sink.submit(body(1)).result(10)
    wait_dead(sink)
    monkeypatch.setattr(sink, "_check_open", lambda: None)  # as if it had looked just before the death
    late = sink.try_submit(body(2))
    assert late is not None
    with pytest.raises(AuditUnavailable, match="audit writer has stopped"):
        late.result(1)
