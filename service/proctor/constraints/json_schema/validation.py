"""Validate a finished JSON output against its schema, after generation (the server's own check).

The token mask makes invalid output unlikely but not impossible: an engine may not enforce every keyword,
and an output cut at max_new_tokens is a prefix, not an instance. This check is what ``SchemaValidation``
reports, so it errs on the strict side:

* A truncated output is never valid, even when the prefix happens to parse (``12`` cut from ``123``).
* Parsing is strict JSON: ``NaN``/``Infinity`` and duplicate object keys are errors (with duplicates the
  validated object would silently differ from the text).
* ``format`` is asserted with jsonschema's FORMAT_CHECKER. Only formats whose checker is available are
  asserted (``CHECKED_FORMATS``); ``date-time``, ``time``, ``uri`` and others need optional packages and
  otherwise pass unchecked, which is why shipped schemas pair ``format`` with a ``pattern``.
* ``pattern`` is evaluated with ECMA-262 semantics where Python's differ in ways that matter for
  constrained output: ``$`` matches only at the very end (Python's also matches before a final newline)
  and ``\\d``/``\\w``/``\\b`` are ASCII (Python's match any Unicode digit or letter). Constraint engines
  read patterns the ECMA way, so this validator agrees with the mask instead of being laxer than it.
* Each schema is read by its own draft (``$schema``: draft-04, -06, -07, 2019-09, 2020-12; none means
  2020-12), with that draft's validator class — the same reading ``dialect`` gives the engines.
  Formats are asserted with the 2020-12 checkers whatever the draft (one list of asserted formats).
* ``$ref`` is resolved locally only: jsonschema's default would fetch unknown ``$ref`` URLs over HTTP,
  which a server must never do for a client-supplied schema.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import referencing
import referencing.exceptions
from jsonschema import Draft7Validator, Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError

from proctor.constraints.json_schema.dialect import validator_class
from proctor.constraints.json_schema.keywords import DATA_KEYWORDS, resolve_pointer
from proctor.constraints.spec import canonical_json

TRUNCATED_ERROR = "output truncated at max_new_tokens before the JSON was complete; it is not a valid instance"
MAX_ERRORS = 20
MAX_MESSAGE_CHARS = 300
VALIDATOR_CACHE_SIZE = 64
FORMAT_CHECKER = Draft202012Validator.FORMAT_CHECKER
# The formats FORMAT_CHECKER asserts given the optional packages installed; any other format passes unchecked.
CHECKED_FORMATS = frozenset(FORMAT_CHECKER.checkers)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """``valid`` only for complete JSON that validates; ``errors`` are messages for people, at most MAX_ERRORS."""

    valid: bool
    errors: tuple[str, ...] = ()
    # Each error's (JSON path, keyword), in the same order: what the audit record keeps readable when it seals the
    # messages, which quote the output ("" path: the whole output; keywords not the schema's: truncated, json,
    # schema, more).
    sites: tuple[tuple[str, str], ...] = ()


class InvalidSchemaError(ValueError):
    """The schema itself is unusable (not Draft 2020-12, or a non-local ``$ref``); the message says where."""


def validate_json_output(text: str, schema: dict[str, Any] | bool, *, truncated: bool,
                         canonical: str | None = None) -> ValidationResult:
    """Check ``text`` (the whole output) against ``schema``; ``truncated``: it ended at the token limit;
    ``canonical``: the schema's canonical JSON when the caller keeps it (else it is computed here).

    Never raises: an unusable schema (which check_json_schema should have refused before generating) makes
    the result invalid with an error saying the schema cannot be evaluated.
    """
    errors: list[tuple[str, str, str]] = [(TRUNCATED_ERROR, "", "truncated")] if truncated else []
    try:
        instance = parse_json_strict(text)
    except ValueError as exc:
        return _result([*errors, (f"not valid JSON: {exc}", "", "json")])
    try:
        validator = _validator(canonical if canonical is not None else canonical_json(schema))
        found = sorted(validator.iter_errors(instance), key=lambda e: (_path_key(e.absolute_path), e.message))
    except (InvalidSchemaError, referencing.exceptions.Unresolvable, re.error, RecursionError) as exc:
        # Runs after generation, in the engine: report "could not verify" as invalid rather than fail the request.
        return _result([*errors, (f"the schema cannot be evaluated: {exc}", "", "schema")])
    errors.extend((f"at {json_path(e.absolute_path)}: {_shorten(e.message)}", json_path(e.absolute_path),
                   str(e.validator)) for e in found)
    return _result(errors)


def check_json_schema(schema: object) -> None:
    """Raise InvalidSchemaError unless ``schema`` is a usable schema of its draft whose ``$ref``s are local and
    point somewhere in it (an anchor ``#name`` is left to the engines).

    For request schemas (before compiling them) and the registry (at load), so both reject the same things.
    """
    if not isinstance(schema, dict | bool):
        raise InvalidSchemaError("a JSON Schema must be an object or a boolean")
    try:
        validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        at = list(exc.absolute_path)
        keyword = f"keyword {at[-1]!r}, " if at and isinstance(at[-1], str) else ""
        raise InvalidSchemaError(f"invalid JSON Schema at {json_path(at)} ({keyword}JSON pointer "
                                 f"{json_pointer(at)}): {exc.message}") from exc
    for where, ref in _refs(schema, ()):
        if not ref.startswith("#"):
            raise InvalidSchemaError(f"at {json_path(where)}: only local $ref ('#/$defs/...') is supported, "
                                     f"got {ref!r}")
        if (ref == "#" or ref.startswith("#/")) and resolve_pointer(schema, ref) is None:
            raise InvalidSchemaError(f"'$ref' at #{json_pointer(where[:-1])} points to {ref!r}, which does not "
                                     "exist in the schema")


def parse_json_strict(text: str) -> Any:
    """json.loads that also rejects NaN/Infinity and duplicate object keys (ValueError with the reason)."""
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def json_path(parts: Iterable[str | int]) -> str:
    """``["parties", 0, "name"]`` -> ``$.parties[0].name``; keys that are not identifiers are quoted."""
    out = ["$"]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif IDENTIFIER.fullmatch(part):
            out.append(f".{part}")
        else:
            out.append(f"[{json.dumps(part, ensure_ascii=False)}]")
    return "".join(out)


def json_pointer(parts: Iterable[str | int]) -> str:
    """``["properties", "a~b", 0]`` -> ``/properties/a~0b/0`` (RFC 6901)."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def ecma_pattern(pattern: str) -> str:
    """Rewrite a pattern so Python's ``re`` (with re.ASCII) reads it as ECMA-262 would: bare ``$`` -> ``\\Z``.

    Escapes and character classes are copied unchanged (``[$]`` and ``\\$`` stay literal dollars); a ``]``
    right after ``[`` or ``[^`` is part of the class, as Python's parser has it.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if ch == "[":
            end = i + 1
            if end < n and pattern[end] == "^":
                end += 1
            if end < n and pattern[end] == "]":
                end += 1
            while end < n and pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            out.append(pattern[i : end + 1])
            i = end + 1
            continue
        out.append(r"\Z" if ch == "$" else ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=256)
def _compiled_pattern(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(ecma_pattern(pattern), re.ASCII)
    except re.error:
        # e.g. an inline (?u) flag, which conflicts with re.ASCII: fall back to Python's own reading.
        return re.compile(pattern)


def _ecma_pattern_keyword(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _compiled_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def server_validator_class(schema: object) -> Any:
    """The validator class the server judges ``schema``'s outputs with (its draft, as extended below)."""
    return _ecma_validator_class(validator_class(schema))


@functools.lru_cache(maxsize=8)
def _ecma_validator_class(cls: Any) -> Any:
    """The draft's validator class with ``pattern`` read the ECMA way, and ``dependencies`` asserted
    in every draft (its draft 4-7 meaning; see ``dialect.normalize``)."""
    extra = {"pattern": _ecma_pattern_keyword}
    if "dependencies" not in cls.VALIDATORS:
        extra["dependencies"] = Draft7Validator.VALIDATORS["dependencies"]
    return validators.extend(cls, extra)


@functools.lru_cache(maxsize=VALIDATOR_CACHE_SIZE)
def _validator(schema_json: str) -> Any:
    """One validator per distinct schema (keyed by canonical text): building one walks the whole schema."""
    schema = json.loads(schema_json)
    check_json_schema(schema)
    # An empty registry (jsonschema adds the metaschemas) keeps $ref resolution offline.
    cls = server_validator_class(schema)
    return cls(schema, format_checker=FORMAT_CHECKER, registry=referencing.Registry())


def _refs(node: object, where: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every ``$ref`` string in a schema, with its location; data keywords are not descended into."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield (*where, key), value
            elif key not in DATA_KEYWORDS:
                yield from _refs(value, (*where, key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _refs(item, (*where, index))


def _path_key(parts: Iterable[str | int]) -> tuple[tuple[int, int | str], ...]:
    """Sort key for mixed index/key paths (plain tuples of int and str do not compare)."""
    return tuple((0, p) if isinstance(p, int) else (1, p) for p in parts)


def _shorten(message: str) -> str:
    """Messages quote the offending value, which can be a long string: keep each error readable."""
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


def _result(errors: list[tuple[str, str, str]]) -> ValidationResult:
    """The result of (message, path, keyword) errors, at most MAX_ERRORS of them (the last then says how many
    more there were)."""
    if len(errors) > MAX_ERRORS:
        kept = errors[: MAX_ERRORS - 1]
        errors = [*kept, (f"... and {len(errors) - len(kept)} more errors", "", "more")]
    return ValidationResult(not errors, tuple(e[0] for e in errors), tuple((e[1], e[2]) for e in errors))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate object key {key!r}")
        result[key] = value
    return result
