"""Size limits checked on the protobuf message itself, before any conversion or parsing.

Every check here is O(1) or a walk over a few enum fields, so an oversized or hostile field costs
the server microseconds and one violation, whatever its size: the conversion, validation and
engine preparation that follow would otherwise spend time in proportion to it (sorting 100,000
``logit_bias`` entries, parsing a 3 MB schema) while other callers wait. Limits come from
``Settings``; the finer rules (each stop string, each phrase) stay in ``validation.py``.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from proctor.config import Settings
from proctor.domain import FieldViolation
from proctor_client.v1 import generation_pb2 as pb

MAX_REQUEST_ID_CHARS = 256
MAX_MUST_INCLUDE = 16  # stopping.must_include phrases
PLUGIN_LISTS = ("logits_processors", "stopping_criteria", "input_screens", "output_moderators")


def message_violations(message: pb.GenerateRequest, settings: Settings) -> list[FieldViolation]:
    """Each oversized field, each enum number the proto does not define, an unset grammar syntax: checked on
    the message, before anything is converted (api/check_request.py)."""
    bad: list[FieldViolation] = []

    def over(field: str, count: int, limit: int, what: str) -> None:
        if count > limit:
            bad.append(FieldViolation(field, f"at most {limit} {what}, got {count}"))

    m = message
    if m.WhichOneof("input") == "messages":
        over("messages", sum(len(c.content) for c in m.messages.messages), settings.max_prompt_chars,
             "characters in all")
    else:
        over("prompt", len(m.prompt), settings.max_prompt_chars, "characters")
    kind = m.WhichOneof("constraint")
    if kind in ("json_schema", "regex"):
        over(kind, utf8_size(getattr(m, kind), settings.max_constraint_bytes), settings.max_constraint_bytes,
             "bytes (max_constraint_bytes)")
    elif kind == "grammar":
        over("grammar.text", utf8_size(m.grammar.text, settings.max_constraint_bytes), settings.max_constraint_bytes,
             "bytes (max_constraint_bytes)")
        if m.grammar.syntax == pb.GRAMMAR_SYNTAX_UNSPECIFIED:
            bad.append(FieldViolation("grammar.syntax", "set the grammar syntax: LARK or EBNF"))
    elif kind == "choice":
        over("choice.options", len(m.choice.options), settings.max_choice_options, "options")
    over("logit_bias", len(m.logit_bias), settings.max_logit_bias, "entries")
    over("allowed_token_ids", len(m.allowed_token_ids), settings.max_allowed_token_ids, "ids")
    over("stopping.stop", len(m.stopping.stop), settings.max_stop_strings, "stop strings")
    over("stopping.stop_token_ids", len(m.stopping.stop_token_ids), settings.max_stop_token_ids, "ids")
    over("forbidden.phrases", len(m.forbidden.phrases), settings.max_forbidden_phrases, "phrases")
    over("request_id", len(m.request_id), MAX_REQUEST_ID_CHARS, "characters")
    # Forced positions are distinct and below max_new_tokens: more than its limit cannot all be valid.
    over("sampling.forced_tokens", len(m.sampling.forced_tokens), settings.max_new_tokens_limit,
         "entries (max_new_tokens_limit)")
    over("stopping.must_include", len(m.stopping.must_include), MAX_MUST_INCLUDE, "phrases")
    for name in PLUGIN_LISTS:
        calls = getattr(m, name)
        over(name, len(calls), settings.max_plugin_calls, "plugin calls")
        for index, call in enumerate(calls[: settings.max_plugin_calls]):
            over(f"{name}[{index}].params", call.params.ByteSize(), settings.max_plugin_params_bytes, "bytes")
    bad.extend(unknown_enums(message))
    return bad


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
