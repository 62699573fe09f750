"""Composition root: start the gRPC server, load the model, start the engine, shut down in order.

Start-up: open the audit trail (a store that cannot be opened stops the start) → bind and serve
health (NOT_SERVING) → load model → start engine → warm up → SERVING. Shutdown (rule 10): signal →
health NOT_SERVING → (SIGTERM: the drain notice, calls still served) → stop accepting → drain in-flight
calls within the grace period → stop the engine → flush the audit trail (final signed checkpoint) → exit.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from proctor import __version__
from proctor.api.access_log import AccessLog
from proctor.api.audit_servicer import AuditServicer
from proctor.api.audit_trail import AuditTrail
from proctor.api.contracts_servicer import ContractsServicer
from proctor.api.generation_service import GenerationService
from proctor.api.readiness import SERVICE_NAME, serving_of
from proctor.api.security import bind, build_gate
from proctor.api.servicer import GenerationServicer
from proctor.api.telemetry import TelemetryInterceptor
from proctor.audit.keystore import KeyStore
from proctor.audit.memory_erasure import memory_erasure
from proctor.audit.periodic import Periodic
from proctor.audit.retention import RetentionPolicy
from proctor.audit.setup import audit_jobs, checkpoint_path, key_store, open_sink, privacy_policy
from proctor.audit.sink import AuditSink
from proctor.config import Settings
from proctor.contracts.templates import TemplateRegistry
from proctor.domain import GenerationRequest, StoppingParams
from proctor.observability.setup import Observability
from proctor.observability.watchdog import CHECK_INTERVAL_S, EngineProgress, Watchdog, Watched, WriterProgress
from proctor.openai_http.server import HttpListener, serve_http

if TYPE_CHECKING:  # the heavy modules load lazily, after the port is bound
    from proctor.constraints.registry import RegisteredSchema
    from proctor.constraints.service import ConstraintService
    from proctor.decoding.plugins import PluginRegistry
    from proctor.engine.engine import Engine
    from proctor.engine.loaded_model import LoadedModel
from proctor_client.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    contracts_pb2,
    contracts_pb2_grpc,
    generation_pb2_grpc,
)

log = logging.getLogger("proctor.app")
CONTRACTS_SERVICE_NAME = contracts_pb2.DESCRIPTOR.services_by_name["Contracts"].full_name
AUDIT_SERVICE_NAME = audit_pb2.DESCRIPTOR.services_by_name["Audit"].full_name


@dataclass
class RunningServer:
    """A started server: its bound port and what shutdown needs."""

    settings: Settings
    server: grpc.aio.Server
    port: int
    health: HealthServicer
    service: GenerationService
    loop: asyncio.AbstractEventLoop
    engine: Engine | None = None
    audit_sink: AuditSink | None = None
    observability: Observability | None = None
    health_server: grpc.aio.Server | None = None  # the plaintext health-only port (settings.health_port)
    health_port: int = 0
    http: HttpListener | None = None  # the OpenAI-compatible HTTP API (settings.http_port)
    _ready: bool = field(default=False, init=False)  # the model is loaded and the engine started
    _engine_ok: bool = field(default=True, init=False)
    _audit_ok: bool = field(default=True, init=False)  # the audit store takes records (last write or probe)
    _progress_ok: bool = field(default=True, init=False)  # the watchdog sees every part move (or is off)
    _watchdog: asyncio.Task[None] | None = field(default=None, init=False)
    keys: KeyStore | None = None  # --audit-encryption subject: an erased subject's prompts leave the prefix cache
    jobs: list[Periodic] = field(default_factory=list)  # run off the loop while the server runs (audit/periodic.py)

    def __post_init__(self) -> None:
        if self.audit_sink is not None:
            self.audit_sink.on_store_health = self._audit_store_health

    async def load(self) -> None:
        """Load the model and start the engine (off the event loop), then report SERVING."""
        try:
            engine, info, schemas = await asyncio.to_thread(_build_engine, self.settings, self._engine_health,
                                                            self.observability)
        except Exception:
            log.exception("model loading failed")
            raise
        self.engine = engine
        self.service.attach(engine, info, schemas, plugins=engine.plugins, model=engine.loaded)
        phrases = sorted(engine.server_forbidden)
        self.service.audit.server = {"version": __version__, "server_forbidden_phrases": {
            "count": len(phrases), "sha256": hashlib.sha256("\n".join(phrases).encode()).hexdigest()}}
        self._ready = True
        await self._publish_health()
        self._start_watchdog(engine)
        if self.keys is not None and engine.prefix_cache.enabled:
            self.jobs.append(memory_erasure(self.keys, engine.prefix_cache.forget))
            self.jobs[-1].start()
        log.info("ready: serving %s on %s:%d", info["model_id"], self.settings.host, self.port)

    def _start_watchdog(self, engine: Engine) -> None:
        """Check every second that the engine and the audit writer make progress (settings.watchdog_s; 0: off)."""
        if not self.settings.watchdog_s:
            return
        parts: list[Watched] = [EngineProgress(engine)]
        if self.audit_sink is not None:
            parts.append(WriterProgress(self.audit_sink))
        watchdog = Watchdog(parts, self.settings.watchdog_s)
        if self.observability is not None:
            self.observability.watch_watchdog(watchdog)

        async def run() -> None:
            while True:
                await asyncio.sleep(CHECK_INTERVAL_S)
                watchdog.check()
                if self._progress_ok != (not watchdog.wedged):
                    self._progress_ok = not watchdog.wedged
                    await self._publish_health()

        self._watchdog = asyncio.create_task(run(), name="proctor-watchdog")

    async def _publish_health(self) -> None:
        """The whole server ("") is liveness: SERVING unless the engine is faulty or the watchdog finds the engine
        or the audit writer stuck. proctor.v1.Generation is readiness: also NOT_SERVING while, in compliance
        mode, the audit store takes no records (calls would fail closed). Both are NOT_SERVING before the
        model is loaded and from the start of a drain."""
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        alive = self._ready and self._engine_ok and self._progress_ok
        ready = alive and (self._audit_ok or not self.settings.audit_compliance)
        await self.health.set("", serving if alive else not_serving)
        await self.health.set(SERVICE_NAME, serving if ready else not_serving)

    def _engine_health(self, healthy: bool, reason: str) -> None:
        """Called from the engine thread: mirror the engine's health in the gRPC health service."""
        self._engine_ok = healthy
        asyncio.run_coroutine_threadsafe(self._publish_health(), self.loop)

    def _audit_store_health(self, healthy: bool, reason: str) -> None:
        """Called from the audit writer thread when the store stops or starts taking records."""
        self._audit_ok = healthy
        asyncio.run_coroutine_threadsafe(self._publish_health(), self.loop)

    async def shutdown(self, notice_s: float = 0.0) -> None:
        """Health NOT_SERVING → (``notice_s``: keep serving, so probes and load balancers see it and stop
        sending) → refuse new calls → finish in-flight calls within the grace period."""
        await self.health.enter_graceful_shutdown()
        if self._watchdog is not None:  # a closing sink and a draining engine are no wedge
            self._watchdog.cancel()
        for job in self.jobs:
            job.stop()
        if notice_s > 0:
            log.info("draining: health NOT_SERVING for %.1f s before the listener closes (calls still served)",
                     notice_s)
            await asyncio.sleep(notice_s)
        log.info("shutting down (grace %.1f s for calls in flight)", self.settings.grace_period_s)
        await asyncio.gather(self.server.stop(self.settings.grace_period_s),
                             *([self.http.stop()] if self.http is not None else []))
        if self.health_server is not None:  # NOT_SERVING stays visible there until the calls are done
            await self.health_server.stop(0)
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown, 1.0)
            if self.engine.constraints is not None:
                self.engine.constraints.compiler.close()
        if self.audit_sink is not None:
            await asyncio.to_thread(self.audit_sink.close)
            log.info("audit trail flushed: %d records written this run", self.audit_sink.written)
        if self.observability is not None:
            await asyncio.to_thread(self.observability.close)
        log.info("stopped")


def _build_constraints(loaded: LoadedModel, settings: Settings, observability: Observability | None = None
                       ) -> tuple[ConstraintService, Callable[[], None]]:
    """Compiler, registry, and their warm-up (tables, workers, registered schemas) to start once the engine is warm."""
    from proctor.constraints.compiler import CompileLimits, ConstraintCompiler
    from proctor.constraints.registry import SchemaRegistry
    from proctor.constraints.service import ConstraintService
    from proctor.domain import ConstraintRequest

    start = time.perf_counter()
    compiler = ConstraintCompiler(
        tokenizer=loaded.tokenizer, model_path=str(loaded.tokenizer_source), vocab_size=loaded.vocab_size,
        eos_token_ids=tuple(loaded.eos_token_ids), tokenizer_fingerprint=loaded.tokenizer_sha256,
        limits=CompileLimits(settings.constraint_timeout_s, settings.max_constraint_bytes),
        isolate=settings.constraint_isolation, workers=settings.compile_workers)
    if observability is not None:
        observability.watch_compiler(compiler)
    registry = SchemaRegistry.load(Path(settings.schema_dir) if settings.schema_dir else None)
    service = ConstraintService(compiler, registry, max_schema_depth=settings.max_schema_depth,
                                max_choice_options=settings.max_choice_options)

    def precompile() -> None:
        for entry in registry.list():
            prepared = service.prepare(ConstraintRequest("schema_ref", text=entry.ref))
            log.info("schema %s compiled with %s in %.0f ms", entry.ref, prepared.summary.backend,
                     prepared.summary.compile_ms)
        log.info("constraints ready in %.1f s (%d registered schemas)", time.perf_counter() - start, len(registry))

    # Off the ready path (issue 42): the compile workers' start-up (a Python process each, its tokenizer and
    # tables) was the longest part of it. A constrained call that comes first waits for what it needs.
    return service, lambda: compiler.prewarm(precompile, background=True)


def _build_plugins_and_forbidden(loaded: LoadedModel, settings: Settings) -> tuple[PluginRegistry, tuple[str, ...]]:
    """Plugin registry and the server-wide forbidden list (its index built now, not on a request)."""
    from proctor.decoding.forbidden import ForbiddenOptions, build_index
    from proctor.decoding.forbidden.phrase_file import load_phrase_file
    from proctor.decoding.plugins import PluginRegistry

    plugins = PluginRegistry.load(settings.plugins)
    phrases: tuple[str, ...] = ()
    if settings.forbidden_file:
        start = time.perf_counter()
        phrases = load_phrase_file(Path(settings.forbidden_file), settings.max_forbidden_phrase_chars)
        build_index(loaded.tokenizer, loaded.vocab_size, phrases, ForbiddenOptions())
        log.info("%d server-wide forbidden phrases indexed in %.1f s", len(phrases), time.perf_counter() - start)
    return plugins, phrases


def load_templates(settings: Settings) -> TemplateRegistry:
    """The contract templates, checked against the schema registry now: a bad file stops the start."""
    from proctor.constraints.registry import SchemaRegistry

    schemas = SchemaRegistry.load(Path(settings.schema_dir) if settings.schema_dir else None)
    templates = TemplateRegistry.load(schemas, Path(settings.template_dir) if settings.template_dir else None)
    log.info("%d contract templates", len(templates))
    return templates


def _build_engine(settings: Settings, on_health: Callable[[bool, str], None],
                  observability: Observability | None = None
                  ) -> tuple[Engine, dict[str, object], list[RegisteredSchema]]:
    from proctor.engine.engine import Engine
    from proctor.engine.executor_setup import plan_for
    from proctor.models import load_model
    from proctor.models.info import model_info
    from proctor.models.loader import resolve_source
    from proctor.models.signature import checked_signature

    signature = checked_signature(settings, resolve_source(settings).path)  # before any byte of it is loaded
    log.info("model signature: %s", signature.detail)
    loaded = load_model(settings)
    plan = plan_for(loaded, settings)  # the executor, decided once (executor/plan.py)
    if plan.problem is not None:  # at start, not as the fault of every request
        raise ValueError(plan.problem)
    constraints, warm_constraints = _build_constraints(loaded, settings, observability)
    plugins, forbidden = _build_plugins_and_forbidden(loaded, settings)
    engine = Engine(loaded, settings, on_health=on_health, constraints=constraints,
                    plugins=plugins, server_forbidden=forbidden, release_dense_weights=True, plan=plan)
    if observability is not None:
        observability.watch_engine(engine)
    info = {**model_info(loaded, plan), "model_signature": signature.status, "model_signer": signature.signer,
            "reasoning_parser": engine.thought_markers.parser if engine.thought_markers is not None else ""}
    log.info("runner: %s", info["runner"])
    engine.start()
    if settings.warmup:
        engine.generate_blocking(GenerationRequest(request_id="warmup", prompt="Hello",
                                                   stopping=StoppingParams(max_new_tokens=4, ignore_eos=True)))
    warm_constraints()  # after the engine's warm-up: beside it, the first forward (paging weights in) ran 9x slower
    return engine, info, constraints.registry.list() if constraints.registry is not None else []


async def start_server(settings: Settings) -> RunningServer:
    """Bind (port 0 picks a free port), start serving health, and begin loading the model."""
    limit = settings.max_message_bytes
    gate = build_gate(settings)  # refuses an exposed server before anything else starts
    observability = Observability.from_settings(settings)
    observability.watch_gate(gate.limiter)
    telemetry = TelemetryInterceptor(observability.metrics, observability.tracing)  # first: sees refusals too
    server = grpc.aio.server(interceptors=[telemetry, gate], options=[
        ("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit),
        ("grpc.so_reuseport", 0)])
    health = HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    sink = await asyncio.to_thread(open_sink, settings)
    if sink is not None:  # every Audit call from here on appends its access record
        gate.access = AccessLog(sink)
    observability.watch_audit(sink)
    keys = key_store(settings, existing=True) if sink is not None else None
    policy = RetentionPolicy.load(settings.audit_retention_days, settings.audit_retention_file)
    audit = AuditTrail(sink, privacy_policy(settings), compliance=settings.audit_compliance,
                       top_n=settings.audit_top_n, receipts=settings.audit_receipts,
                       keys=keys if settings.audit_encryption == "subject" else None)
    service = GenerationService(settings, audit)
    generation_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(service), server)
    contracts = ContractsServicer(service.calls, load_templates(settings))
    contracts_pb2_grpc.add_ContractsServicer_to_server(contracts, server)
    names = [SERVICE_NAME, CONTRACTS_SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME]
    if sink is not None:
        audit_pb2_grpc.add_AuditServicer_to_server(
            AuditServicer(settings, sink.store, service.calls, checkpoint_path(settings), sink.request_checkpoint,
                          keys),
            server)
        names.append(AUDIT_SERVICE_NAME)
    if settings.reflection_enabled:
        reflection.enable_server_reflection(names, server)
    port, _ = bind(server, settings)
    await server.start()
    health_server, health_port = await _serve_health_port(health, settings)
    http = await serve_http(settings, service, gate.rules, telemetry.observer, serving_of(health),
                            sink.store if sink is not None else None)
    observability.serve(settings)
    running = RunningServer(settings, server, port, health, service, asyncio.get_running_loop(), audit_sink=sink,
                            observability=observability, health_server=health_server, health_port=health_port,
                            http=http, keys=audit.keys)
    running.jobs += audit_jobs(settings, sink, keys, policy, observability.metrics)
    for job in running.jobs:
        job.start()
    log.info("listening on %s:%d (health NOT_SERVING until the model is loaded)", settings.host, port)
    return running


async def _serve_health_port(health: HealthServicer, settings: Settings) -> tuple[grpc.aio.Server | None, int]:
    """The health service alone on a plaintext port (settings.health_port; 0: none), for probes without TLS."""
    if not settings.health_port:
        return None, 0
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    address = f"{settings.host}:{settings.health_port}"
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the health port {address}")
    await server.start()
    log.info("health service alone on %s (plaintext, for probes)", address)
    return server, port


async def serve(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT, then shut down in order and return (exit status 0)."""
    running = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, sig, received, stop)
    loader = asyncio.create_task(running.load())
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({loader, waiter}, return_when=asyncio.FIRST_COMPLETED)
    failure = loader.exception() if loader in done else None
    if failure is not None:
        await running.server.stop(0)
        raise failure
    await waiter
    if not loader.done():
        loader.cancel()
    # SIGTERM (an orchestrator) gets the drain notice; SIGINT (a person at a terminal) does not.
    await running.shutdown(settings.drain_notice_s if received[0] is signal.SIGTERM and loader.done() else 0.0)


class BackgroundServer:
    """A server on its own event-loop thread: for tests, benchmarks and embedding."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proctor-server", daemon=True)
        self.running: RunningServer | None = None

    def start(self, timeout_s: float = 300) -> BackgroundServer:
        self._thread.start()
        self.running = asyncio.run_coroutine_threadsafe(start_server(self.settings), self._loop).result(10)
        asyncio.run_coroutine_threadsafe(self.running.load(), self._loop).result(timeout_s)
        return self

    @property
    def address(self) -> str:
        assert self.running is not None
        return f"{self.settings.host}:{self.running.port}"

    def stop(self) -> None:
        if self.running is not None:
            asyncio.run_coroutine_threadsafe(self.running.shutdown(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _on_signal(sig: signal.Signals, received: list[signal.Signals], stop: asyncio.Event) -> None:
    received.append(sig)
    stop.set()
