"""Oracles of the tests' own, so that production code is never the only judge of its own output.

* JSON Schema: the output text parsed by ``json`` (strictly: no ``NaN``/``Infinity``) and checked by
  ``jsonschema`` with the draft the schema declares (2020-12 when it declares none) and jsonschema's
  own format checker; nothing from ``proctor.constraints`` is used.
* Forbidden phrases: whole-string NFKC (then ``str.casefold`` unless case-sensitive) of the phrase and
  the text, and a ``re`` search; whole-word mode puts word boundaries around the phrase and lets any
  run of non-word characters stand between its words (``"trade secret"`` is also ``"trade-secret"``).
  A word character is ``re``'s ``\\w`` (letters, digits, ``_``) or a combining mark (Unicode category
  M, which ``\\w`` leaves out: ``"pie"`` followed by a virama is not the word ``"pie"``).
  Nothing from ``proctor.decoding.forbidden`` is used.
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from proctor_client import ProctorClient

Schema = Mapping[str, Any] | bool | str


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str) -> Any:
    """``text`` as strict JSON (``json.loads`` would accept ``NaN`` and ``Infinity``); raises ValueError."""
    return json.loads(text, parse_constant=_refuse_constant)


def schema_validator(schema: Schema) -> Validator:
    """A jsonschema validator for ``schema`` (a dict, a bool or JSON text), of the draft it declares."""
    loaded = json.loads(schema) if isinstance(schema, str) else schema
    cls = validator_for(loaded, default=Draft202012Validator)
    cls.check_schema(loaded)
    return cls(loaded, format_checker=cls.FORMAT_CHECKER)


def json_errors(text: str, schema: Schema) -> list[str]:
    """Why ``text`` is not a JSON instance of ``schema``: empty when it is one."""
    try:
        instance = parse_json(text)
    except ValueError as exc:
        return [f"not JSON: {exc}"]
    errors = schema_validator(schema).iter_errors(instance)
    return [f"{error.json_path}: {error.message}" for error in sorted(errors, key=lambda e: list(e.path))]


def is_valid_json(text: str, schema: Schema) -> bool:
    return not json_errors(text, schema)


def assert_valid_json(text: str, schema: Schema) -> Any:
    """Assert that ``text`` is JSON valid under ``schema`` (the tests' own check); returns the instance."""
    errors = json_errors(text, schema)
    assert not errors, f"jsonschema rejects the output {text[:200]!r}: {errors[:5]}"
    return parse_json(text)


def registered_schema(client: ProctorClient, ref: str) -> dict[str, Any]:
    """The schema the server lists under ``ref``: ``name@version``, or ``name`` where one version is listed."""
    entries = [e for e in client.list_schemas() if ref in (f"{e.name}@{e.version}", e.name)]
    assert len(entries) == 1, f"{ref} names {len(entries)} listed schemas: name a version"
    schema: dict[str, Any] = json.loads(entries[0].schema)
    return schema


def normalize(text: str, casefold: bool = True) -> str:
    """Whole-string NFKC, then Unicode case folding unless ``casefold`` is False."""
    normal = unicodedata.normalize("NFKC", text)
    return normal.casefold() if casefold else normal


@lru_cache(maxsize=1)
def word_class() -> str:
    """``re`` class text of the word characters: ``\\w`` and every combining mark, as code point ranges."""
    marks = [cp for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)).startswith("M")]
    ranges: list[list[int]] = []
    for cp in marks:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "\\w" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


@lru_cache(maxsize=1024)
def phrase_pattern(phrase: str, whole_word: bool, casefold: bool = True) -> re.Pattern[str] | None:
    """The ``re`` pattern for ``phrase`` over normalised text; None when nothing of it is left to match."""
    normal = normalize(phrase, casefold)
    if not whole_word:
        return re.compile(re.escape(normal)) if normal else None
    word = word_class()
    words = re.findall(f"[{word}]+", normal)
    if not words:
        return None
    between = f"[^{word}]+"
    return re.compile(f"(?<![{word}])" + between.join(re.escape(w) for w in words) + f"(?![{word}])")


def contains_phrase(phrase: str, text: str, whole_word: bool = False, casefold: bool = True) -> bool:
    """Does ``text`` contain ``phrase`` (as the forbidden-phrase options define it)? The tests' own check."""
    pattern = phrase_pattern(phrase, whole_word, casefold)
    return pattern is not None and pattern.search(normalize(text, casefold)) is not None
