"""A job the server runs off its event loop every few seconds or hours (the retention sweep, the memory erasure).

Why one class: each such job must start with the server, stop with it, never block the event loop, and survive a
failing run (logged; the next run tries again) — the same four lines every time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("proctor.audit")


class Periodic:
    def __init__(self, name: str, interval_s: float, job: Callable[[], None]) -> None:
        self.name, self.interval_s, self._job = name, interval_s, job
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"proctor-{self.name}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._job)
            except Exception:  # the next run tries again
                log.exception("%s failed", self.name)
            await asyncio.sleep(self.interval_s)
