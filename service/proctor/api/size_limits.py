"""Size limits checked before any parsing: on the gRPC message before it is converted, or on the HTTP door's
converted request, from one table.

Every check here is O(1) or a walk over a few enum fields, so an oversized or hostile field costs
the server microseconds and one violation, whatever its size: the conversion, validation and
engine preparation that follow would otherwise spend time in proportion to it (sorting 100,000
``logit_bias`` entries, parsing a 3 MB schema) while other callers wait. Limits come from
``Settings``; the finer rules (each stop string, each phrase) stay in ``validation.py``.

The two forms check the same limits in the same order, each field named by its proto path (``COUNTED`` is read
by both: a path reads the same in the message and in the domain request): ``message_violations`` on a
``GenerateRequest`` (api/check_request.py, before conversion), ``request_violations`` on the request the HTTP
door converted its body into (it has no message; its body was read against the caller's byte limit first).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Iterable, Sized
from typing import Any, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from proctor.config import Settings
from proctor.domain import FieldViolation, GenerationRequest
from proctor_client.v1 import generation_pb2 as pb

MAX_REQUEST_ID_CHARS = 256
MAX_MUST_INCLUDE = 16  # stopping.must_include phrases
PLUGIN_LISTS = ("logits_processors", "stopping_criteria", "input_screens", "output_moderators")
CONSTRAINT_BYTES = "bytes (max_constraint_bytes)"
# The counted fields, in the order they are checked: (path, the Settings attribute or a fixed limit, what counts).
# Forced positions are distinct and below max_new_tokens: more than its limit cannot all be valid.
COUNTED: tuple[tuple[str, str | int, str], ...] = (
    ("logit_bias", "max_logit_bias", "entries"),
    ("allowed_token_ids", "max_allowed_token_ids", "ids"),
    ("stopping.stop", "max_stop_strings", "stop strings"),
    ("stopping.stop_token_ids", "max_stop_token_ids", "ids"),
    ("forbidden.phrases", "max_forbidden_phrases", "phrases"),
    ("request_id", MAX_REQUEST_ID_CHARS, "characters"),
    ("sampling.forced_tokens", "max_new_tokens_limit", "entries (max_new_tokens_limit)"),
    ("stopping.must_include", MAX_MUST_INCLUDE, "phrases"),
)


class _Limits:
    """Collects the violations of one request, in the checks' order."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.bad: list[FieldViolation] = []

    def over(self, field: str, count: int, limit: int, what: str) -> None:
        if count > limit:
            self.bad.append(FieldViolation(field, f"at most {limit} {what}, got {count}"))

    def prompt(self, messages: Iterable[str] | None, prompt: str) -> None:
        if messages is not None:
            self.over("messages", sum(len(content) for content in messages), self.settings.max_prompt_chars,
                      "characters in all")
        else:
            self.over("prompt", len(prompt), self.settings.max_prompt_chars, "characters")

    def text(self, field: str, text: str) -> None:
        limit = self.settings.max_constraint_bytes
        self.over(field, utf8_size(text, limit), limit, CONSTRAINT_BYTES)

    def counted(self, request: object) -> None:
        for path, limit, what in COUNTED:
            value = cast(Sized, functools.reduce(getattr, path.split("."), request))
            self.over(path, len(value), limit if isinstance(limit, int) else getattr(self.settings, limit), what)

    def plugins(self, name: str, count: int, sizes: Iterable[int]) -> None:
        """A plugin list's length, and the ``params`` size of each of its first calls within the limit (their
        bytes as a ``google.protobuf.Struct``)."""
        self.over(name, count, self.settings.max_plugin_calls, "plugin calls")
        for index, size in enumerate(sizes):
            self.over(f"{name}[{index}].params", size, self.settings.max_plugin_params_bytes, "bytes")


def message_violations(message: pb.GenerateRequest, settings: Settings) -> list[FieldViolation]:
    """Each oversized field, each enum number the proto does not define, an unset grammar syntax: checked on
    the message, before anything is converted (api/check_request.py)."""
    limits, m = _Limits(settings), message
    limits.prompt((c.content for c in m.messages.messages) if m.WhichOneof("input") == "messages" else None,
                  m.prompt)
    kind = m.WhichOneof("constraint")
    if kind in ("json_schema", "regex"):
        limits.text(kind, getattr(m, kind))
    elif kind == "grammar":
        limits.text("grammar.text", m.grammar.text)
        if m.grammar.syntax == pb.GRAMMAR_SYNTAX_UNSPECIFIED:
            limits.bad.append(FieldViolation("grammar.syntax", "set the grammar syntax: LARK or EBNF"))
    elif kind == "choice":
        limits.over("choice.options", len(m.choice.options), settings.max_choice_options, "options")
    limits.counted(m)
    for name in PLUGIN_LISTS:
        calls = getattr(m, name)
        limits.plugins(name, len(calls), (call.params.ByteSize() for call in calls[: settings.max_plugin_calls]))
    return [*limits.bad, *unknown_enums(message)]


def request_violations(request: GenerationRequest, settings: Settings) -> list[FieldViolation]:
    """The same limits on a converted request (the HTTP door's): its fields are named by their proto paths."""
    limits, c = _Limits(settings), request.constraint
    limits.prompt((m.content for m in request.messages) if request.messages is not None else None,
                  request.prompt or "")
    if c is not None and c.kind in ("json_schema", "regex", "grammar"):
        limits.text("grammar.text" if c.kind == "grammar" else c.kind, c.text)
    elif c is not None and c.kind == "choice":
        limits.over("choice.options", len(c.options), settings.max_choice_options, "options")
    limits.counted(request)
    for name in PLUGIN_LISTS:
        calls = getattr(request, name)
        limits.plugins(name, len(calls), (struct_size(call.params) for call in calls[: settings.max_plugin_calls]))
    return limits.bad


def struct_size(value: dict[str, Any]) -> int:
    """The bytes of a JSON object as a ``google.protobuf.Struct`` (what ``ByteSize`` says of the gRPC door's)."""
    return sum(_field(_field(len(key.encode())) + _field(_value_size(item))) for key, item in value.items())


def _value_size(value: object) -> int:
    """A ``google.protobuf.Value``'s bytes: its one field (null, bool: 1 byte; a number: 8; the rest: length)."""
    if value is None or isinstance(value, bool):
        return 2
    if isinstance(value, int | float):
        return 9
    if isinstance(value, str):
        return _field(len(value.encode()))
    if isinstance(value, list):
        return _field(sum(_field(_value_size(item)) for item in value))
    return _field(struct_size(cast(dict[str, Any], value)))


def _field(size: int) -> int:
    """A length-delimited field of ``size`` bytes: its tag, its length, its bytes."""
    return 1 + _length(size)


def _length(size: int) -> int:
    """``size`` bytes with their varint length before them."""
    return size + max(1, (size.bit_length() + 6) // 7)


def utf8_size(text: str, limit: int) -> int:
    """``len(text.encode())`` where it matters: a text of more characters than ``limit`` is over it (its
    character count, a lower bound of its bytes, is returned), and one of at most ``limit // 4`` characters
    is within it (a character is 1-4 bytes): both are found without encoding it."""
    if len(text) > limit or len(text) <= limit // 4:
        return len(text)
    return len(text.encode("utf-8"))


def unknown_enums(message: Message, prefix: str = "") -> list[FieldViolation]:
    """Enum fields holding a number the proto does not define (proto3 enums are open on the wire)."""
    found = []
    for field, value in message.ListFields():
        name = f"{prefix}{field.name}"
        if field.type == FieldDescriptor.TYPE_ENUM and not field.is_repeated:
            if value not in field.enum_type.values_by_number:
                known = ", ".join(v.name for v in field.enum_type.values if v.number != 0)
                found.append(FieldViolation(name, f"unknown {field.enum_type.name} {value}; expected one of {known}"))
        elif (field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated
              and field.message_type.full_name.startswith("proctor.")):
            found.extend(unknown_enums(value, f"{name}."))
    return found


RAW_KEEP_ITEMS = 16
RAW_KEEP_CHARS = 4096


def bounded_dict(message: Message) -> dict[str, Any]:
    """The message as JSON for the audit record of a refused call, with oversized fields cut.

    A refused 100,000-entry ``logit_bias`` must not cost a second and a megabyte of audit record:
    lists and maps keep their first entries, long strings their first characters, and ``_omitted``
    says what was cut (with the sha256 of a cut string, so the record still pins it down).
    """
    copy = type(message)()
    copy.CopyFrom(message)
    omitted: dict[str, str] = {}
    _trim(copy, "", omitted)
    data = MessageToDict(copy)
    if omitted:
        data["_omitted"] = omitted
    return cast(dict[str, Any], data)


def _trim(message: Message, prefix: str, omitted: dict[str, str]) -> None:
    for field, value in message.ListFields():
        name = f"{prefix}{field.name}"
        if field.is_repeated and len(value) > RAW_KEEP_ITEMS:
            omitted[name] = f"{len(value)} entries; the first {RAW_KEEP_ITEMS} kept"
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                kept = [(k, value[k]) for k in itertools.islice(value, RAW_KEEP_ITEMS)]
                message.ClearField(field.name)
                target = getattr(message, field.name)
                for key, item in kept:
                    if isinstance(item, Message):
                        target[key].CopyFrom(item)
                    else:
                        target[key] = item
            else:
                del value[RAW_KEEP_ITEMS:]
        elif field.type == FieldDescriptor.TYPE_STRING and not field.is_repeated and len(value) > RAW_KEEP_CHARS:
            digest = hashlib.sha256(value.encode("utf-8")).hexdigest()
            omitted[name] = f"{len(value)} characters (sha256 {digest}); the first {RAW_KEEP_CHARS} kept"
            setattr(message, field.name, value[:RAW_KEEP_CHARS])
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated:
            _trim(value, f"{name}.", omitted)
