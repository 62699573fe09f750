"""The proto3 JSON form of the API's fields without protobuf: an extension's value read, a response's facts written.

The extensions (openai_http/fields.py) take each field's proto3 JSON form, so a client that knows the gRPC API
sends what it would put in a ``GenerateRequest`` as JSON: integers (or their decimal strings), numbers (or
``"NaN"``, ``"Infinity"``), booleans, enums by name (or number; also by their short name, ``"on"`` for
``SPECULATION_ON``), messages as objects (their fields by name or camelCase name), repeated fields as arrays, maps
as objects with string keys, ``params`` as any JSON object. ``KINDS`` is the table of those fields, and ``ENUMS``
the proto's enums with their numbers (tests/unit/test_openai_wire.py holds both to the proto). A value its field
cannot take is a ``FormError`` saying why.

A ``float`` field holds a 32-bit float, as the gRPC door's message does: the value is rounded to it here, so both
doors run (and record) the same parameters.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT32 = (-(2**31), 2**31)
FLOAT_MAX = 3.4028234663852886e38  # the largest finite 32-bit float
UNPAIRED_SURROGATE = re.compile(r"[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


class FormError(ValueError):
    """A value its field cannot take."""


@dataclass(frozen=True, slots=True)
class Enum:
    """A proto enum: its name and its values' names by number (0: ``*_UNSPECIFIED``)."""

    name: str
    values: tuple[str, ...]

    @property
    def prefix(self) -> str:
        return self.values[0].removesuffix("UNSPECIFIED")

    def read(self, value: object) -> int:
        """The number of a value given by its full or short name, or by number (an undefined number is kept:
        proto3 enums are open on the wire, and the check that follows names it)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if not isinstance(value, str):
            raise FormError(f"{value!r} is not a {self.name} name or number")
        full = value.upper() if value.upper().startswith(self.prefix) else self.prefix + value.upper()
        if full in self.values:
            return self.values.index(full)
        if value in self.values:
            return self.values.index(value)
        raise FormError(f"invalid enum value {value!r} for enum type {self.name}")

    def known(self, number: int) -> bool:
        return 0 <= number < len(self.values)

    def unknown(self, number: int) -> str:
        """The violation of an undefined number (the gRPC door's words: api/size_limits.unknown_enums)."""
        return f"unknown {self.name} {number}; expected one of {', '.join(self.values[1:])}"


def _enum(name: str, prefix: str, *names: str) -> Enum:
    return Enum(name, tuple(f"{prefix}_{n}" for n in ("UNSPECIFIED", *names)))


ENUMS = {e.name: e for e in (
    _enum("ConstraintBackend", "CONSTRAINT_BACKEND", "AUTO", "XGRAMMAR", "LLGUIDANCE", "OUTLINES"),
    _enum("JsonWhitespace", "JSON_WHITESPACE", "COMPACT", "FLEXIBLE"),
    _enum("ContextOverflow", "CONTEXT_OVERFLOW", "REFUSE", "DROP_OLDEST_TURNS", "KEEP_START_AND_END"),
    _enum("Speculation", "SPECULATION", "ON", "OFF"),
    _enum("BeamEarlyStopping", "BEAM_EARLY_STOPPING", "HEURISTIC", "WHEN_FULL", "NEVER"),
    _enum("GrammarSyntax", "GRAMMAR_SYNTAX", "LARK", "EBNF"),
)}
# A field's kind: a scalar's name, ("enum", its enum), ("list", a kind), ("map", a kind: int32 keys) or
# ("message", {field: kind}).
PLUGIN_CALL = ("message", {"name": "string", "params": "struct"})
KINDS: dict[str, Any] = {
    "request_id": "string", "regex": "string", "schema_ref": "string", "subject_id": "string",
    "choice": ("message", {"options": ("list", "string")}),
    "grammar": ("message", {"syntax": ("enum", "GrammarSyntax"), "text": "string"}),
    "constraint_backend": ("enum", "ConstraintBackend"), "json_whitespace": ("enum", "JsonWhitespace"),
    "constraint_exact_only": "bool", "confidence": "bool", "cache_prompt": "bool",
    "forbidden": ("message", {"phrases": ("list", "string"), "case_insensitive": "bool", "whole_word": "bool"}),
    "allowed_token_ids": ("list", "int32"),
    "logits_processors": ("list", PLUGIN_CALL), "stopping_criteria": ("list", PLUGIN_CALL),
    "input_screens": ("list", PLUGIN_CALL), "output_moderators": ("list", PLUGIN_CALL),
    "context_overflow": ("enum", "ContextOverflow"), "speculation": ("enum", "Speculation"),
    "sampling.top_k": "int32", "sampling.min_p": "float", "sampling.repetition_penalty": "float",
    "sampling.no_repeat_ngram_size": "int32", "sampling.typical_p": "float", "sampling.greedy_first_tokens": "int32",
    "sampling.forced_tokens": ("map", "int32"), "sampling.num_beams": "int32", "sampling.length_penalty": "float",
    "sampling.early_stopping": ("enum", "BeamEarlyStopping"), "sampling.first_tokens_temperature": "float",
    "stopping.min_new_tokens": "int32", "stopping.stop_token_ids": ("list", "int32"), "stopping.ignore_eos": "bool",
    "stopping.repetition": ("message", {"ngram_size": "int32", "repeats": "int32"}),
    "stopping.must_include": ("list", "string"), "stopping.close_at_budget": "bool",
}
# The fields with presence (proto3 ``optional``): an explicit default is kept. Any other scalar at its default
# leaves what the body set otherwise (as merging a message does), and a message's are kept as given.
PRESENCE = frozenset({"cache_prompt", "sampling.top_k", "sampling.min_p", "sampling.repetition_penalty",
                      "sampling.no_repeat_ngram_size", "sampling.typical_p", "sampling.greedy_first_tokens",
                      "sampling.num_beams", "sampling.length_penalty", "sampling.first_tokens_temperature",
                      "stopping.min_new_tokens", "stopping.close_at_budget"})


def float32(value: float) -> float:
    """``value`` as the 32-bit float a proto ``float`` field holds (out of its range: infinite)."""
    try:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def float32_json(value: float) -> float | str:
    """A ``float`` field's value as its proto3 JSON form writes it: the shortest decimal that is the same 32-bit
    float (``"NaN"``, ``"Infinity"``, ``"-Infinity"`` for those)."""
    value = float32(value)
    if math.isnan(value) or math.isinf(value):
        return double_json(value)
    precision = 6  # every 32-bit float has 6 to 9 significant digits
    shortest = float(f"{value:.{precision}g}")
    while float32(shortest) != value:
        precision += 1
        shortest = float(f"{value:.{precision}g}")
    return shortest


def double_json(value: float) -> float | str:
    """A ``double`` field's value as its proto3 JSON form writes it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def read(kind: Any, value: object) -> Any:
    """``value`` read as a field of ``kind`` (an enum as its number, a message as a dict of its fields)."""
    if isinstance(kind, str):
        return _SCALARS[kind](value)
    shape, inner = kind
    if shape == "enum":
        return ENUMS[inner].read(value)
    if shape == "list":
        if not isinstance(value, list):
            raise FormError(f"{value!r} is not an array")
        if any(item is None for item in value):
            raise FormError("null is not allowed as an element of an array")
        return [read(inner, item) for item in value]
    if shape == "message" and value == []:  # json_format reads an empty array as an empty message
        return {}
    if not isinstance(value, dict):
        raise FormError(f"{value!r} is not an object")
    if shape == "map":
        return {_integer(key): read(inner, item) for key, item in value.items()}
    return _message(inner, value)


def _message(fields: Mapping[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = {_camel(name): name for name in fields} | {name: name for name in fields}
    for key, item in value.items():
        name = names.get(key)
        if name is None:
            raise FormError(f"no field named {key!r} (it has {', '.join(fields)})")
        if name in out:
            raise FormError(f"{name} is given twice")
        if item is not None:
            out[name] = read(fields[name], item)
    return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise FormError(f"{value!r} is not a string")
    if UNPAIRED_SURROGATE.search(value):
        raise FormError("an unpaired surrogate")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise FormError("expected true or false without quotes")
    return value


def _integer(value: object) -> int:
    if isinstance(value, bool):
        raise FormError(f"a boolean ({value}) is not an integer")
    if isinstance(value, float) and not value.is_integer():
        raise FormError(f"{value} is not an integer")
    if isinstance(value, str) and " " in value:
        raise FormError(f"{value!r} is not an integer")
    try:
        number: int = int(value)  # type: ignore[call-overload]
    except (ValueError, TypeError, OverflowError):
        try:
            real = float(value)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            raise FormError(f"{value!r} is not an integer") from None
        if not real.is_integer():
            raise FormError(f"{value!r} is not an integer") from None
        number = int(real)
    return number


def _int32(value: object) -> int:
    number = _integer(value)
    if not INT32[0] <= number < INT32[1]:
        raise FormError(f"{number} is out of the range of a 32-bit integer")
    return number


def _float(value: object) -> float:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise FormError('use "NaN", "Infinity" or "-Infinity" (quoted)')
        if abs(value) > FLOAT_MAX:
            raise FormError("too large for a 32-bit float")
    if value == "nan":
        raise FormError('use "NaN" for a NaN')
    if not isinstance(value, int | float | str):
        raise FormError(f"{value!r} is not a number")
    try:
        return float32(float(value))
    except (ValueError, OverflowError):
        raise FormError(f"{value!r} is not a number") from None


def _struct(value: object) -> dict[str, Any]:
    """A ``google.protobuf.Struct``: any JSON object, its numbers held as doubles (as the message holds them)."""
    if not isinstance(value, dict):
        raise FormError(f"{value!r} is not an object")
    return {key: _json_value(item) for key, item in value.items()}


def _json_value(value: object) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    raise FormError(f"{value!r} is not JSON")


_SCALARS = {"string": _string, "bool": _bool, "int32": _int32, "float": _float, "struct": _struct}
