"""Observability (issue 12): Prometheus metrics, OpenTelemetry traces and structured logs.

- ``calls.py``: one ``CallObservation`` per RPC in a context variable; the stages of a call
  (validation, preparation, constraint compile, audit commit) are marked with wall-clock times.
- ``metrics.py``: every metric, in one per-server ``CollectorRegistry``, served over HTTP.
- ``collectors.py``: gauges and counters read from the engine, compile cache and audit sink at scrape time.
- ``tracing.py``: the tracer provider from settings and ``OTEL_*``; the span tree of a call, built
  after the fact from the marks and the engine's own timings (no context crosses the engine thread).
- ``logs.py``: text or JSON log lines, and the one line per call.

Nothing here imports torch: the API layer uses it.
"""
