"""Canonical JSON (RFC 8785, "JCS"): the bytes every audit record is stored and hashed as.

The fast path is ``orjson`` with sorted keys, after which the few numbers whose text differs from
ECMAScript's ``Number::toString`` (what RFC 8785 prescribes) are rewritten in place: floats with an
integral value (orjson ``3.0`` and ``-0.0``, JCS ``3`` and ``0``) and the exponents orjson writes
where JCS writes plain decimals (``1e-6 <= |x| < 1e-5`` and ``1e16 <= |x| < 1e21``). Everything
else orjson writes already is JCS: shortest round-trip digits, strings as UTF-8 with only ``"``,
``\\`` and control characters escaped (``\\b \\t \\n \\f \\r``, others ``\\u00xx``), integers in
the safe range, and keys sorted by code point, which equals JCS's UTF-16 order unless a key holds
a character outside the BMP.

The reference implementation (``rfc8785``, after ``clean``) takes what the fast path does not
cover: such a key, an integer beyond 2^53 (made a string), a value of a type that is not a plain
JSON type (a subclass, an enum member of a non-str type, a dataclass). A property test checks the
result equals the reference on arbitrary documents. Non-finite floats become ``null`` either way.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson
import rfc8785

MAX_SAFE_INTEGER = 2**53 - 1
_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER | orjson.OPT_PASSTHROUGH_DATACLASS
            | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS)
# Where orjson's text of a float differs from JCS (searched separately: each has a literal prefix,
# which the regex engine finds fast); a match may also lie inside a string, which is checked after.
_INTEGRAL = re.compile(rb"\.0(?=[,\]}]|\Z)")
_EXPONENT = re.compile(rb"e(?:-6|\+1[6-9]|\+20)(?=[,\]}]|\Z)")
_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:e[-+][0-9]+)?")
_NON_BMP = re.compile(rb"[\xf0-\xf4]")  # the lead byte of a 4-byte UTF-8 sequence
# Searched for one at a time first (``in`` on one byte is a memchr): ~1 µs each over a 45 KB record,
# where ``_NON_BMP`` takes ~130 µs to scan it and find nothing.
_NON_BMP_LEADS = (b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")
_LONGEST_NUMBER = 32  # "-2.2250738585072014e-308" is 24 bytes; integral floats below 1e16, 19


def es6_number(value: float) -> str:
    """ECMAScript Number::toString (what RFC 8785 prescribes): shortest round-trip digits, and
    plain decimals for 1e-6 <= |x| < 1e21 (Python's repr switches to exponents earlier)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    integer, _, fraction = mantissa.partition(".")
    digits = (integer + fraction.rstrip("0")).lstrip("0") if fraction != "0" else integer.lstrip("0")
    point = len(integer.lstrip("0")) if integer != "0" else -(len(fraction) - len(fraction.lstrip("0")))
    point += int(exponent or 0)  # the decimal point sits after `point` digits
    digits = digits.rstrip("0") or "0"
    if len(digits) <= point <= 21:
        text = digits + "0" * (point - len(digits))
    elif 0 < point <= 21:
        text = f"{digits[:point]}.{digits[point:]}"
    elif -6 < point <= 0:
        text = "0." + "0" * -point + digits
    else:
        power = point - 1
        text = digits[0] + ("." + digits[1:] if len(digits) > 1 else "") + f"e{'+' if power > 0 else '-'}{abs(power)}"
    return sign + text


def clean(value: Any) -> Any:
    """JSON-safe for RFC 8785: non-finite floats become None, integers beyond 2^53 become strings,
    keys become strings, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        return str(value)
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of ``value`` (see the module docstring for how)."""
    try:
        text = orjson.dumps(value, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError included: a type or integer the fast path leaves out
        return rfc8785.dumps(clean(value))
    if not text.isascii() and _has_non_bmp_key(text):
        return rfc8785.dumps(clean(value))
    fixed = _fix_numbers(text)
    return fixed if fixed is not None else rfc8785.dumps(clean(value))


def _unescaped(text: bytes) -> bytes:
    """``text`` with every escaped backslash and quote blanked (same length): each ``"`` left
    opens or closes a string. Escapes pair up from the left, so blanking ``\\\\`` first is exact."""
    if b"\\" not in text:
        return text
    return text.replace(b"\\\\", b"  ").replace(b'\\"', b"  ")


def _has_non_bmp_key(text: bytes) -> bool:
    """Whether a key holds a character outside the BMP (non-ASCII only occurs inside strings; the
    string is a key when its closing quote is followed by a colon)."""
    if not any(lead in text for lead in _NON_BMP_LEADS):
        return False
    plain, closed = None, -1
    for match in _NON_BMP.finditer(text):
        if match.start() < closed:
            continue
        plain = _unescaped(text) if plain is None else plain
        closed = plain.find(b'"', match.start())
        if text[closed + 1:closed + 2] == b":":
            return True
    return False


def _fix_numbers(text: bytes) -> bytes | None:
    """Rewrite the floats whose orjson text is not JCS; None when a match is not where a number
    can be (never for orjson's output; the caller then takes the reference).

    Outside strings a ``.`` only occurs in a number, so ``.0`` before a delimiter ends an integral
    float: dropping it (and the sign of ``-0``) gives the JCS text. An exponent is rewritten whole.
    """
    hits = sorted([m.span() for m in _INTEGRAL.finditer(text)] + [m.span() for m in _EXPONENT.finditer(text)])
    if not hits:
        return text
    plain = _unescaped(text)
    parts: list[bytes] = []
    done = quotes = counted = 0
    for at, end in hits:
        quotes += plain.count(b'"', counted, at)
        counted = at
        if quotes % 2:  # inside a string
            continue
        if end - at == 2:  # "<digits>.0"
            negative_zero = text[at - 2:at] == b"-0" and (at == 2 or text[at - 3] in b":,[")
            parts += (text[done:at - 2], b"0") if negative_zero else (text[done:at],)
        else:
            window = max(0, at - _LONGEST_NUMBER)
            start = max(text.rfind(b":", window, at), text.rfind(b",", window, at),
                        text.rfind(b"[", window, at)) + 1
            if (start == 0 and window > 0) or _NUMBER.fullmatch(text, start, end) is None:
                return None
            parts += (text[done:start], es6_number(float(text[start:end])).encode("ascii"))
        done = end
    parts.append(text[done:])
    return b"".join(parts)
