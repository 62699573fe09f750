"""Figures read at scrape time from the objects that already keep them: no cost between scrapes.

The engine's waiting and running requests and KV-cache bytes (``Engine.occupancy``; with the cache's use as a
fraction and its shape, they are the three gauges and the cache info of the inference gateway's model-server
protocol, which the picker's configuration in deploy/k8s/overlays/inference-gateway maps by these names), the compile
cache's hits, misses and evictions by engine (``CompiledCache.engine_counts``), and the audit
sink's queue depth and records written. Read from the HTTP server's thread while the engine runs:
each figure is a snapshot (an int read under the GIL), which is what a gauge is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "proctor:"  # every metric name starts with it (vLLM: "vllm:")
CACHE_CONFIG_LABELS = ("block_size", "num_blocks")  # proctor:cache_config_info's, as Engine.occupancy names them
CACHE_COUNTS = (("hits", "Compile cache hits, by engine"), ("misses", "Compile cache misses, by engine"),
                ("evictions", "Compiled constraints evicted from the cache, by engine"))


class StateCollector(Collector):
    """Attach the sources as they come up (the engine only once the model is loaded)."""

    def __init__(self) -> None:
        self.engine: Any = None  # proctor.engine.engine.Engine (not imported: no torch here)
        self.cache: Any = None  # proctor.constraints.cache.CompiledCache
        self.sink: Any = None  # proctor.audit.sink.AuditSink
        self.limiter: Any = None  # proctor.api.caller_limits.CallerLimiter
        self.watchdog: Any = None  # proctor.observability.watchdog.Watchdog

    def collect(self) -> Iterator[Metric]:
        yield from self._engine()
        yield from self._fewer_steps()
        yield from self._admission()
        yield from self._watchdog()
        yield from self._cache()
        yield from self._audit()

    def _engine(self) -> Iterator[Metric]:
        state = self.engine.occupancy() if self.engine is not None else {}
        yield GaugeMetricFamily(PREFIX + "num_requests_waiting", "Requests waiting to join the batch",
                                value=state.get("waiting", 0))
        yield GaugeMetricFamily(PREFIX + "num_requests_running", "Requests in the running batch",
                                value=state.get("running", 0))
        yield GaugeMetricFamily(PREFIX + "kv_cache_used_bytes", "KV-cache bytes held by the running requests' tokens",
                                value=state.get("kv_used_bytes", 0))
        yield GaugeMetricFamily(PREFIX + "kv_cache_total_bytes", "KV-cache memory budget (--kv-cache-mb)",
                                value=state.get("kv_total_bytes", 0))
        yield GaugeMetricFamily(PREFIX + "kv_cache_usage_perc", "Fraction (0 to 1) of the KV-cache budget the running "
                                "requests' tokens hold: kv_cache_used_bytes / kv_cache_total_bytes, at most 1 (vLLM: "
                                "vllm:kv_cache_usage_perc)",
                                value=usage_fraction(state.get("kv_used_bytes", 0), state.get("kv_total_bytes", 0)))
        info = GaugeMetricFamily(PREFIX + "cache_config_info", "1, with the cache's shape in its labels (vLLM: "
                                 "vllm:cache_config_info). The running requests' KV cache has no fixed blocks (a "
                                 "request's keys and values grow as one span per row); the prefix cache keeps prompts "
                                 "in fixed chunks, the unit in which a later prompt reuses them: block_size = tokens "
                                 "per chunk (--prefill-chunk-tokens), num_blocks = the chunks its budget holds "
                                 "(--prefix-cache-mb); both 0 without a prefix cache. No sample before the model's "
                                 "executor is built", labels=CACHE_CONFIG_LABELS)
        if all(label in state for label in CACHE_CONFIG_LABELS):
            info.add_metric(tuple(str(state[label]) for label in CACHE_CONFIG_LABELS), 1)
        yield info

    def _fewer_steps(self) -> Iterator[Metric]:
        """The prefix cache and the drafts (engine/prefix_cache.py, engine/drafting.py), totals since start."""
        totals = self.engine.fewer_steps() if self.engine is not None else {}
        for name, key, doc in (
                ("hit_tokens", "hit_tokens", "Prompt tokens whose keys and values came from the prefix cache"),
                ("miss_tokens", "miss_tokens", "Prompt tokens of cacheable chunks the prefix cache did not hold"),
                ("evictions", "evicted_chunks", "Chunks the prefix cache dropped to stay within its budget"),
                ("erased_chunks", "forgotten_chunks", "Chunks the prefix cache dropped because their subject's keys "
                 "were destroyed (erasure or retention)")):
            yield CounterMetricFamily(PREFIX + "prefix_cache_" + name, doc, value=totals.get(key, 0))
        yield GaugeMetricFamily(PREFIX + "prefix_cache_bytes", "Memory the prefix cache's chunks hold "
                                "(--prefix-cache-mb)", value=totals.get("bytes", 0))
        drafts = CounterMetricFamily(PREFIX + "draft_tokens", "Tokens drafted ahead of the model (forced by a "
                                     "constraint or looked up), by outcome (drafted, accepted)", labels=("outcome",))
        for outcome in ("drafted", "accepted"):
            drafts.add_metric((outcome,), totals.get(outcome, 0))
        yield drafts

    def _admission(self) -> Iterator[Metric]:
        """What admission holds for calls; every figure returns to 0 once the calls have ended."""
        counts = self.engine.admission_counts() if self.engine is not None else {}
        held = GaugeMetricFamily(PREFIX + "admission_held", "Places admission holds for calls, by holder (reserved: "
                                 "being prepared; live: request ids the engine answers for)", labels=("holder",))
        for holder, count in counts.items():  # (no series before the model is loaded)
            held.add_metric((holder,), count)
        yield held
        streams = self.limiter.open_streams() if self.limiter is not None else {}
        open_streams = GaugeMetricFamily(PREFIX + "caller_generations_open",
                                         "Concurrent-generation slots held, by caller (callers file only)",
                                         labels=("caller",))
        for caller, count in sorted(streams.items()):
            open_streams.add_metric((caller,), count)
        yield open_streams

    def _watchdog(self) -> Iterator[Metric]:
        stuck = GaugeMetricFamily(PREFIX + "watchdog_stuck", "1 while the watchdog finds this part making no progress",
                                  labels=("part",))
        wedged = self.watchdog.wedged if self.watchdog is not None else {}
        for part in (p.name for p in self.watchdog.parts) if self.watchdog is not None else ():
            stuck.add_metric((part,), int(part in wedged))
        yield stuck

    def _cache(self) -> Iterator[Metric]:
        counts: dict[str, dict[str, int]] = dict(self.cache.engine_counts) if self.cache is not None else {}
        for key, doc in CACHE_COUNTS:
            family = CounterMetricFamily(PREFIX + f"constraint_cache_{key}", doc, labels=("engine",))
            for engine, values in sorted(counts.items()):
                family.add_metric((engine,), values.get(key, 0))
            yield family

    def _audit(self) -> Iterator[Metric]:
        sink = self.sink
        yield GaugeMetricFamily(PREFIX + "audit_queue_depth", "Audit records waiting for the writer",
                                value=sink.depth() if sink is not None else 0)
        yield CounterMetricFamily(PREFIX + "audit_records_written", "Audit records committed by this server",
                                  value=sink.written if sink is not None else 0)


def usage_fraction(used: int, total: int) -> float:
    """``used`` of ``total`` as a fraction in [0, 1] (0 with no budget): a request admitted alone may hold more
    than the budget (engine/batch.py ``fits``), and the protocol's gauge is a fraction."""
    return min(1.0, used / total) if total > 0 else 0.0
