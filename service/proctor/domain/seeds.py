"""Seeds of retries: one home for how attempt ``k`` of a request derives its seed from the request's."""

from __future__ import annotations

_GOLDEN = 0x9E3779B97F4A7C15


def attempt_seed(seed: int, number: int) -> int:
    """The seed of attempt ``number`` (1-based) of a request seeded with ``seed`` (attempt 1: the seed itself)."""
    return seed if number == 1 else (seed + (number - 1) * _GOLDEN) % (1 << 63)
