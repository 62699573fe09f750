"""End-to-end fixtures: the ``proctor`` CLI as subprocesses, exactly as the README runs it.

``serve_process()`` starts ``python -m proctor.cli serve --port 0 ...`` and parses the bound port from its
"listening on HOST:PORT" log line; ``run_cli(...)`` runs a CLI command and returns the CompletedProcess.
Every test here needs the real default model; without it they skip with a hint to run ``make setup``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.requirements import missing

from proctor.config import default_model_store
from proctor.models.default_model import is_installed

REPO = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (\S+):(\d+)")


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO / "service"), str(REPO / "clients" / "python" / "src")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PROCTOR_PORT", None)
    env.pop("PROCTOR_HOST", None)
    return env


class ServerProcess:
    """A ``proctor serve`` subprocess whose stderr is collected line by line on a thread."""

    def __init__(self, *extra_args: str) -> None:
        command = [sys.executable, "-m", "proctor.cli", "serve", "--port", "0", "--host", "127.0.0.1", *extra_args]
        self.proc = subprocess.Popen(command, cwd=REPO, env=cli_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     encoding="utf-8", errors="replace")
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="proctor-serve-stderr", daemon=True)
        self._reader.start()
        self.address = self._wait_address(timeout_s=60.0)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def log(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for_log(self, pattern: str, timeout_s: float) -> re.Match[str] | None:
        """The first log line matching ``pattern`` within ``timeout_s`` (None if it never came)."""
        regex = re.compile(pattern)
        end = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines:
                    found = regex.search(line)
                    if found:
                        return found
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    return None
                self._changed.wait(min(left, 0.2))

    def _wait_address(self, timeout_s: float) -> str:
        found = self.wait_for_log(LISTENING.pattern, timeout_s)
        if found is None:
            self.kill()
            raise AssertionError(f"`proctor serve` never logged 'listening on HOST:PORT':\n{self.log}")
        return f"{found.group(1)}:{found.group(2)}"

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)


@pytest.fixture(scope="session")
def model_installed() -> None:
    store = default_model_store()
    if not is_installed(store):
        missing(f"the default model is not installed in {store}; run `make setup` to run the e2e tests")


@pytest.fixture(scope="module")
def serve_process(model_installed: None) -> Iterator[Callable[..., ServerProcess]]:
    """Factory: start ``proctor serve`` subprocesses; any still running at module end are killed."""
    started: list[ServerProcess] = []

    def start(*extra_args: str) -> ServerProcess:
        server = ServerProcess(*extra_args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def run_cli(*args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m proctor.cli ARGS`` and capture stdout/stderr as text."""
    return subprocess.run([sys.executable, "-m", "proctor.cli", *args], cwd=REPO, env=cli_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, encoding="utf-8",
                          timeout=timeout_s, check=False)


@pytest.fixture(scope="session")
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``cli(*args, timeout_s=...)``: run the ``proctor`` CLI (see ``run_cli``)."""
    return run_cli
