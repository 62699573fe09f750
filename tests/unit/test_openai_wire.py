"""The HTTP door speaks no protobuf, yet says what the gRPC door's messages say: held to the messages here.

- Its facts (``proctor`` in every answer) are the gRPC response's proto3 JSON, key for key, for events with every
  field set; its log-probabilities the 32-bit floats the response carries.
- Its extensions read a value as ``json_format`` reads the field's proto3 JSON (the same domain request, or a
  refusal), and its tables (kinds, enums and their numbers, presence) are the proto's.
- A request it converted is checked by the same size limits as the message that asks for it, and a refused one
  is recorded as that message.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import FieldDescriptor

from proctor.api.answered import Released
from proctor.api.check_request import DraftIntake, ProtoIntake
from proctor.api.convert import chunk_from_event, request_from_proto, request_to_proto, response_from_events
from proctor.api.size_limits import bounded_dict, message_violations, request_violations, struct_size
from proctor.config import Settings
from proctor.domain import (
    Attempt,
    Confidence,
    ConstraintSummary,
    FinishReason,
    FormatUse,
    GenerationRequest,
    ModerationVerdict,
    PhraseInclusion,
    PluginInfo,
    PromptTruncation,
    ReturnedSequence,
    SchemaCheck,
    TokenAlternative,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.events import Timings, Usage
from proctor.openai_http.answers import chat_logprobs
from proctor.openai_http.body import CHAT, parse_body
from proctor.openai_http.draft import Draft
from proctor.openai_http.errors import BodyError
from proctor.openai_http.facts import final_facts
from proctor.openai_http.fields import EXTENSIONS, apply_extensions
from proctor.openai_http.json_form import ENUMS, KINDS, PRESENCE
from proctor_client.v1 import generation_pb2 as pb

OWN_FIELDS = ("text", "token_ids", "tokens", "request_id")  # OpenAI's own fields carry these


def detail(token_id: int, text: str, logprob: float) -> TokenDetail:
    return TokenDetail(token_id, text, logprob, logprob - 0.123456789, (TokenAlternative(token_id, text, logprob),
                                                                        TokenAlternative(7, "x", -2.718281828)),
                       removed_by="constraint" if token_id % 2 else "")


FULL = TokenEvent(
    "r-1", (5,), "Hi", (detail(5, "Hi", -0.1),), FinishReason.CLOSED_AT_BUDGET, "closed", Usage(3, 1, 2, 1, 4, 2, 1),
    Timings(1.5, 20.25, 30.0), seed=2**63 + 5, constraint=ConstraintSummary(
        "json_schema", "llguidance", "ab" * 32, "contract/nda@1", True, 12.5, False, ("uniqueItems at #",),
        (FormatUse("#/d", "date", "validated"), FormatUse("#/e", "email", "annotation"))),
    schema_check=SchemaCheck(False, ("'a' is a required property",)),
    plugins=(PluginInfo("p", "1.0", "logits_processor"),),
    attempts=(Attempt(1, 9, 0.7, 4, FinishReason.LENGTH, False, ("bad",)), Attempt(2, 0, 0.0, 3, FinishReason.EOS,
                                                                                     True)),
    confidence=Confidence(3, 0.5, 0.25, 0.0, 0.125),
    must_include=(PhraseInclusion("yes", True), PhraseInclusion("no", False)),
    prompt_truncation=PromptTruncation("drop_oldest_turns", 90, 60, 2, 30),
    sequences=(ReturnedSequence((5, 6), "Hi!", -0.3333333, FinishReason.EOS, "", (detail(5, "Hi", -0.2),), "rc"),
               ReturnedSequence((0,), "", 0.0, FinishReason.LENGTH, "a-2")),
    moderation=(ModerationVerdict("screen", "1", "input_screen", "allow", 0.0, "ok"),
                ModerationVerdict("mod", "2", "output_moderator", "block", None, "")),
    receipt="receipt-note")
BARE = TokenEvent("r-2", finish_reason=FinishReason.EOS)
ZEROS = TokenEvent("r-3", finish_reason=FinishReason.STOP_STRING, usage=Usage(0, 0), timings=Timings(0.0, 0.0, 0.0),
                   confidence=Confidence(0, 0.0, 0.0, 0.0, 0.0), schema_check=SchemaCheck(True))
REQUESTS = (GenerationRequest("r", prompt="x", token_details=True, top_logprobs=1),
            GenerationRequest("r", prompt="x", top_logprobs=2), GenerationRequest("r", prompt="x"))


def _proto_facts(message: Any) -> dict[str, Any]:
    facts: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return {key: value for key, value in facts.items() if key not in OWN_FIELDS}


@pytest.mark.parametrize("event", [FULL, BARE, ZEROS])
@pytest.mark.parametrize("request_", REQUESTS)
@pytest.mark.parametrize("audit_id", ["", "a-1"])
def test_the_facts_are_the_grpc_answers_json_key_for_key(event: TokenEvent, request_: GenerationRequest,
                                                         audit_id: str) -> None:
    ours = final_facts(event, request_, audit_id)
    for message in (response_from_events([event], request_, audit_id), chunk_from_event(event, request_, audit_id)):
        theirs = _proto_facts(message)
        assert ours == theirs
        assert list(ours) == list(theirs)  # in the message's field order
        assert json.dumps(ours) == json.dumps(theirs)  # and every number spelt the same


def test_log_probabilities_are_the_32_bit_floats_the_response_carries() -> None:
    details = [detail(5, "Hi", -0.123456789), detail(6, "!", -12.3456789)]
    ours = chat_logprobs(details)["content"]
    theirs = list(response_from_events([TokenEvent("r", (5, 6), "Hi!", tuple(details), FinishReason.EOS)],
                                       REQUESTS[0]).tokens)
    assert [t["logprob"] for t in ours] == [t.logprob for t in theirs]
    assert [t["top_logprobs"][0]["logprob"] for t in ours] == [t.top_logprobs[0].logprob for t in theirs]
    assert Released(FULL, REQUESTS[0], "a").event is FULL


# --- the extensions and their tables -------------------------------------------------------------------------

def _descriptor(path: str) -> FieldDescriptor:
    descriptor = pb.GenerateRequest.DESCRIPTOR
    *parents, name = path.split(".")
    for parent in parents:
        descriptor = descriptor.fields_by_name[parent].message_type
    return descriptor.fields_by_name[name]


def _kind_of(field: FieldDescriptor) -> Any:
    scalars = {FieldDescriptor.TYPE_STRING: "string", FieldDescriptor.TYPE_BOOL: "bool",
               FieldDescriptor.TYPE_INT32: "int32", FieldDescriptor.TYPE_FLOAT: "float"}
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return ("map", _kind_of(field.message_type.fields_by_name["value"]))
    if field.type == FieldDescriptor.TYPE_ENUM:
        kind: Any = ("enum", field.enum_type.name)
    elif field.message_type is not None:
        kind = "struct" if field.message_type.full_name == "google.protobuf.Struct" else \
            ("message", {f.name: _kind_of(f) for f in field.message_type.fields})
    else:
        kind = scalars[field.type]
    return ("list", kind) if field.is_repeated else kind


def test_the_tables_are_the_protos() -> None:
    assert set(KINDS) == set(EXTENSIONS.values())
    for path, kind in KINDS.items():
        assert kind == _kind_of(_descriptor(path)), path
    for name, enum in ENUMS.items():
        assert enum.values == tuple(v.name for v in sorted(getattr(pb, name).DESCRIPTOR.values,
                                                           key=lambda v: v.number)), name
        assert [v.number for v in getattr(pb, name).DESCRIPTOR.values] == list(range(len(enum.values)))
    presence = {path for path in KINDS if (field := _descriptor(path)).has_presence and field.message_type is None
                and (field.containing_oneof is None or field.containing_oneof.name == f"_{field.name}")}
    assert presence == PRESENCE


BASE = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}, "strict": True}}}
VALUES: list[dict[str, Any]] = [
    {"top_k": 5}, {"top_k": "7"}, {"top_k": 5.0}, {"top_k": 5.5}, {"top_k": True}, {"top_k": 2**31},
    {"top_k": "1e2"}, {"top_k": [1]}, {"min_p": 0.1}, {"min_p": "0.25"}, {"min_p": 1e39}, {"min_p": True},
    {"min_p": "Infinity"}, {"min_p": "nan"}, {"min_p": 7}, {"typical_p": 0.7}, {"length_penalty": -1.5},
    {"speculation": "on"}, {"speculation": "SPECULATION_OFF"}, {"speculation": 1}, {"speculation": "sideways"},
    {"speculation": 9}, {"context_overflow": "drop_oldest_turns"}, {"constraint_backend": "xgrammar"},
    {"json_whitespace": "flexible"}, {"early_stopping": "never"}, {"early_stopping": "WHEN_FULL"},
    {"forbidden": {"phrases": ["a", "b"], "caseInsensitive": False}}, {"forbidden": {"whole_word": True}},
    {"forbidden": {"phrases": "a"}}, {"forbidden": {"bogus": 1}}, {"forbidden": []},
    {"allowed_token_ids": [1, 2, "3"]}, {"allowed_token_ids": [1, None]}, {"forced_tokens": {"3": 7, "1": 2}},
    {"forced_tokens": {"a": 1}}, {"repetition": {"ngram_size": 3, "repeats": 2}}, {"repetition": {}},
    {"must_include": ["x"]}, {"stop_token_ids": [0]}, {"ignore_eos": True}, {"ignore_eos": "true"},
    {"close_at_budget": False}, {"cache_prompt": False}, {"min_new_tokens": 0}, {"num_beams": 2},
    {"greedy_first_tokens": 3}, {"first_tokens_temperature": 0.5}, {"no_repeat_ngram_size": 2},
    {"repetition_penalty": 1.1}, {"confidence": True}, {"subject_id": "case-7"}, {"request_id": "req"},
    {"request_id": 5}, {"regex": "a+"}, {"regex": ""}, {"schema_ref": "contract/nda@1"},
    {"choice": {"options": ["a", "b"]}}, {"choice": {}}, {"grammar": {"syntax": "ebnf", "text": "root ::= \"a\""}},
    {"grammar": {"text": "start: \"a\""}}, {"grammar": {"syntax": 9, "text": "x"}},
    {"input_screens": [{"name": "prompt_injection", "params": {"threshold": 1, "list": [1, "a", None, True]}}]},
    {"output_moderators": [{"name": "m"}]}, {"logits_processors": [{"name": "p", "params": []}]},
    {"stopping_criteria": [None]}, {"constraint_exact_only": False}, {"constraint_exact_only": True},
]


def _through_protobuf(base: dict[str, Any], values: dict[str, Any]) -> pb.GenerateRequest | None:
    """What the door did before it spoke no protobuf: the body's fields on a message, each extension merged in as
    ``json_format`` parses it (None: refused)."""
    message = request_to_proto(parse_body({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                           **base}, CHAT).draft.request())
    for key, value in values.items():
        *parents, name = EXTENSIONS[key].split(".")
        wrapped: dict[str, Any] = {name: _full_enum(EXTENSIONS[key], value)}
        for parent in reversed(parents):
            wrapped = {parent: wrapped}
        try:
            message.MergeFrom(json_format.ParseDict(wrapped, pb.GenerateRequest()))
        except (json_format.ParseError, ValueError, TypeError, AttributeError):
            return None
    return message


def _full_enum(path: str, value: Any) -> Any:
    """The short enum names the door takes (``"on"``), as json_format's full ones."""
    kind = KINDS[path]
    if path == "grammar" and isinstance(value, dict) and isinstance(value.get("syntax"), str):
        return {**value, "syntax": _full_name("GrammarSyntax", value["syntax"])}
    if isinstance(kind, tuple) and kind[0] == "enum" and isinstance(value, str):
        return _full_name(kind[1], value)
    return value


def _full_name(enum_name: str, value: str) -> str:
    enum = ENUMS[enum_name]
    full = enum.prefix + value.upper()
    return full if full in enum.values else value


@pytest.mark.parametrize("base", [{}, BASE])
@pytest.mark.parametrize("values", VALUES, ids=lambda v: json.dumps(v))
def test_an_extension_reads_as_protobuf_reads_it(base: dict[str, Any], values: dict[str, Any]) -> None:
    expected = _through_protobuf(base, values)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **base, **values}
    try:
        draft = parse_body(body, CHAT).draft
    except BodyError as refused:
        read_it = "not a valid value of this field" in refused.message  # else: the body's own rule (one constraint)
        assert (expected is None) == read_it, refused
        assert refused.param in values
        return
    assert expected is not None, "refused by protobuf, taken here"
    ours, settings = draft.request(), Settings()
    assert [*request_violations(ours, settings), *draft.violations()] == message_violations(expected, settings)
    if draft.violations():  # an enum number the proto lacks, a grammar without its syntax: both refuse it
        return
    assert ours == request_from_proto(expected)
    if ours.constraint is not None and ours.constraint.kind == "json_schema":
        assert ours.constraint.parsed == (json.loads(ours.constraint.text),)  # the schema, as an object


def test_apply_extensions_sets_only_what_the_body_sends() -> None:
    draft = Draft()
    apply_extensions({"top_k": None, "regex": "a"}, draft)
    assert draft.values == {"regex": "a"}


# --- the same limits, the same record -----------------------------------------------------------------------

def _big(rng: random.Random) -> dict[str, Any]:
    settings = Settings()
    pick = rng.choice
    n = pick((0, 1, 17, 300))
    return {
        "stop": ["s"] * pick((0, settings.max_stop_strings + 1)),
        "logit_bias": {str(i): 1 for i in range(pick((0, settings.max_logit_bias + 1)))},
        "allowed_token_ids": list(range(pick((0, settings.max_allowed_token_ids + 1)))),
        "forbidden": {"phrases": ["p"] * pick((0, settings.max_forbidden_phrases + 1))},
        "request_id": "r" * pick((0, 257)), "must_include": ["m"] * pick((0, 17)),
        "forced_tokens": {str(i): 1 for i in range(pick((0, settings.max_new_tokens_limit + 1)))},
        "input_screens": [{"name": "s", "params": {"k": "v" * pick((1, settings.max_plugin_params_bytes))}}] * n,
        "regex": "é" * pick((1, settings.max_constraint_bytes // 2 + 1)),
        "messages": [{"role": "user", "content": "x" * pick((1, settings.max_prompt_chars + 1))}],
    }


def test_a_converted_request_meets_the_limits_its_message_would() -> None:
    rng = random.Random(55)
    settings = Settings()
    for _ in range(40):
        request = parse_body({"model": "m", **_big(rng)}, CHAT).draft.request()
        message = request_to_proto(request)
        assert request_violations(request, settings) == message_violations(message, settings)
        assert DraftIntake(request).as_received() == ProtoIntake(message).as_received() == bounded_dict(message)


def test_a_struct_is_measured_as_protobuf_measures_it() -> None:
    rng = random.Random(7)
    for _ in range(500):
        value = {rng.choice(("", "k", "ключ" * rng.randrange(50))): rng.choice(
            (None, True, 0, 1.5, "", "x" * rng.randrange(300), [1, "a", None, {"b": [False]}], {})) for _ in range(4)}
        struct = struct_pb2.Struct()
        struct.update(value)
        assert struct_size(value) == struct.ByteSize(), value
