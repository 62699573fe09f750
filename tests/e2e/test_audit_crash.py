"""Crash test: ``kill -9`` the server during concurrent load, restart it on the same audit database,
and check that ``proctor audit verify`` passes and that every response a client received is in the
log with all its tokens (compliance mode: a response is only sent once its record is committed)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from proctor.audit.stored_body import record_json
from proctor_client import ProctorClient, ProctorError

pytestmark = pytest.mark.real_model
CLIENTS = 4


def test_kill_9_under_load_loses_no_answered_call(serve_process: Callable[..., object], cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "audit.db"
    flags = ("--audit-db", str(db), "--no-warmup", "--max-batch-size", "4")
    server = serve_process(*flags)
    assert server.wait_for_log(r"ready: serving", 240), server.log  # type: ignore[attr-defined]
    received: dict[str, list[int]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def load(worker: int) -> None:
        with ProctorClient(server.address, timeout_s=60) as client:  # type: ignore[attr-defined]
            number = 0
            while not stop.is_set():
                number += 1
                try:
                    response = client.generate(f"Worker {worker}, story {number}:", max_new_tokens=12,
                                               request_id=f"crash-{worker}-{number}")
                except ProctorError:
                    return  # the server died under this call: no response, no promise
                with lock:
                    received[response.audit_id] = list(response.token_ids)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(received) < 6:
        time.sleep(0.2)
    server.kill()  # type: ignore[attr-defined]  # SIGKILL: no drain, no final checkpoint
    stop.set()
    for thread in threads:
        thread.join(60)
    assert len(received) >= 6, "the load never got going"

    restarted = serve_process(*flags)
    assert restarted.wait_for_log(r"ready: serving", 240), restarted.log  # type: ignore[attr-defined]
    with ProctorClient(restarted.address, timeout_s=60) as client:  # type: ignore[attr-defined]
        after = client.generate("After the crash:", max_new_tokens=4)
    restarted.terminate()  # type: ignore[attr-defined]
    assert restarted.wait(60) == 0  # type: ignore[attr-defined]

    verified = cli("audit", "verify", "--db", str(db))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    with sqlite3.connect(db) as conn:
        bodies = {row[0]: json.loads(record_json(row[1])) for row in conn.execute(
            "SELECT audit_id, body FROM audit_log WHERE kind = 'request'")}
    for audit_id, tokens in received.items():
        assert audit_id in bodies, f"answered call {audit_id} is missing from the log"
        assert [t["id"] for t in bodies[audit_id]["tokens"]] == tokens
    assert after.audit_id in bodies
