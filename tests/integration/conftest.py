"""Integration fixtures: one real server (real default model, real gRPC on 127.0.0.1:0) for the whole session.

Every test here needs the converted default model; without it the fixtures skip with a hint to run
``make setup``. The server runs in this process (``BackgroundServer``), so tests can look at its engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.requirements import missing

from proctor.config import Settings, default_model_store
from proctor.models.default_model import default_model_path, is_installed
from proctor_client import ProctorClient

MODEL_MISSING = "the default model is not installed in {store}; run `make setup` to run the real-model tests"


def installed_model_dir() -> Path:
    """The converted SmolLM2-135M-Instruct directory; skips the calling test when it is not installed."""
    store = default_model_store()
    if not is_installed(store):
        missing(MODEL_MISSING.format(store=store))
    return default_model_path(store)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return installed_model_dir()


@pytest.fixture(scope="session")
def server(model_dir: Path) -> Iterator[object]:
    """A started ``proctor.app.BackgroundServer`` (loopback, port 0), stopped at the end of the session."""
    from proctor.app import BackgroundServer

    background = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1"}))
    try:
        background.start(timeout_s=300)
    except BaseException:
        background.stop()
        raise
    yield background
    background.stop()


@pytest.fixture(scope="session")
def client(server: object) -> Iterator[ProctorClient]:
    """A sync client on the session server; 120 s default deadline (CPU decoding can be slow under load)."""
    with ProctorClient(server.address, timeout_s=120.0) as proctor:  # type: ignore[attr-defined]
        yield proctor


@pytest.fixture
def wait_engine_idle(server: object) -> Callable[[float], bool]:
    """Return a poller: True once the server-side engine holds no request (within ``timeout_s``)."""

    def wait(timeout_s: float = 10.0) -> bool:
        engine = server.running.engine  # type: ignore[attr-defined]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if engine.active_count() == 0:
                return True
            time.sleep(0.02)
        return engine.active_count() == 0

    return wait
