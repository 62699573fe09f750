"""Calendar formats as regular expressions that accept exactly what the server's validator accepts.

Engines approximate ``date``, ``time`` and ``date-time`` (2021-02-29 passes as a date). The
validator's checkers are precise and small enough to restate as regexes:

* ``date`` — jsonschema's ``is_date``: ``\\d{4}-\\d{2}-\\d{2}`` that ``date.fromisoformat`` takes:
  years 0001-9999, the Gregorian calendar (days per month, leap years: divisible by 4, not by 100
  unless by 400).
* ``date-time`` — ``rfc3339_validator`` on the upper-cased text: a date as above, ``T`` (either
  case), hours 00-23, minutes and seconds 00-59 (no leap second), an optional fraction, and ``Z``
  (either case) or an offset ``±HH:MM`` with HH 00-23.
* ``time`` — jsonschema checks ``"1970-01-01T" + value`` as a date-time: the part after ``T``.

(The checkers also take one trailing newline, which these regexes do not: a valid instance no
mask would write, never an invalid one let through.) With such a ``pattern`` beside it, the
``format`` is enforced exactly by any engine that enforces ``pattern``; the guard counts it so,
and the copy an engine compiles carries the pattern alone.
"""

from __future__ import annotations

from typing import Any

_YEAR = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (f"({_YEAR}-(01|03|05|07|08|10|12)-(0[1-9]|[12][0-9]|3[01])"
         f"|{_YEAR}-(04|06|09|11)-(0[1-9]|[12][0-9]|30)"
         f"|{_YEAR}-02-(0[1-9]|1[0-9]|2[0-8])"
         f"|{_LEAP_YEAR}-02-29)")
_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"

FORMAT_PATTERNS: dict[str, str] = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}[Tt]{_TIME}$",
}


def exact_pattern(node: dict[str, Any]) -> bool:
    """Whether ``node``'s ``format`` is spelled out exactly by its ``pattern`` (see ``with_patterns``)."""
    fmt = node.get("format")
    return isinstance(fmt, str) and fmt in FORMAT_PATTERNS and node.get("pattern") == FORMAT_PATTERNS[fmt]


def with_pattern(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its calendar format's exact pattern beside it, when it has no pattern of its own."""
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in FORMAT_PATTERNS and "pattern" not in node:
        return {**node, "pattern": FORMAT_PATTERNS[fmt]}
    return node
