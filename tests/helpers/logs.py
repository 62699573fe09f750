"""Capture the per-call access log (``proctor.access``) as JSON lines, for the tests that read it."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from proctor.observability.logs import JsonFormatter


class CapturedLines(io.StringIO):
    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.getvalue().splitlines()]


@contextmanager
def access_log_json() -> Iterator[CapturedLines]:
    """Every access line written while the block runs, formatted by the server's JSON formatter."""
    stream = CapturedLines()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    access = logging.getLogger("proctor.access")
    level = access.level
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
