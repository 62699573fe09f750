"""Admission never leaks (issue 30): a real ``proctor serve`` (the real model, compliance-mode audit in
SQLite, 2 rows and 2 waiting places) driven over gRPC, its counters read from a real metrics scrape.

- The exact sequence that once wedged the server: an overload burst, then calls that hit their deadline.
  (The cause: a call cancelled at its deadline while waiting for its audit record cancelled the record's
  future, the writer thread died resolving it, and every later call waited for a writer that was gone.)
- Random interleavings (hypothesis) of bursts, deadlines before, in and after admission, cancels and
  disconnects, several hundred calls in all, with a callers file so the per-caller slots are counted too:
  after each, every admission counter returns to zero and an 8-token request is served.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.admission import codes, issue30_sequence, random_plan, run_plan, served, settled, unexpected
from helpers.reliability import ServedProcess, free_port, health
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.real_model

BATCH, WAITING = 2, 2
SERVER_ARGS = ("--threads", "1", "--max-batch-size", str(BATCH), "--max-waiting", str(WAITING), "--watchdog-s", "10")
INTERLEAVINGS, CALLS = 12, (16, 36)  # ~300 calls in all
TOKENS = {"svc-a": "token-of-service-a-for-tests", "svc-b": "token-of-service-b-for-tests"}


def test_the_issue_30_sequence_leaves_the_server_serving(tmp_path: Path) -> None:
    metrics = free_port()
    server = ServedProcess(tmp_path, *SERVER_ARGS, "--metrics-port", str(metrics))
    try:
        server.wait_ready()
        outcomes = issue30_sequence(server.address)
        held = settled(f"127.0.0.1:{metrics}")
        status = health(server.address)
    finally:
        server.stop()
    by_step: dict[str, list[str]] = {}
    for outcome in outcomes:
        by_step.setdefault(outcome.step, []).append(outcome.code)
    assert set(by_step["2 burst"]) == {"OK", "RESOURCE_EXHAUSTED"}, by_step
    assert set(by_step["2 single while full"]) <= {"RESOURCE_EXHAUSTED", "OK"}, by_step
    for step in ("3 deadline", "5 stream deadline", "6 two deadlines"):
        assert set(by_step[step]) == {"DEADLINE_EXCEEDED"}, (step, by_step)
    for step in ("4 after one deadline", "7 after two deadlines"):
        assert by_step[step] == ["OK"], (step, outcomes)
    last = next(o for o in outcomes if o.step == "7 after two deadlines")
    assert last.seconds < 10, last  # served, not waited out to its deadline
    assert not any(held.values()), held
    assert status == "SERVING"
    # One record per call, whatever it ended with, in a log that still verifies.
    with sqlite3.connect(server.audit_db) as db:
        (records,) = db.execute("SELECT count(*) FROM audit_log WHERE kind = 'request'").fetchone()
    assert records == len(outcomes), (records, len(outcomes))
    assert "Traceback" not in server.log, server.log[-3000:]


@pytest.fixture(scope="module")
def callers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedProcess, str]]:
    import hashlib

    directory = tmp_path_factory.mktemp("admission")
    callers = directory / "callers.yaml"
    callers.write_text(f"""callers:
  - name: svc-a
    token_sha256: {hashlib.sha256(TOKENS['svc-a'].encode()).hexdigest()}
    roles: [generate]
    limits: {{concurrent_streams: 3}}
  - name: svc-b
    token_sha256: {hashlib.sha256(TOKENS['svc-b'].encode()).hexdigest()}
    roles: [generate]
""")
    metrics = free_port()
    server = ServedProcess(directory, *SERVER_ARGS, "--metrics-port", str(metrics), "--callers-file", str(callers))
    try:
        server.wait_ready()
        yield server, f"127.0.0.1:{metrics}"
    finally:
        server.stop()
    assert "Traceback" not in server.log, server.log[-3000:]


METADATA = [(("authorization", f"Bearer {TOKENS[name]}"),) for name in sorted(TOKENS)]


@settings(max_examples=INTERLEAVINGS, deadline=None, phases=[Phase.generate],  # no shrinking: each try is seconds
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), calls=st.integers(*CALLS))
def test_random_interleavings_return_every_counter_to_zero_and_serve_the_next_call(
        callers_server: tuple[ServedProcess, str], seed: int, calls: int) -> None:
    server, metrics = callers_server
    plan = random_plan(random.Random(seed), calls, callers=len(METADATA))
    results = run_plan(server.address, plan, METADATA)
    assert not unexpected(results), (seed, unexpected(results), codes(results))
    held = settled(metrics)
    assert held and not any(held.values()), (seed, held, codes(results))
    after = served(server.address, METADATA[0])
    assert after.code == "OK" and after.seconds < 10, (seed, after, codes(results))
    assert health(server.address, "proctor.v1.Generation") == "SERVING"
