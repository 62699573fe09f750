"""Prometheus metrics: one ``Metrics`` object per server, each with its own ``CollectorRegistry``.

A per-server registry (not prometheus_client's global one) lets tests and benchmarks run several
servers in one process. Names follow vLLM's (``vllm:time_to_first_token_seconds``...) with the
``proctor:`` prefix; every label set is bounded (RPC names, status codes, finish reasons,
constraint engines), never per request. Counters are exposed with the ``_total`` suffix.

Where each figure comes from:

- per RPC (the interceptor, ``api/telemetry.py``): requests by service, method and status code;
  for generating RPCs the engine's final event gives tokens, finish reason, schema validity and
  timings. Time to first token is measured from the RPC's arrival (validation, preparation and
  queue wait included); time per output token is the request's mean after its first token;
- the engine thread (``hooks.StepObserver``): prefill and decode step time, mask time, and the
  steps where the forbidden-phrase mask removed the model's own top choice (a phrase prevented);
- the constraint compiler (``hooks.CompileObserver``): compile time and failures by engine;
- the audit writer (``hooks.AuditObserver``): write latency per committed batch and failed records;
- at scrape time (``collectors.py``): waiting/running requests, KV-cache bytes, cache
  hits/misses/evictions by engine, audit queue depth and records written.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proctor.observability.calls import CallObservation
from proctor.observability.collectors import PREFIX, StateCollector
from proctor.observability.endpoint import serve_metrics

log = logging.getLogger("proctor.observability")
# Buckets in seconds (vLLM's for the request latencies).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
MASK_BUCKETS = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FORBIDDEN_LAYER = "forbidden"  # decoding/masks.py's name for the forbidden-phrase layer
REPETITION = "repetition"  # FinishReason.REPETITION.value


class Metrics:
    """Every metric of one server; also the engine's, compiler's and audit sink's observer."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._http: Any = None
        self.port = 0
        self.state = StateCollector()  # attach the engine, compile cache and audit sink to it
        self.registry.register(self.state)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, registry=self.registry, buckets=buckets)

        self.requests = counter("requests", "RPCs handled, by service, method and gRPC status code",
                                ("service", "method", "code"))
        self.e2e = histogram("e2e_request_latency_seconds", "Generating RPCs: arrival to the last response",
                             E2E_BUCKETS, ("method",))
        self.ttft = histogram("time_to_first_token_seconds", "Arrival of the RPC to its first generated token",
                              TTFT_BUCKETS)
        self.tpot = histogram("time_per_output_token_seconds", "Mean time per generated token after the first",
                              TPOT_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "Time a request waited to join the batch",
                                    TTFT_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of the requests that ran")
        self.generation_tokens = counter("generation_tokens", "Tokens generated")
        self.finished = counter("request_finished", "Requests that ran, by finish reason", ("reason",))
        self.schema_invalid = counter("schema_invalid_outputs", "Outputs that did not validate against their schema")
        self.repetition_stops = counter("repetition_stops", "Requests stopped by the repetition detector")
        self.closing_tokens = counter("closing_tokens", "Tokens forced to end a JSON output validly within its budget "
                                                        "(close_at_budget; the requests: reason closed_at_budget)")
        self.prefill_time = histogram("prefill_seconds", "A step that fed prompt tokens (its one forward also "
                                      "decodes the running rows; first tokens included)", STEP_BUCKETS)
        self.decode_step_time = histogram("decode_step_seconds", "A step that fed no prompt: one batched decode "
                                          "(forward, pipeline, commit)", STEP_BUCKETS)
        self.mask_time = histogram("mask_seconds", "Building a step's token masks (steps with any mask)",
                                   MASK_BUCKETS)
        self.forbidden_hits = counter("forbidden_phrase_hits", "Steps where the forbidden-phrase mask removed the "
                                      "model's own top choice")
        self.compile_time = histogram("constraint_compile_seconds", "Constraint compiles (cache misses), by engine",
                                      COMPILE_BUCKETS, ("engine",))
        self.compile_failures = counter("constraint_compile_failures", "Specs an engine refused or failed to "
                                        "compile, by engine", ("engine",))
        self.audit_write = histogram("audit_write_seconds", "Committing one batch of audit records", WRITE_BUCKETS)
        self.audit_failures = counter("audit_write_failures", "Audit records whose write failed")
        self.witness_answers = counter("audit_witness_answers", "Answers of the witnesses of --audit-witness-url "
                                       "(c2sp.org/tlog-witness), by witness and outcome (cosigned, conflict, "
                                       "inconsistent, forbidden, unknown-log, unreachable, ...)",
                                       ("witness", "outcome"))
        self.witness_size = Gauge(PREFIX + "audit_witness_cosigned_size", "The tree size each witness last cosigned",
                                  ("witness",), registry=self.registry)
        self.witness_time = Gauge(PREFIX + "audit_witness_cosigned_time_seconds", "When each witness last cosigned a "
                                  "checkpoint (Unix time): alert when it stops moving", ("witness",),
                                  registry=self.registry)

    # --- hooks.StepObserver (engine thread: one histogram observe per step) -----------------------
    def prefill(self, seconds: float, requests: int) -> None:
        self.prefill_time.observe(seconds)

    def decode_step(self, seconds: float, rows: int) -> None:
        self.decode_step_time.observe(seconds)

    def masks(self, seconds: float, removed_by: list[str]) -> None:
        self.mask_time.observe(seconds)
        hits = removed_by.count(FORBIDDEN_LAYER)
        if hits:
            self.forbidden_hits.inc(hits)

    # --- hooks.CompileObserver and hooks.AuditObserver ---------------------------------------------
    def compiled(self, engine: str, seconds: float, ok: bool) -> None:
        self.compile_time.labels(engine).observe(seconds)
        if not ok:
            self.compile_failures.labels(engine).inc()

    def audit_written(self, seconds: float, records: int, ok: bool) -> None:
        self.audit_write.observe(seconds)
        if not ok:
            self.audit_failures.inc(records)

    # --- audit/witness_feed.WitnessObserver (its periodic job's thread) -------------------------------
    def witness_answer(self, witness: str, outcome: str) -> None:
        self.witness_answers.labels(witness, outcome).inc()

    def witness_cosigned(self, witness: str, size: int, at_s: float) -> None:
        self.witness_size.labels(witness).set(size)
        self.witness_time.labels(witness).set(at_s)

    # --- per RPC (event loop) ----------------------------------------------------------------------
    def record_call(self, observation: CallObservation, code: str, seconds: float) -> None:
        self.requests.labels(observation.service, observation.method, code).inc()
        call = observation.call
        if call is None or call.request is None:
            return
        self.e2e.labels(observation.method).observe(seconds)
        final = observation.final_event()
        if final is None:  # it ended before the engine's final event (cancelled, failed)
            self.prompt_tokens.inc(call.prompt_tokens)
            self.generation_tokens.inc(sum(len(event.token_ids) for event in call.events))
            return
        usage, timings = final.usage, final.timings
        if usage is not None:
            self.prompt_tokens.inc(usage.prompt_tokens)
            self.generation_tokens.inc(usage.completion_tokens)
            self.closing_tokens.inc(usage.closing_tokens)
        reason = final.finish_reason.value
        self.finished.labels(reason).inc()
        if reason == REPETITION:
            self.repetition_stops.inc()
        if final.schema_check is not None and not final.schema_check.valid:
            self.schema_invalid.inc()
        if timings is None or usage is None:
            return
        self.queue_time.observe(timings.queue_ms / 1000)
        if usage.completion_tokens:
            submitted = observation.stage_end_ns("prepare") or observation.start_ns
            before_engine = max(0, submitted - observation.start_ns) / 1e9
            self.ttft.observe(before_engine + timings.time_to_first_token_ms / 1000)
        if usage.completion_tokens > 1:
            decode_ms = timings.total_ms - timings.time_to_first_token_ms
            self.tpot.observe(max(0.0, decode_ms) / 1000 / (usage.completion_tokens - 1))

    # --- serving -----------------------------------------------------------------------------------
    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` (any path) over HTTP on ``host:port``; returns the bound port."""
        server = serve_metrics(self.registry, host, port)
        self._http = server
        self.port = int(server.server_port)
        log.info("metrics on http://%s:%d/metrics", host if ":" not in host else f"[{host}]", self.port)
        return self.port

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
