"""Reliability, small and fast (issue 14; the full-size runs and their figures: bench/reliability.py).

Each test drives a real ``proctor serve`` process with the real model over gRPC: overload at 3× what
the server holds, SIGTERM under load, kill -9 under load with the audit log checked after each
restart, and generated requests of every RPC (hypothesis over the protobuf descriptors, and raw bytes).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from helpers.fuzz import RPCS, FuzzTally, fuzz_rpc
from helpers.reliability import ServedProcess, health, kill_under_load, overload, sigterm_under_load

pytestmark = pytest.mark.real_model

BATCH, WAITING = 2, 2  # the server holds BATCH running + WAITING waiting calls
FUZZ_EXAMPLES = 150  # per RPC here; bench/reliability.py runs 10,000


def test_at_three_times_capacity_every_excess_call_is_refused_with_a_retry_hint(tmp_path: Path) -> None:
    server = ServedProcess(tmp_path, "--max-batch-size", str(BATCH), "--max-waiting", str(WAITING))
    try:
        server.wait_ready()
        result = overload(server.address, calls=3 * (BATCH + WAITING), tokens=32)
    finally:
        server.stop()
    codes = result.by_code()
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes  # nothing else: no INTERNAL, no UNAVAILABLE
    # What fits is served: at least the waiting queue's worth (the batch takes calls from it only at its
    # next step, so at the instant of the burst the queue alone may be what holds them).
    assert codes.get("OK", 0) >= WAITING, codes
    assert len(result.refusals) >= result.calls - 2 * (BATCH + WAITING), codes  # (slots freed meanwhile)
    assert all(refusal.retry_hint for refusal in result.refusals)  # RetryInfo on every one


def test_sigterm_under_load_drains_with_not_serving_visible_and_loses_no_record(tmp_path: Path) -> None:
    notice_s = 2.0
    result = sigterm_under_load(tmp_path, streams=3, tokens=48, notice_s=notice_s)
    assert result.exit_code == 0
    assert result.not_serving_s >= notice_s - 0.5, result.timeline  # visible to a poller through the notice
    statuses = [status for _, status, _ in result.timeline]
    first_not_serving = statuses.index("NOT_SERVING")
    assert "SERVING" not in statuses[first_not_serving:], result.timeline
    codes = {outcome.code for outcome in result.outcomes}
    assert codes <= {"OK", "UNAVAILABLE"}, codes  # in flight: finished; after the port closed: UNAVAILABLE
    assert sum(outcome.code == "OK" for outcome in result.outcomes) >= 3
    assert result.log.verified and not result.log.missing and not result.log.mismatched, result.log


def test_after_kill_9_under_load_the_log_verifies_and_holds_every_response(tmp_path: Path) -> None:
    rounds = kill_under_load(tmp_path, rounds=2, streams=3, tokens=16)
    for number, killed in enumerate(rounds):
        assert killed.log.verified, (number, killed.log.problem)
        assert not killed.log.missing and not killed.log.mismatched, (number, killed.log)
        assert {outcome.code for outcome in killed.outcomes} <= {"OK", "UNAVAILABLE", "CANCELLED"}
    assert sum(outcome.code == "OK" for killed in rounds for outcome in killed.outcomes) >= 2


def test_generated_requests_of_every_rpc_never_end_internal_and_name_their_field(tmp_path: Path) -> None:
    server = ServedProcess(tmp_path, "--max-new-tokens-limit", "4")
    tally = FuzzTally()
    try:
        server.wait_ready()
        with grpc.insecure_channel(server.address) as channel:
            for rpc in RPCS:
                fuzz_rpc(channel, rpc, FUZZ_EXAMPLES, tally)
        assert health(server.address) == "SERVING"  # and still healthy after all of it
    finally:
        server.stop()
    assert not tally.failures, tally.failures[:10]
    for rpc in RPCS:
        assert tally.total(rpc) == FUZZ_EXAMPLES
        assert "INVALID_ARGUMENT" in tally.codes[rpc], (rpc, tally.codes[rpc])
    assert tally.codes["Generate"].get("OK", 0) > 0  # some reached the engine and ran
