"""Compiling constraints for requests: engine choice (AUTO + fallback), cache, limits, isolation.

``compile`` runs on the caller's thread (the API's worker thread), never on the decode thread.
With ``isolate`` on (the default) the engine library runs in a worker process under the time
limit and the result is loaded here; with it off (tests with a tiny model) it runs in-process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from proctor.config import Settings
from proctor.constraints.auto import FALLBACK, backend_order, policy_key
from proctor.constraints.backend import Backend, CompiledConstraint
from proctor.constraints.cache import CacheEntry, CompiledCache, cache_key
from proctor.constraints.engines import AUTO, BACKEND_NAMES
from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema import relax
from proctor.constraints.key_memory import keyed
from proctor.constraints.spec import ConstraintKind, ConstraintSpec
from proctor.constraints.worker import WorkerConfig
from proctor.constraints.worker_pool import STUCK_PREFIXES, WorkerPool
from proctor.observability.calls import COMPILE, stage

log = logging.getLogger("proctor.constraints")
WARM_UP_JOIN_S = 30.0  # close() waits this long at most for a warm-up still building tables
WARM_UP_NICENESS = 10  # a background warm-up thread's niceness: the engine's threads come first

if TYPE_CHECKING:
    from proctor.observability.hooks import CompileObserver


@dataclass(frozen=True, slots=True)
class CompileLimits:
    """A server passes its settings' values (app.py); the defaults are Settings' own, their one home."""

    timeout_s: float = Settings.constraint_timeout_s
    max_spec_bytes: int = Settings.max_constraint_bytes  # checked by ConstraintService.to_spec, before parsing


@dataclass(frozen=True, slots=True)
class CompileResult:
    """``exact``: the mask enforces the whole constraint; else it enforces the superset that
    ``relaxed`` (keyword at pointer) describes, and the output must be validated (and retried)."""

    compiled: CompiledConstraint
    backend: str
    cache_hit: bool
    compile_ms: float
    exact: bool = True
    relaxed: tuple[str, ...] = ()


class ConstraintCompiler:
    def __init__(self, *, tokenizer: Any, model_path: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 tokenizer_fingerprint: str, limits: CompileLimits | None = None, isolate: bool = True,
                 workers: int = 1, cache: CompiledCache | None = None) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = eos_token_ids
        self._fingerprint = tokenizer_fingerprint
        self.limits = limits or CompileLimits()
        self.cache = cache or CompiledCache()
        self._backends: dict[str, Backend] = {}
        self._backend_lock = threading.Lock()
        self._pool = WorkerPool(WorkerConfig(model_path, vocab_size, eos_token_ids), workers) if isolate else None
        self.observer: CompileObserver | None = None  # metrics: compile time and failures by engine
        self._warming: threading.Thread | None = None  # prewarm(background=True)
        self._closing = False

    def prewarm(self, then: Callable[[], None] | None = None, *, background: bool = False) -> None:
        """Build the in-process engine tables and start the compile workers (server start-up), the workers
        starting while the tables are built; then ``then``. With ``background`` on a thread of its own, off the
        server's ready path: a compile asked for meanwhile waits for the tables and workers it needs."""
        started = self._pool.start_workers() if self._pool is not None else []

        def warm() -> None:
            if background:
                _lower_this_threads_priority()
            for name in BACKEND_NAMES:
                try:
                    self._backend(name)
                except Exception:  # an engine that cannot load is skipped by AUTO at compile time
                    continue
            if self._pool is not None:
                self._pool.adopt(started)
            if then is not None:
                then()

        if not background:
            warm()
            return

        def logged() -> None:
            try:
                warm()
            except Exception:
                if not self._closing:
                    log.exception("warming the constraint engines failed; compiles start their own workers")

        self._warming = threading.Thread(target=logged, name="proctor-constraints-warm", daemon=True)
        self._warming.start()

    def close(self) -> None:
        """Stop the workers; a warm-up still running (a server stopped as it started) ends first, so no thread
        of it outlives the server."""
        self._closing = True
        if self._pool is not None:
            self._pool.close()
        if self._warming is not None:
            self._warming.join(WARM_UP_JOIN_S)
        if self._pool is not None:
            self._pool.close()  # what the warm-up adopted meanwhile

    def _backend(self, name: str) -> Backend:
        with self._backend_lock:
            if name not in self._backends:
                from proctor.constraints.backends import create_backend

                self._backends[name] = create_backend(name, self._tokenizer, self._vocab_size, self._eos)
            return self._backends[name]

    def compile(self, spec: ConstraintSpec, backend: str = AUTO, *, exact_only: bool = False) -> CompileResult:
        """Compile with the named engine, or with AUTO's order falling back on refusal.

        A JSON schema that no engine enforces exactly goes to the validated fallback (the relaxed
        superset, compiled by ``FALLBACK``'s engine or the one named) unless ``exact_only``.
        """
        order = backend_order(spec) if backend == AUTO else (backend,)
        reasons = []
        for name in order:
            try:
                return self._compile_with(name, spec)
            except ConstraintError as exc:
                reasons.append(f"{name}: {exc.reason}")
        fallback = FALLBACK.get(policy_key(spec)) if backend == AUTO else backend
        # An engine that ran out of time (or crashed) on the schema would do so again on its superset.
        stuck = any(r.startswith(f"{fallback}: {prefix}") for r in reasons for prefix in STUCK_PREFIXES)
        if spec.kind is ConstraintKind.JSON_SCHEMA and fallback and not exact_only and not stuck:
            try:
                return self._compile_relaxed(fallback, spec)
            except ConstraintError as exc:
                reasons.append(f"validated fallback ({fallback}): {exc.reason}")
        if len(reasons) == 1:
            raise ConstraintError(reasons[0])
        raise ConstraintError("no constraint engine accepted it — " + "; ".join(reasons))

    def _compile_relaxed(self, name: str, spec: ConstraintSpec) -> CompileResult:
        """The relaxed superset of a JSON schema, compiled by ``name`` (cached like any spec)."""
        result, relaxed = compile_relaxed(spec, name, lambda relaxed_spec: self._compile_with(name, relaxed_spec))
        return dataclasses.replace(result, exact=False, relaxed=relaxed)

    def _compile_with(self, name: str, spec: ConstraintSpec) -> CompileResult:
        with stage(COMPILE) as attributes:  # a span when tracing
            attributes.update({"proctor.constraint.engine": name, "proctor.constraint.kind": spec.kind.value})
            key = cache_key(name, spec, self._fingerprint)
            entry = self.cache.get(key)
            attributes["proctor.constraint.cache_hit"] = entry is not None
            if entry is not None:
                if entry.error is not None:
                    raise entry.error
                assert entry.compiled is not None
                return CompileResult(entry.compiled, name, True, entry.compile_ms)
            start = time.perf_counter()
            try:
                compiled = self._remembering(self._compile_fresh(name, spec))
            except ConstraintError as exc:
                error = ConstraintError(exc.reason, name)
                seconds = time.perf_counter() - start
                self.cache.put(key, CacheEntry(None, error, seconds * 1000, len(spec.text)))
                if self.observer is not None:
                    self.observer.compiled(name, seconds, False)
                raise error from None
            seconds = time.perf_counter() - start
            self.cache.put(key, CacheEntry(compiled, None, seconds * 1000, compiled.memory_bytes()))
            if self.observer is not None:
                self.observer.compiled(name, seconds, True)
            return CompileResult(compiled, name, False, seconds * 1000)

    def _remembering(self, compiled: CompiledConstraint) -> CompiledConstraint:
        """A JSON schema's matchers under the key memory (constraints/key_memory/: no object takes a key twice), which
        the soundness guard counts on; cached so, its rows share the memory's answers."""
        return keyed(compiled, self._tokenizer, self._vocab_size) if self._tokenizer is not None else compiled

    def _compile_fresh(self, name: str, spec: ConstraintSpec) -> CompiledConstraint:
        if self._pool is None:
            return self._backend(name).compile(spec)
        data, _ = self._pool.compile(name, spec, self.limits.timeout_s)
        return self._backend(name).load(spec, data)

    def stats(self) -> dict[str, int]:
        stats = self.cache.stats()
        stats["worker_restarts"] = self._pool.restarts if self._pool is not None else 0
        return stats


T = TypeVar("T")


def compile_relaxed(spec: ConstraintSpec, engine: str, compile_one: Callable[[ConstraintSpec], T]
                    ) -> tuple[T, tuple[str, ...]]:
    """Compile the relaxed superset with ``compile_one``; when the engine refuses it, the coarse one
    (``COARSE`` of constraints/json_schema/relaxed.py dropped too). Returns the compile result and what was relaxed."""
    fine_spec, fine = _relaxed(spec, engine, False)
    try:
        return compile_one(fine_spec), fine
    except ConstraintError as exc:
        coarse_spec, coarse = _relaxed(spec, engine, True)
        if coarse_spec == fine_spec or exc.reason.startswith(STUCK_PREFIXES):
            raise
        return compile_one(coarse_spec), coarse


@functools.lru_cache(maxsize=256)
def _relaxed(spec: ConstraintSpec, engine: str, coarse: bool) -> tuple[ConstraintSpec, tuple[str, ...]]:
    """The relaxed spec and what was relaxed (``keyword at pointer``); cached per spec and engine."""
    try:
        result = relax(spec.schema, engine, coarse=coarse)
    except RecursionError as exc:
        raise ConstraintError("the schema nests too deeply to analyse (max_schema_depth)", engine) from exc
    relaxed_spec = ConstraintSpec.json_schema(result.schema, spec.flexible_whitespace)
    return relaxed_spec, tuple(f"{kw} at {path}" for path, kw in result.relaxed)


def _lower_this_threads_priority() -> None:
    """A warm-up thread yields the cores to the engine (Linux: niceness is per thread): served requests
    that arrive while it builds the tables are not slowed by it. Best effort: nowhere else to go if refused."""
    with contextlib.suppress(OSError, AttributeError):
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, max(os.getpriority(os.PRIO_PROCESS, thread), WARM_UP_NICENESS))
