"""Carry JSON Schema ``pattern`` regexes (ECMA-262) into the dialect the engines share.

The engines read patterns as Rust-style or their own regexes, and some shorthands mean more
there than in ECMA-262, which JSON Schema uses. Found with the real engines: ``.`` takes
``\\r`` (llguidance) and U+2028 (all three), ``\\d``/``\\w`` take non-ASCII digits and letters
(outlines), ``\\S`` takes U+FEFF (llguidance, outlines). Each such text would pass the mask yet
fail the schema. The translation spells these out as explicit classes with ECMA's meaning;
what cannot be carried over exactly (backreferences, ``\\b``, class-set syntax) gives ``None``
and the guard refuses the pattern.
"""

from __future__ import annotations

import re

# ECMA-262 WhiteSpace and LineTerminator, as class contents every engine reads the same way.
_SPACE = "\\t\\n\\x0b\\x0c\\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_IN_CLASS = {"d": "0-9", "w": "A-Za-z0-9_", "s": _SPACE}
_OUTSIDE = {
    "d": "[0-9]", "D": "[^0-9]", "w": "[A-Za-z0-9_]", "W": "[^A-Za-z0-9_]",
    "s": f"[{_SPACE}]", "S": f"[^{_SPACE}]",
}
_DOT = "[^\\n\\r\u2028\u2029]"
_REFUSED_ESCAPES = set("123456789kbBc")  # backreferences, word boundaries, control letters


def _class(pattern: str, start: int) -> tuple[str, int] | None:
    """Translate the class opening at ``start``; return it and the index after its ``]``."""
    i = start + 1
    out = "["
    if pattern.startswith("^", i):
        out, i = "[^", i + 1
    if pattern.startswith("]", i):
        return None  # ECMA's empty class []/[^] reads differently elsewhere
    while i < len(pattern):
        ch = pattern[i]
        if ch == "]":
            return out + "]", i + 1
        if ch == "[" or pattern.startswith(("&&", "--", "~~"), i):
            return None  # nested classes and set operations exist only in the engines' dialects
        if ch == "\\":
            if i + 1 >= len(pattern):
                return None
            nxt = pattern[i + 1]
            if nxt in _IN_CLASS:
                out += _IN_CLASS[nxt]
            elif nxt == "b":
                out += "\\x08"  # in an ECMA class \b is backspace
            elif nxt in "DWS" or nxt in _REFUSED_ESCAPES:
                return None
            else:
                out += "\\" + nxt
            i += 2
            continue
        out += ch
        i += 1
    return None


def translate(pattern: str) -> str | None:
    """The pattern with ECMA meanings made explicit, or None when that cannot be done exactly."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= len(pattern):
                return None
            nxt = pattern[i + 1]
            if nxt in _REFUSED_ESCAPES:
                return None
            out.append(_OUTSIDE.get(nxt, "\\" + nxt))
            i += 2
        elif ch == "[":
            translated = _class(pattern, i)
            if translated is None:
                return None
            out.append(translated[0])
            i = translated[1]
        elif ch == ".":
            out.append(_DOT)
            i += 1
        elif pattern.startswith("(?", i) and not pattern.startswith(("(?:", "(?=", "(?!", "(?<"), i):
            return None  # inline flags such as (?i) are not ECMA-262 (engines would honour them)
        else:
            out.append(ch)
            i += 1
    return "".join(out)


# Characters a JSON string must escape. xgrammar and outlines match a string's pattern against its
# raw JSON text, so an atom that takes one of these lets a string close early (``.`` takes ``"``:
# with ``^a.+$``, ``{"s":"a","t":"x","t":1}`` passed) or holds a raw control character.
_JSON_ESCAPED = ['"', "\\", *map(chr, range(0x20))]


def _atom_takes_escaped(atom: str) -> bool:
    try:
        compiled = re.compile(atom)
    except re.error:
        return True
    return any(compiled.fullmatch(ch) for ch in _JSON_ESCAPED)


def takes_json_escaped(pattern: str) -> bool:
    """Whether a translated pattern has an atom that may match ``"``, ``\\`` or a control character.

    Conservative: what Python's ``re`` cannot read (``\\p{..}``, ``\\u{..}``) counts as matching.
    """
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            size = 6 if pattern.startswith("u", i + 1) else 4 if pattern.startswith("x", i + 1) else 2
            if _atom_takes_escaped(pattern[i:i + size]):  # \p{..} and \u{..} fail to compile: refused
                return True
            i += size
        elif ch == "[":
            end = i + 1
            while end < len(pattern) and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            if end >= len(pattern) or _atom_takes_escaped(pattern[i:end + 1]):
                return True
            i = end + 1
        elif ch in "()|*+?{}^$,:=!<>" or ch.isalnum() or ch == "-":
            i += 1  # syntax, group markers and quantifier digits (letters and digits match themselves)
        else:
            if _atom_takes_escaped(re.escape(ch)):
                return True
            i += 1
    return False
