"""The calendar-format patterns accept exactly what the server's validator accepts (bar its trailing newline)."""

from __future__ import annotations

import itertools
import re
from datetime import date, timedelta

import pytest
from jsonschema import Draft202012Validator

from proctor.constraints.json_schema.formats import FORMAT_PATTERNS

CHECKER = Draft202012Validator.FORMAT_CHECKER
YEARS = (1, 4, 99, 100, 400, 1900, 1999, 2000, 2004, 2023, 2024, 2100, 2400, 9996, 9999)


def dates() -> list[str]:
    """Every day of some telling years, and the impossible days around month ends, in every month."""
    out = []
    for year in YEARS:
        day = date(year, 1, 1)
        while day.year == year:
            out.append(day.isoformat())
            if day == date.max:
                break
            day += timedelta(days=1)
        out += [f"{year:04d}-{m:02d}-{d:02d}" for m in range(0, 14) for d in (0, 29, 30, 31, 32)]
    return [*out, "0000-01-01", "2024-1-01", "2024-01-1", "20240101", "2024-01-01x", "２０２４-01-01", ""]


def times() -> list[str]:
    parts = itertools.product(("00", "09", "23", "24", "7"), ("00", "59", "60"), ("00", "59", "60"),
                              ("", ".5", ".123456789", "."), ("Z", "z", "+00:00", "-23:59", "+24:00", "+05", ""))
    return [f"{h}:{m}:{s}{frac}{zone}" for h, m, s, frac, zone in parts]


def agree(fmt: str, values: list[str]) -> list[str]:
    pattern = re.compile(FORMAT_PATTERNS[fmt], re.ASCII)
    return [v for v in values if bool(pattern.search(v)) != CHECKER.conforms(v, fmt)]


@pytest.mark.parametrize(("fmt", "values"), [
    ("date", dates()),
    ("time", times()),
    ("date-time", [f"{d}{t}{rest}" for d in ("2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29", "0000-01-01")
                   for t in ("T", "t", " ", "") for rest in times()[::7]]),
])
def test_pattern_and_validator_agree(fmt: str, values: list[str]) -> None:
    assert len(values) > 100
    assert agree(fmt, values) == []
    assert any(CHECKER.conforms(v, fmt) for v in values) and not all(CHECKER.conforms(v, fmt) for v in values)
