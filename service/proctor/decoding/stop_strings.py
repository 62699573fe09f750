"""Stop-string matching over streamed text, holding back possible prefixes.

Only the held-back tail plus the new delta is searched (a match cannot start in text already
released, because any suffix that could begin a stop string is held back). The matched string
and anything after it are never returned.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopScan:
    """Result of feeding one delta: text safe to release and the stop string that matched, if any."""

    release: str
    matched: str | None = None


class StopStringMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def push(self, delta: str) -> StopScan:
        if not self._stops:
            return StopScan(delta)
        buffer = self._held + delta
        first: tuple[int, str] | None = None
        for stop in self._stops:
            pos = buffer.find(stop)
            if pos >= 0 and (first is None or pos < first[0]):
                first = (pos, stop)
        if first is not None:
            self._held = ""
            return StopScan(buffer[: first[0]], first[1])
        hold = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return StopScan(buffer[: len(buffer) - hold])

    def flush(self) -> str:
        """Release the held tail when the sequence ends for another reason."""
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:k]):
                    best = k
                    break
        return best
