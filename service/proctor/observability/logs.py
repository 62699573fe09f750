"""Structured logs: ``--log-format text|json``, and one line per call (logger ``proctor.access``).

JSON lines carry ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message`` and, for a line logged
while an RPC runs, its ``trace_id`` when it has one; the per-call line adds its fields (``rpc``,
``code``, ``request_id``, ``audit_id``, ``caller``, token counts, ``ttft_ms``, ``duration_ms``...) at the top
level. The text format writes the same fields as ``key=value`` in the message. Health checks and
reflection are logged at DEBUG (probes would drown the log), every other RPC at INFO.

A log line is one line whatever a client sent: text from a request (a request id, an asserted caller, a model
name) may hold a newline or a terminal escape, so the text format writes every control and line-separator
character of a message as an escape (``\n``, ``\x1b``, ``\u2028``) and quotes a per-call value that holds a
space, ``=`` or ``"``; the JSON format escapes them inside its strings. A forged line cannot be written.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

from proctor.observability.calls import CURRENT, CallObservation

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS = logging.getLogger("proctor.access")
QUIET_SERVICES = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                            "grpc.reflection.v1.ServerReflection"})
# Characters that can end or rewrite a line: C0 and C1 controls, DEL, and the Unicode line/paragraph separators.
_BREAKING = {code: f"\\u{code:04x}" for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)}
_BREAKING.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", 0x1B: "\\x1b"})
# json.dumps escapes C0 controls; these it leaves as they are, and they may end a line in a log viewer.
_JSON_BREAKING = {code: f"\\u{code:04x}" for code in (*range(0x7F, 0xA0), 0x2028, 0x2029)}


def escape_text(text: str) -> str:
    """``text`` on one line: every control or line-separator character written as its escape."""
    return text if text.isprintable() else text.translate(_BREAKING)  # isprintable: the common case, one C scan


def log_value(value: object) -> str:
    """A per-call field's value for the text line: as it is, or quoted and escaped as a JSON string when it holds
    anything but printable characters or could pass for more than one field (a space, ``=``, ``"``)."""
    text = str(value)
    if text and text.isprintable() and not any(ch in text for ch in ' ="'):
        return text
    return json.dumps(text, ensure_ascii=False).translate(_JSON_BREAKING)


class TextFormatter(logging.Formatter):
    """The text format, its message escaped to one line (a traceback, the server's own, keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_text(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        data: dict[str, Any] = {"ts": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(fields)
        observation = CURRENT.get()
        if observation is not None and observation.trace_id:
            data.setdefault("trace_id", observation.trace_id)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str).translate(_JSON_BREAKING)


def configure_logging(level: str, log_format: str) -> None:
    """The process's log handler on stderr, in the chosen format (the ``serve`` command)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def call_fields(observation: CallObservation, code: str, seconds: float, peer: str) -> dict[str, Any]:
    """The per-call line's fields (no prompt or output text, no credential: ids, counts and times)."""
    fields: dict[str, Any] = {"rpc": f"{observation.service}/{observation.method}", "code": code}
    call = observation.call
    if call is not None:
        request = call.request
        raw = call.raw_request or {}
        fields["request_id"] = request.request_id if request is not None else str(raw.get("requestId", ""))
        fields["audit_id"] = call.audit_id
        fields["caller"] = call.caller.get("identity", peer)
        final = observation.final_event()
        if final is not None and final.usage is not None:
            fields["prompt_tokens"] = final.usage.prompt_tokens
            fields["completion_tokens"] = final.usage.completion_tokens
            fields["finish_reason"] = final.finish_reason.value
        elif request is not None:
            fields["prompt_tokens"] = call.prompt_tokens
            fields["completion_tokens"] = sum(len(event.token_ids) for event in call.events)
        if final is not None and final.timings is not None:
            submitted = observation.stage_end_ns("prepare") or observation.start_ns
            before_engine_ms = max(0, submitted - observation.start_ns) / 1e6
            fields["queue_ms"] = round(final.timings.queue_ms, 1)
            if final.usage is not None and final.usage.completion_tokens:
                fields["ttft_ms"] = round(before_engine_ms + final.timings.time_to_first_token_ms, 1)
    else:
        fields["caller"] = peer
    fields["duration_ms"] = round(seconds * 1000, 1)
    if observation.trace_id:
        fields["trace_id"] = observation.trace_id
    return fields


def log_call(observation: CallObservation, code: str, seconds: float, peer: str) -> None:
    level = logging.DEBUG if observation.service in QUIET_SERVICES else logging.INFO
    if not ACCESS.isEnabledFor(level):
        return
    fields = call_fields(observation, code, seconds, peer)
    text = " ".join(f"{key}={log_value(value)}" for key, value in fields.items() if value not in (None, ""))
    ACCESS.log(level, "call %s", text, extra={"fields": fields})
