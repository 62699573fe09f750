"""OpenTelemetry traces: a span per RPC, with child spans for the stages of a generating call.

Off by default. On with ``Settings.tracing`` (``--tracing``) or when the standard
``OTEL_TRACES_EXPORTER`` names an exporter other than ``none``. Exporters: ``otlp`` (the default
once tracing is on; OTLP over gRPC, configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables), ``console`` (JSON spans on stdout), or several, comma-separated; ``none`` with
``--tracing`` records spans for in-process span processors only (tests). Sampling, resource
attributes and propagators follow ``OTEL_TRACES_SAMPLER``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_PROPAGATORS`` (W3C ``traceparent`` by default).

The tree of a call: ``<service>/<method>`` (SERVER kind, continuing the caller's trace when its
metadata carries a ``traceparent``) → ``validate``, ``prepare`` (→ ``constraint.compile`` per engine
tried), ``queue``, ``prefill``, ``decode`` (token counts as attributes), ``audit.commit``. Every
span is built when the RPC ends, with explicit start and end times: the API's stages from the marks
of ``calls.py``, the engine's from the timings in its final event (measured on the engine thread
from the submission, which is the end of ``prepare``). Nothing crosses the engine thread, and a
call costs a handful of span objects, never one per token.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from proctor import __version__
from proctor.observability.calls import COMPILE, PREPARE, CallObservation

log = logging.getLogger("proctor.observability")
EXPORTER_VARIABLE = "OTEL_TRACES_EXPORTER"


def tracing_enabled(setting: bool, environ: Mapping[str, str] | None = None) -> bool:
    exporter = (os.environ if environ is None else environ).get(EXPORTER_VARIABLE, "").strip().lower()
    return setting or exporter not in ("", "none")


def _exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    names = [n.strip() for n in (environ.get(EXPORTER_VARIABLE, "").lower() or "otlp").split(",") if n.strip()]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "none":
            continue
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                        or "grpc").strip().lower()
            if protocol != "grpc":
                raise ValueError(f"OTLP protocol {protocol!r} needs the opentelemetry-exporter-otlp-proto-http "
                                 "package; the server ships the gRPC one (OTEL_EXPORTER_OTLP_PROTOCOL=grpc)")
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        else:
            raise ValueError(f"{EXPORTER_VARIABLE}={name!r} is not supported (otlp, console or none)")
    return exporters


def _resource(environ: Mapping[str, str]) -> Resource:
    attributes: dict[str, Any] = {"service.version": __version__}
    if not environ.get("OTEL_SERVICE_NAME") and "service.name=" not in environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "proctor"
    return Resource.create(attributes)


def caller_trace_id(metadata: Sequence[tuple[str, Any]] | None) -> str:
    """The trace id of the caller's ``traceparent`` (tracing off: still worth logging), or ""."""
    carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
    if "traceparent" not in carrier:
        return ""
    context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


class Tracing:
    """The server's tracer provider (its own, not the process-global one) and the span tree of a call."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("proctor", __version__)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Tracing:
        environ = os.environ if environ is None else environ
        exporters = _exporters(environ)
        provider = TracerProvider(resource=_resource(environ))
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info("tracing on: exporters %s", ", ".join(type(e).__name__ for e in exporters) or "none")
        return cls(provider)

    def start(self, observation: CallObservation, metadata: Sequence[tuple[str, Any]] | None) -> Any:
        """Open the RPC's span (continuing the caller's trace) and give the observation its ids."""
        carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
        span = self.tracer.start_span(
            f"{observation.service}/{observation.method}", context=propagate.extract(carrier), kind=SpanKind.SERVER,
            start_time=observation.start_ns,
            attributes={"rpc.system": "grpc", "rpc.service": observation.service, "rpc.method": observation.method})
        context = span.get_span_context()
        observation.trace_id, observation.span_id = format(context.trace_id, "032x"), format(context.span_id, "016x")
        return span

    def finish(self, span: Any, observation: CallObservation, code: str, end_ns: int) -> None:
        """Build the child spans, then end the RPC's span with its status."""
        parent = trace.set_span_in_context(span)
        self._stages(parent, observation)
        final = observation.final_event()
        if final is not None:
            self._engine_spans(parent, observation, final, end_ns)
            if final.usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", final.usage.prompt_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", final.usage.completion_tokens)
        call = observation.call
        if call is not None:
            span.set_attribute("proctor.audit_id", call.audit_id)
            if call.request is not None:
                span.set_attribute("proctor.request_id", call.request.request_id)
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode[code].value[0] if code in grpc.StatusCode.__members__
                           else 2)
        if code != "OK":
            span.set_status(Status(StatusCode.ERROR, code))
        span.end(end_time=end_ns)

    def _stages(self, parent: Any, observation: CallObservation) -> None:
        prepare = parent
        for stage in sorted(observation.stages, key=lambda s: (s.start_ns, -s.end_ns)):  # outer stages first
            child = self.tracer.start_span(stage.name, context=prepare if stage.name == COMPILE else parent,
                                           start_time=stage.start_ns, attributes=stage.attributes)
            if stage.error:
                child.set_status(Status(StatusCode.ERROR, stage.error))
            if stage.name == PREPARE:
                prepare = trace.set_span_in_context(child)
            child.end(end_time=stage.end_ns)

    def _engine_spans(self, parent: Any, observation: CallObservation, final: Any, end_ns: int) -> None:
        timings, usage = final.timings, final.usage
        if timings is None or usage is None:
            return
        submitted = observation.stage_end_ns(PREPARE) or observation.start_ns

        def at(ms: float) -> int:
            return min(end_ns, submitted + int(ms * 1e6))

        queued, first, total = at(timings.queue_ms), at(timings.time_to_first_token_ms), at(timings.total_ms)
        self._span(parent, "queue", submitted, queued, {})
        if usage.completion_tokens:
            self._span(parent, "prefill", queued, first, {"gen_ai.usage.input_tokens": usage.prompt_tokens})
        self._span(parent, "decode", first if usage.completion_tokens else queued, total,
                   {"gen_ai.usage.output_tokens": usage.completion_tokens,
                    "proctor.finish_reason": final.finish_reason.value})

    def _span(self, parent: Any, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]) -> None:
        self.tracer.start_span(name, context=parent, start_time=start_ns, attributes=attributes).end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporters."""
        self.provider.shutdown()
