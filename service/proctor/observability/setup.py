"""A server's observability from its settings: which parts are on, and wiring them to the components.

Metrics are collected only when ``metrics_port`` is set (otherwise every component's observer stays
None and nothing is recorded); tracing only when ``tracing_enabled``. The per-call log line does
not depend on either.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proctor.config import Settings
from proctor.observability.metrics import Metrics
from proctor.observability.tracing import Tracing, tracing_enabled

log = logging.getLogger("proctor.observability")


@dataclass
class Observability:
    metrics: Metrics | None = None
    tracing: Tracing | None = None

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> Observability:
        environ = os.environ if environ is None else environ
        metrics = Metrics() if settings.metrics_port else None
        tracing = Tracing.from_environment(environ) if tracing_enabled(settings.tracing, environ) else None
        return cls(metrics, tracing)

    def serve(self, settings: Settings) -> int:
        """Start the metrics endpoint (when on); returns its port, 0 when off."""
        if self.metrics is None:
            return 0
        return self.metrics.serve(settings.metrics_host or settings.host, settings.metrics_port)

    def watch_audit(self, sink: Any) -> None:
        if self.metrics is not None and sink is not None:
            sink.observer = self.metrics
            self.metrics.state.sink = sink

    def watch_compiler(self, compiler: Any) -> None:
        if self.metrics is not None:
            compiler.observer = self.metrics
            self.metrics.state.cache = compiler.cache

    def watch_gate(self, limiter: Any) -> None:
        if self.metrics is not None:
            self.metrics.state.limiter = limiter

    def watch_watchdog(self, watchdog: Any) -> None:
        if self.metrics is not None:
            self.metrics.state.watchdog = watchdog

    def watch_engine(self, engine: Any) -> None:
        if self.metrics is not None:
            engine.observer = self.metrics
            self.metrics.state.engine = engine

    def close(self) -> None:
        """Stop the metrics endpoint and export the spans still buffered."""
        if self.metrics is not None:
            self.metrics.close()
        if self.tracing is not None:
            try:
                self.tracing.shutdown()
            except Exception:  # an exporter that cannot flush must not stop the shutdown
                log.exception("the trace exporter did not shut down cleanly")
