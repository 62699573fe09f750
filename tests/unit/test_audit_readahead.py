"""audit/readahead.py: the file is asked for up to where the rows named lie, a window beyond, never past its end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from proctor.audit import readahead
from proctor.audit.readahead import Readahead


def _until(condition, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_the_file_is_asked_for_as_far_as_the_rows_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readahead, "STEP_BYTES", 4096)
    monkeypatch.setattr(readahead, "WINDOW_BYTES", 8192)
    path = tmp_path / "log.db"
    path.write_bytes(bytes(1 << 20))  # 1 MiB, "100 rows"
    with Readahead(path, 100) as ahead:
        assert ahead.issued == 0  # nothing before a row is named
        ahead.through(50)  # row 50 lies at ~512 KiB: up to there and the window
        assert _until(lambda: ahead.issued >= (1 << 19) + 8192)
        time.sleep(0.05)
        assert ahead.issued < (1 << 19) + 8192 + 4096  # and no further
        ahead.through(10)  # behind what was asked: nothing more
        time.sleep(0.05)
        assert ahead.issued < (1 << 19) + 8192 + 4096
        ahead.through(100)
        assert _until(lambda: ahead.issued >= 1 << 20)
        time.sleep(0.05)
        assert ahead.issued < (1 << 20) + 4096  # never past the file's end


def test_without_a_local_file_it_does_nothing(tmp_path: Path) -> None:
    with Readahead(None, 100) as ahead:  # PostgreSQL: the server reads its own files
        ahead.through(100)
        assert ahead.issued == 0
    with Readahead(tmp_path / "absent.db", 100) as ahead:
        ahead.through(100)
        assert ahead.issued == 0
