"""Fuzzing the API (issue 14): hypothesis strategies built from the protobuf descriptors of every RPC's
request message — any field, any value its type admits, nested messages, oneofs, unknown enum numbers —
plus raw bytes that may not decode at all. Shared by tests/integration/test_reliability_real.py and
bench/reliability.py.

The oracle: no call may end INTERNAL or UNKNOWN (a crash or an unmapped error), and every
INVALID_ARGUMENT names the offending field (a BadRequest field violation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from proctor_client import ProctorError
from proctor_client.v1 import audit_pb2, generation_pb2

MAX_DEPTH = 3
# Texts that mean something to the server beside random ones: JSON, schemas, regexes, grammar, plugin names.
INTERESTING_TEXT = ('{"type": "object"}', '{"type": "string", "pattern": "a+"}', "[a-z]+", "{", "}", "null",
                    'root ::= "yes" | "no"', "start: \"x\"", "contract/nda", "no/such", "\x00", "é漢字🙂", " " * 40,
                    "a" * 300, '{"$ref": "#"}', '{"type": "object", "properties": {"a": {"$ref": "#"}}}')
RPCS: dict[str, tuple[str, type[Message], bool]] = {  # name: (method path, request type, server-streaming)
    "Generate": ("/proctor.v1.Generation/Generate", generation_pb2.GenerateRequest, False),
    "StreamGenerate": ("/proctor.v1.Generation/StreamGenerate", generation_pb2.GenerateRequest, True),
    "GetModelInfo": ("/proctor.v1.Generation/GetModelInfo", generation_pb2.GetModelInfoRequest, False),
    "ListSchemas": ("/proctor.v1.Generation/ListSchemas", generation_pb2.ListSchemasRequest, False),
    "GetRecord": ("/proctor.v1.Audit/GetRecord", audit_pb2.GetRecordRequest, False),
    "ExportRecords": ("/proctor.v1.Audit/ExportRecords", audit_pb2.ExportRecordsRequest, True),
    "VerifyLog": ("/proctor.v1.Audit/VerifyLog", audit_pb2.VerifyLogRequest, False),
    "Replay": ("/proctor.v1.Audit/Replay", audit_pb2.ReplayRequest, False),
}
BAD_CODES = {"INTERNAL", "UNKNOWN"}

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_STRING: st.one_of(st.text(max_size=40), st.sampled_from(INTERESTING_TEXT)),
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=40),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True, allow_infinity=True),
    FieldDescriptor.TYPE_INT32: st.one_of(st.integers(-2**31, 2**31 - 1), st.integers(-3, 70)),
    FieldDescriptor.TYPE_SINT32: st.one_of(st.integers(-2**31, 2**31 - 1), st.integers(-3, 70)),
    FieldDescriptor.TYPE_INT64: st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-3, 70)),
    FieldDescriptor.TYPE_SINT64: st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-3, 70)),
    FieldDescriptor.TYPE_UINT32: st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 70)),
    FieldDescriptor.TYPE_UINT64: st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 70)),
    FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_SFIXED32: st.integers(-2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED64: st.integers(-2**63, 2**63 - 1),
}


def _value(fd: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(fd.message_type, depth + 1)
    if fd.type == FieldDescriptor.TYPE_ENUM:  # known values, and numbers no version of the API defines
        return st.one_of(st.sampled_from([v.number for v in fd.enum_type.values]), st.integers(-5, 1000))
    return _SCALARS[fd.type]


@st.composite
def _message(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> Message:
    message = message_factory.GetMessageClass(descriptor)()
    if depth > MAX_DEPTH:
        return message
    chosen_oneof = {oneof.name: draw(st.sampled_from([None, *oneof.fields])) for oneof in descriptor.oneofs}
    for fd in descriptor.fields:
        oneof = fd.containing_oneof
        if oneof is not None and chosen_oneof.get(oneof.name) is not fd:
            continue
        if oneof is None and not draw(st.booleans()):
            continue
        value = _value(fd, depth)
        if fd.is_repeated:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                continue  # (no map fields in the API)
            items = draw(st.lists(value, max_size=4))
            target = getattr(message, fd.name)
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                for item in items:
                    target.add().CopyFrom(item)
            else:
                target.extend(items)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(message, fd.name).CopyFrom(draw(value))
        else:
            setattr(message, fd.name, draw(value))
    return message


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    return _message(descriptor, depth)


@st.composite
def _runnable(draw: st.DrawFn, descriptor: Descriptor) -> Message:
    """A generated GenerateRequest nudged towards what runs (a prompt, at most 4 tokens, sane sampling), so
    the fuzz also reaches the engine and not only the validation."""
    message = draw(messages(descriptor))
    if not message.WhichOneof("input"):
        message.prompt = draw(st.text(min_size=1, max_size=30))
    message.stopping.max_new_tokens = draw(st.integers(1, 4))
    message.sampling.temperature = draw(st.floats(0, 2))
    message.sampling.top_p = draw(st.floats(0.01, 1))
    message.sampling.min_p = draw(st.floats(0, 0.5))
    message.sampling.top_k = draw(st.integers(0, 50))
    message.top_logprobs = draw(st.integers(0, 5))
    for name in ("json_whitespace", "constraint_backend", "request_id"):
        message.ClearField(name)
    if draw(st.booleans()):  # half of them: only the input, the core sampling, the limit and a constraint
        keep = {"prompt", "messages", "sampling", "stopping", "json_schema", "regex", "choice", "grammar",
                "schema_ref", "token_details", "top_logprobs"}
        for fd, _ in message.ListFields():
            if fd.name not in keep:
                message.ClearField(fd.name)
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "no_repeat_ngram_size"):
            message.sampling.ClearField(name)
        max_new_tokens = message.stopping.max_new_tokens
        message.ClearField("stopping")
        message.stopping.max_new_tokens = max_new_tokens
    return message


def requests(rpc: str) -> st.SearchStrategy[bytes]:
    """Serialized requests for ``rpc``: generated messages (for the generating RPCs, half of them nudged to
    run), and (one draw in eight) arbitrary bytes."""
    descriptor = RPCS[rpc][1].DESCRIPTOR
    built = messages(descriptor)
    if descriptor.full_name == "proctor.v1.GenerateRequest":
        built = st.one_of(built, _runnable(descriptor))
    serialized = built.map(lambda message: message.SerializeToString())
    return st.one_of(*[serialized] * 7, st.binary(max_size=64))


@dataclass
class FuzzTally:
    """Per RPC: how many calls ended with each code, and the calls that broke the oracle."""

    codes: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def add(self, rpc: str, code: str, detail: str) -> None:
        counts = self.codes.setdefault(rpc, {})
        counts[code] = counts.get(code, 0) + 1
        if detail:
            self.failures.append(f"{rpc}: {detail}")

    def total(self, rpc: str) -> int:
        return sum(self.codes.get(rpc, {}).values())


def sender(channel: grpc.Channel, rpc: str, timeout_s: float = 30.0) -> Callable[[bytes], tuple[str, str]]:
    """A function sending raw request bytes to ``rpc``: (code name, what broke the oracle or "")."""
    path, _, streaming = RPCS[rpc]
    call = channel.unary_stream(path) if streaming else channel.unary_unary(path)

    def send(raw: bytes) -> tuple[str, str]:
        try:
            result = call(raw, timeout=timeout_s)
            if streaming:
                for _ in result:
                    pass
        except grpc.RpcError as error:
            code = error.code().name  # type: ignore[attr-defined]
            if code in BAD_CODES:
                return code, f"{code}: {error.details()} for {raw[:80]!r}"  # type: ignore[attr-defined]
            if code == "INVALID_ARGUMENT" and not ProctorError.from_rpc_error(error).field_violations:
                return code, f"INVALID_ARGUMENT without a field violation: {error.details()} for {raw[:80]!r}"  # type: ignore[attr-defined]
            return code, ""
        return "OK", ""

    return send


def fuzz_rpc(channel: grpc.Channel, rpc: str, examples: int, tally: FuzzTally) -> None:
    """Send ``examples`` generated requests to ``rpc`` (no shrinking or replay database: a tally, not a search)."""
    from hypothesis import HealthCheck, Phase, given, settings

    send = sender(channel, rpc)

    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(requests(rpc))
    def run(raw: bytes) -> None:
        tally.add(rpc, *send(raw))

    run()
