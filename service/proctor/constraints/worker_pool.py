"""Compile worker processes: started ahead of time, killed and replaced when a compile overruns."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection

from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintSpec
from proctor.constraints.worker import WorkerConfig

log = logging.getLogger("proctor.constraints")
STARTUP_TIMEOUT_S = 120.0
TIME_LIMIT = "compile time limit"
WORKER_DIED = "the compile worker died"
STUCK_PREFIXES = (TIME_LIMIT, WORKER_DIED)  # failures that say the engine cannot take this schema at all


@dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    conn: Connection

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)
        self.conn.close()


class WorkerPool:
    """At most ``size`` concurrent compiles, each in its own process."""

    def __init__(self, config: WorkerConfig, size: int = 1) -> None:
        self._config = config
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.Semaphore(max(1, size))
        self._size = max(1, size)
        self._settled = threading.Event()  # clear while started workers are still being adopted
        self._settled.set()
        self._starting: list[subprocess.Popen[bytes]] = []  # started, not adopted yet (close kills them too)
        self.restarts = 0

    def prewarm(self) -> None:
        """Start the workers now (tokenizer + engine tables take seconds), not on a request's path."""
        self.adopt(self.start_workers())

    def start_workers(self) -> list[tuple[subprocess.Popen[bytes], Connection]]:
        """Start every worker at once, without waiting (with a 152k-token vocabulary one takes ~8 s). A compile
        asked for before ``adopt`` has them waits for them rather than starting one more."""
        self._settled.clear()
        started = [self._start() for _ in range(self._size)]
        self._starting = [process for process, _ in started]
        return started

    def adopt(self, started: list[tuple[subprocess.Popen[bytes], Connection]]) -> None:
        """Wait for the started workers to be ready and keep them idle."""
        try:
            for process, conn in started:
                self._idle.put(self._ready(process, conn))
        finally:
            self._starting = []
            self._settled.set()

    def _spawn(self) -> _Worker:
        return self._ready(*self._start())

    def _start(self) -> tuple[subprocess.Popen[bytes], Connection]:
        """Start ``python -m proctor.constraints.worker`` connected by a socket pair."""
        ours, theirs = socket.socketpair()
        config = json.dumps(dataclasses.asdict(self._config))
        process = subprocess.Popen(
            [sys.executable, "-m", "proctor.constraints.worker", str(theirs.fileno()), config],
            pass_fds=(theirs.fileno(),), env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        theirs.close()
        return process, Connection(ours.detach())

    def _ready(self, process: subprocess.Popen[bytes], conn: Connection) -> _Worker:
        """The started worker once it says it is ready (killed, and an error, when it does not)."""
        try:
            ready = conn.poll(STARTUP_TIMEOUT_S) and conn.recv() == ("ready",)
        except EOFError:
            ready = False
        if not ready:
            process.kill()
            conn.close()
            raise RuntimeError(f"the constraint compile worker did not start (exit status {process.poll()})")
        return _Worker(process, conn)

    def _take(self) -> _Worker:
        self._settled.wait(STARTUP_TIMEOUT_S)
        try:
            worker = self._idle.get_nowait()
        except queue.Empty:
            return self._spawn()
        if not worker.alive():
            worker.kill()
            return self._spawn()
        return worker

    def compile(self, backend: str, spec: ConstraintSpec, timeout_s: float) -> tuple[bytes, float]:
        """Return (serialized compiled constraint, compile ms) or raise ConstraintError."""
        with self._slots:
            worker = self._take()
            try:
                worker.conn.send((backend, spec))
                if not worker.conn.poll(timeout_s):
                    self._replace(worker)
                    raise ConstraintError(f"{TIME_LIMIT} of {timeout_s:g} s exceeded", backend)
                reply = worker.conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as exc:
                self._replace(worker)
                raise ConstraintError(f"{WORKER_DIED} on this constraint ({exc!r})", backend) from exc
            self._idle.put(worker)
        status, payload, ms = reply
        if status != "ok":
            raise ConstraintError(str(payload), backend)
        return payload, ms

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.restarts += 1
        log.warning("constraint compile worker killed (time limit or crash); restarts so far: %d", self.restarts)

    def close(self) -> None:
        for process in self._starting:  # a server stopped during its warm-up
            process.kill()
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return
