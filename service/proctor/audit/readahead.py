"""Asking the kernel to read a SQLite log's file ahead of the rows being hashed (the first-start tree
build, verify's processes).

SQLite reads one 4 KB page at a time: a ``pread`` per page past its memory map (2 GB at most), each
a small synchronous read when the file is not in the page cache. Read that way, a cold 13 GB log came
off this VM's disk at 0.8 GB/s with 14 s of kernel CPU; the same reads behind ``POSIX_FADV_WILLNEED``
issued in 64 MB steps a window ahead ran at the disk's 1.6 GB/s with 5.6 s (bench/README.md, "Audit
proofs"). Rows are appended in ``seq`` order and never deleted, so they lie in the file in that order:
a row's share of the rows is where in the file to ask for. That is an estimate; a wrong one only reads
some megabytes early. Where the store has no local file (PostgreSQL) or the system no ``posix_fadvise``,
it does nothing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

STEP_BYTES = 64 << 20  # one WILLNEED request (16 MB steps measured slower than 64)
WINDOW_BYTES = 256 << 20  # asked for beyond the row named last


class Readahead:
    """A thread issuing ``WILLNEED`` over ``path`` up to where the rows named by ``through`` lie."""

    def __init__(self, path: Path | None, rows: int) -> None:
        self._fd: int | None = None
        self._rows, self._size = rows, 0
        self._target = self._issued = 0
        self._closed = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        if path is None or rows <= 0 or not hasattr(os, "posix_fadvise"):
            return
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        self._size = os.fstat(self._fd).st_size
        self._thread = threading.Thread(target=self._run, name="proctor-audit-readahead", daemon=True)
        self._thread.start()

    def through(self, seq: int) -> None:
        """Rows up to ``seq`` are read next: have the file read up to where they lie, and a window beyond."""
        if self._thread is None:
            return
        target = min(self._size, self._size * seq // self._rows + WINDOW_BYTES)
        with self._wake:
            if target > self._target:
                self._target = target
                self._wake.notify()

    @property
    def issued(self) -> int:
        """Bytes from the file's start asked for so far."""
        return self._issued

    def _run(self) -> None:
        assert self._fd is not None
        while True:
            with self._wake:
                while not self._closed and self._issued >= self._target:
                    self._wake.wait()
                if self._closed:
                    return
                target = self._target
            while self._issued < target:
                try:
                    os.posix_fadvise(self._fd, self._issued, STEP_BYTES, os.POSIX_FADV_WILLNEED)
                except OSError:  # a file system that does not read ahead: the reads go on without it
                    return
                self._issued += STEP_BYTES

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Readahead:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
