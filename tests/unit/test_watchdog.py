"""The watchdog (issue 30): a part with pending work that does not move is reported stuck after ``stall_s``,
and well again once it moves. The engine is the real tiny engine, its thread held back so its work waits;
the audit writer is the real sink, closed so its thread is gone. Time is passed in, so nothing sleeps."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from helpers.engine import Collector

from proctor.audit.chain import load_or_create_signing_key
from proctor.audit.sink import AuditSink
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.domain import GenerationRequest, StoppingParams
from proctor.observability.watchdog import EngineProgress, Watchdog, WriterProgress

STALL_S = 5.0


def request(request_id: str) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt="Hello",
                             stopping=StoppingParams(max_new_tokens=2, ignore_eos=True))


def test_an_engine_with_waiting_work_and_no_steps_is_stuck_until_it_steps(
        make_engine, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False)
    watchdog = Watchdog([EngineProgress(engine)], STALL_S)
    now = time.monotonic()
    watchdog.check(now)
    assert not watchdog.wedged  # idle: nothing pending
    collector = Collector()
    engine.submit(engine.prepare(request("held")), collector)  # queued; the loop thread is not running
    watchdog.check(now + 1)
    watchdog.check(now + 1 + STALL_S - 0.5)
    assert not watchdog.wedged  # pending, but not for stall_s yet
    with caplog.at_level(logging.ERROR, logger="proctor.watchdog"):
        watchdog.check(now + 1 + STALL_S + 0.5)
    assert "engine" in watchdog.wedged and "waiting=1" in watchdog.wedged["engine"]
    assert "the engine is stuck" in caplog.text
    engine.start()
    collector.wait()
    watchdog.check(now + 100)
    assert not watchdog.wedged


def test_a_busy_engine_is_never_stuck(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine()
    watchdog = Watchdog([EngineProgress(engine)], STALL_S)  # a step of the tiny model takes milliseconds
    collectors = [Collector() for _ in range(3)]
    for index, collector in enumerate(collectors):
        engine.submit(engine.prepare(GenerationRequest(
            request_id=f"busy-{index}", prompt="Hello", stopping=StoppingParams(max_new_tokens=200, ignore_eos=True))),
            collector)
    checks = 0
    while not all(c.done.is_set() for c in collectors):
        checks += 1
        watchdog.check()
        assert not watchdog.wedged, watchdog.wedged
        time.sleep(0.05)
    assert checks > 1
    assert engine.admission_counts() == {"reserved": 0, "waiting": 0, "staged": 0, "running": 0, "beams": 0,
                                         "fallbacks": 0, "live": 0}


def test_a_dead_audit_writer_is_stuck_at_once(tmp_path: Path) -> None:
    sink = AuditSink(SQLiteAuditStore(tmp_path / "a.db"), load_or_create_signing_key(tmp_path / "k.pem"),
                     checkpoint_file=None)
    watchdog = Watchdog([WriterProgress(sink)], STALL_S)
    watchdog.check()
    assert not watchdog.wedged
    sink.close()
    watchdog.check()
    assert "its thread has stopped" in watchdog.wedged["audit writer"]
