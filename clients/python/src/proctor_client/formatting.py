"""Human and JSON renderings of responses, chunks and model info, shared by this CLI and the server's."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf import json_format
from google.protobuf.message import Message

from proctor_client.v1 import generation_pb2

FINISH_PREFIX = "FINISH_REASON_"


def finish_reason_name(value: int) -> str:
    """``FINISH_REASON_EOS`` -> ``EOS``; an unknown number (newer server) is shown as is."""
    try:
        return generation_pb2.FinishReason.Name(value).removeprefix(FINISH_PREFIX)
    except ValueError:
        return str(value)


def summary_line(message: generation_pb2.GenerateResponse | generation_pb2.GenerateChunk) -> str:
    """One line with finish reason, token counts and timings (a response or the last chunk of a stream).

    When present it also shows the constraint (kind, backend, resolved schema_ref) and ``schema_valid``, the
    server's verdict on a JSON output; validation_lines gives the errors behind a ``schema_valid=false``.
    """
    finish = finish_reason_name(message.finish_reason)
    if message.finish_detail:
        finish += f" ({message.finish_detail})"
    parts = [
        f"finish={finish}",
        f"prompt_tokens={message.usage.prompt_tokens}",
        f"completion_tokens={message.usage.completion_tokens}",
        f"ttft_ms={message.timings.time_to_first_token_ms:.1f}",
        f"total_ms={message.timings.total_ms:.1f}",
        f"seed={message.seed}",
    ]
    if message.request_id:
        parts.append(f"request_id={message.request_id}")
    if message.HasField("constraint"):
        constraint = message.constraint
        parts.append(f"constraint={constraint.kind or '-'}")
        parts.append(f"backend={constraint.backend or '-'}")
        if constraint.schema_ref:
            parts.append(f"schema_ref={constraint.schema_ref}")
        if constraint.kind == "json_schema":
            parts.append(f"exact={str(constraint.exact).lower()}")
        if message.attempts:
            parts.append(f"attempts={len(message.attempts)}")
    if message.HasField("schema_validation"):
        parts.append(f"schema_valid={str(message.schema_validation.valid).lower()}")
    return " ".join(parts)


def validation_lines(message: generation_pb2.GenerateResponse | generation_pb2.GenerateChunk) -> list[str]:
    """One indented line per schema validation error (none when the output validated or was not JSON-checked)."""
    lines = []
    if message.HasField("constraint") and message.constraint.relaxed_keywords:
        lines.append("  validated fallback, relaxed: " + ", ".join(message.constraint.relaxed_keywords))
    for attempt in message.attempts:
        verdict = "valid" if attempt.valid else "invalid: " + "; ".join(attempt.errors[:2])
        lines.append(f"  attempt {attempt.attempt} (seed {attempt.seed}, temperature {attempt.temperature:g}): "
                     f"{attempt.completion_tokens} tokens, {verdict}")
    if message.HasField("schema_validation"):
        lines += [f"  schema error: {error}" for error in message.schema_validation.errors]
    return lines


def schema_lines(schemas: Sequence[generation_pb2.RegisteredSchema]) -> list[str]:
    """``name@version  description``, the references in one column, in the server's order."""
    refs = [f"{schema.name}@{schema.version}" for schema in schemas]
    width = max((len(ref) for ref in refs), default=0)
    return [f"{ref:<{width}}  {schema.description}".rstrip() for ref, schema in zip(refs, schemas, strict=True)]


def to_json(message: Message, *, compact: bool = False, include_defaults: bool = False) -> str:
    """The protobuf JSON mapping with proto field names; ``compact`` gives one line (for JSONL).

    ``include_defaults`` also prints fields left at their zero value (an empty list as ``[]`` rather than
    no key at all), for output that scripts index into.
    """
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        indent=None if compact else 2,
        ensure_ascii=False,
        always_print_fields_with_no_presence=include_defaults,
    )


def info_lines(info: generation_pb2.ModelInfo) -> list[str]:
    """Aligned ``key: value`` lines in proto field order; unset or empty values show as ``-``."""
    rows: list[tuple[str, str]] = []
    for field in info.DESCRIPTOR.fields:
        value = getattr(info, field.name)
        if field.is_repeated:
            text = ", ".join(str(v) for v in value)
        elif field.has_presence and not info.HasField(field.name):
            text = ""
        else:
            text = str(value)
        rows.append((field.name, text or "-"))
    width = max(len(name) for name, _ in rows) + 1
    return [f"{name + ':':<{width}} {text}" for name, text in rows]
