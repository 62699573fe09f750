"""The server's periodic jobs (audit/periodic.py: retention sweep, memory erasure): off the event loop, a failing
run logged and the next one run, and nothing more once stopped."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from proctor.audit.periodic import Periodic


def test_a_failing_run_is_logged_and_the_next_runs_off_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[str] = []

    def job() -> None:
        runs.append(threading.current_thread().name)
        if len(runs) == 1:
            raise OSError("the key store is not mounted")

    async def main() -> int:
        periodic = Periodic("memory-erasure", 0.01, job)
        periodic.start()
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        periodic.stop()
        await asyncio.sleep(0.05)
        return len(runs)

    with caplog.at_level(logging.ERROR, logger="proctor.audit"):
        stopped_at = asyncio.run(main())
    assert len(runs) == stopped_at  # nothing ran after stop
    assert threading.main_thread().name not in runs  # each run off the event loop's thread
    assert [r.getMessage() for r in caplog.records] == ["memory-erasure failed"]
