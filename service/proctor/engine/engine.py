"""The engine: one thread runs the decode loop; callers submit and abort from any thread.

Continuous batching, one forward a step (engine/step.py): **schedule** (engine/scheduler.py: a plan, as data, of
who leaves, who joins, what each row is fed within the step's token budget) → **apply** it → **execute**
(engine/batch.py: one forward over every feed, prompt pieces, decode rows and drafts together, on the executor:
executor/protocol.py) → **update** (process, sample, verify and commit each row's tokens, set its status, retire
the finished). Requests join at any step boundary
and leave the step they finish (or are cancelled / pass their deadline), freeing their KV-cache slot.
Events go to each request's sink from the engine thread; the sink must not block (the API hands
them to its event loop).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from proctor.config import Settings
from proctor.decoding.plugins import PluginContext, PluginRegistry
from proctor.domain import FinishReason, GenerationRequest, RequestValidationError, ShuttingDown, TokenEvent
from proctor.domain.output_budget import OutputLimits
from proctor.engine.attempts import FallbackAttempts
from proctor.engine.batch import DecodeBatch
from proctor.engine.beam import BeamSearches
from proctor.engine.closing import attach_closing
from proctor.engine.closing_facts import ClosingFactsCache
from proctor.engine.drafting import Drafter, DraftPolicy
from proctor.engine.executor_setup import build_executor, plan_for
from proctor.engine.live import LiveRequests
from proctor.engine.loaded_model import LoadedModel
from proctor.engine.prefix_cache import PrefixCache
from proctor.engine.preprocess import PreparedRequest, prepare_controls, prepare_request
from proctor.engine.scheduler import Scheduler
from proctor.engine.sequence import EventSink, SequenceState
from proctor.engine.status import RequestStatus
from proctor.engine.step import StepRunner
from proctor.engine.thought_markers import resolve_markers
from proctor.engine.thread_tuner import PinnedThreads, ThreadPolicy, thread_policy
from proctor.executor.plan import ExecutorPlan

if TYPE_CHECKING:
    from proctor.constraints.service import ConstraintService
    from proctor.observability.hooks import StepObserver

log = logging.getLogger("proctor.engine")
MAX_CONSECUTIVE_FAULTS = 3
IDLE_WAIT_S = 0.05


class Engine:
    def __init__(self, loaded: LoadedModel, settings: Settings,
                 on_health: Callable[[bool, str], None] | None = None,
                 constraints: ConstraintService | None = None, plugins: PluginRegistry | None = None,
                 server_forbidden: tuple[str, ...] = (), release_dense_weights: bool = False,
                 plan: ExecutorPlan | None = None) -> None:
        self.loaded = loaded
        self.settings = settings
        # made once, here beside the model and settings it is made of, or the one app.py checked at start-up
        self.plan = plan if plan is not None else plan_for(loaded, settings)
        self.constraints = constraints
        self.plugins = plugins if plugins is not None else PluginRegistry.load("")
        self.server_forbidden = server_forbidden
        self._plugin_context = PluginContext(loaded.tokenizer, loaded.vocab_size, frozenset(loaded.eos_token_ids))
        self._on_health = on_health
        rows = max(1, settings.max_batch_size)
        self.prefix_cache = PrefixCache(settings.prefix_cache_mb * 1024 * 1024,
                                        f"{loaded.weights_sha256}:{loaded.weights}:{loaded.dtype}:{loaded.device}",
                                        settings.prefill_chunk_tokens)
        self._batch = DecodeBatch(lambda: build_executor(loaded, self.plan, rows, release_dense_weights), rows,
                                  settings.kv_cache_mb * 1024 * 1024, settings.prefill_chunk_tokens, self.prefix_cache)
        self._drafter = Drafter(DraftPolicy.from_settings(settings), loaded.vocab_size)
        self._closing_facts = ClosingFactsCache(loaded.tokenizer, loaded.vocab_size)
        self.thought_markers = resolve_markers(settings.reasoning_parser, loaded.tokenizer)  # ValueError: a bad name
        self._scheduler = Scheduler(settings.max_waiting, settings.max_step_tokens,
                                    free_rows=self._batch.free_rows)
        self._eos = frozenset(loaded.eos_token_ids)
        self._pieces: dict[int, str] = {}  # per-token text for token details, filled on first use
        self._live = LiveRequests()  # every request held, by id (engine/live.py)
        self._beams = BeamSearches(loaded, rows, self.plan)  # waiting beam requests; the step plan hands them over
        self._stepper = StepRunner(loaded.vocab_size, self._scheduler, self._batch, self._drafter, self._beams,
                                   self._live)
        self._wake = threading.Event()
        self._accepting = True
        self._stop = False
        self._faults = 0
        self.steps = 0  # decode steps run (tests and diagnostics: "within one step")
        self._threads: ThreadPolicy = PinnedThreads(0, lambda _: None)  # set on the engine thread
        self.observer: StepObserver | None = None  # metrics (observability/hooks.py); None: nothing recorded
        self.healthy = True
        self._thread = threading.Thread(target=self._run, name="proctor-engine", daemon=True)

    # --- public API (any thread) ------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """Render and tokenize the input, build the masks, compile the constraint (off the decode thread).

        ``request`` was checked (api/check_request.py, token ids against this vocabulary included); what only
        this stage can tell (the input's length in tokens, a schema that does not compile) raises
        RequestValidationError naming the field."""
        prepared = prepare_request(
            self.loaded.tokenizer, request, context_length=self.loaded.context_length,
            limits=OutputLimits(self.settings.default_max_new_tokens, self.settings.max_new_tokens_limit),
            markers=self.thought_markers)
        controls = prepare_controls(request, tokenizer=self.loaded.tokenizer, vocab_size=self.loaded.vocab_size,
                                    server_forbidden=self.server_forbidden, plugins=self.plugins,
                                    context=self._plugin_context)
        prepared = dataclasses.replace(prepared, controls=controls)
        if request.constraint is None:
            return prepared
        if self.constraints is None:
            raise RequestValidationError.single(request.constraint.field, "this server has constraints disabled")
        return attach_closing(dataclasses.replace(prepared, constraint=self.constraints.prepare(request.constraint)),
                             self._closing_facts)

    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        """Around a call's prepare and submit: Overloaded at once when the queue is already spoken for."""
        if not self._accepting:
            raise ShuttingDown("the server is shutting down")
        self._scheduler.reserve()
        try:
            yield
        finally:
            self._scheduler.unreserve()

    def submit(self, prepared: PreparedRequest, sink: EventSink) -> int:
        """Queue a prepared request; return the seed its generator uses. Raises Overloaded/ShuttingDown.

        A request on the validated fallback (a constraint that is not exact) runs as attempts
        (``engine/attempts.py``): validated, retried within ``fallback_attempts``, released whole.
        """
        if not self._accepting:
            raise ShuttingDown("the server is shutting down")
        request = prepared.request
        seed = request.sampling.seed if request.sampling.seed is not None else secrets.randbits(63)
        constraint = prepared.constraint
        if request.sampling.num_beams > 1 and constraint is not None and not constraint.exact:
            raise RequestValidationError.single("sampling.num_beams", "beam search needs a constraint the mask "
                                                "enforces exactly (this schema is on the validated fallback)")
        if constraint is not None and not constraint.exact:
            request_id = request.request_id
            attempts = FallbackAttempts(prepared, seed, sink, most_attempts=self.settings.fallback_attempts,
                                        retry_temperature=self.settings.fallback_temperature, start=self._start,
                                        on_done=lambda: self._live.forget_attempts(request_id))
            self._live.add_attempts(request_id, attempts)
            try:
                attempts.begin()
            except Exception:
                self._live.forget_attempts(request_id)
                raise
        else:
            self._start(prepared, seed, sink, None)
        return seed

    def _start(self, prepared: PreparedRequest, seed: int, sink: EventSink, created: float | None) -> None:
        """Build the request's state and queue it (``created``: when an earlier attempt began)."""
        request = prepared.request

        def deliver(event: TokenEvent) -> None:
            # Forget a request before its final event goes out, so the caller may reuse its id at once.
            if event.finished:
                self._forget(state)
            sink(event)

        state = SequenceState(prepared, tokenizer=self.loaded.tokenizer, eos_token_ids=self._eos, pieces=self._pieces,
                              vocab_size=self.loaded.vocab_size, device=self.loaded.device, seed=seed,
                              sink=deliver)
        if created is not None:
            state.created = created
        search = self._beams.create(state) if request.sampling.num_beams > 1 else None
        self._live.add_state(state)
        if search is not None:  # it waits in the queue like any request, then joins the batch with a row a beam
            self._beams.hold(search)
        try:
            self._scheduler.enqueue(state)
        except Exception:
            self._live.forget_state(state)
            if search is not None:
                self._beams.drop(state)
            raise
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Cancel a request; it ends with CANCELLED within one step and its cache slot is freed."""
        if self._live.abort(request_id):
            self._wake.set()

    def state_of(self, request_id: str) -> SequenceState | None:
        """The live state of a request (its ``status`` says where it is); None once its final event went out."""
        return self._live.get(request_id)

    def active_count(self) -> int:
        return self._live.counts()[0]

    def admission_counts(self) -> dict[str, int]:
        """What admission holds for calls, by holder: all zero once every call has ended (``live``: request ids)."""
        live, fallbacks = self._live.counts()
        states = list(self._batch.states)
        prefilling = sum(state.status is RequestStatus.PREFILLING for state in states)
        return {"reserved": self._scheduler.reserved_count(), "waiting": self._scheduler.waiting_count(),
                "staged": prefilling, "running": len(states) - prefilling,
                "beams": self._beams.waiting() + len(self._batch.searches), "fallbacks": fallbacks, "live": live}

    def progress(self) -> tuple[bool, int]:
        """(work a step would advance is pending, steps run so far): the watchdog's view (any thread)."""
        counts = self.admission_counts()
        pending = any(counts[holder] for holder in ("waiting", "staged", "running", "beams"))
        return pending and not self._stop, self.steps

    def occupancy(self) -> dict[str, int]:
        """Waiting and running requests, KV-cache bytes, and once the executor is built the prefix cache's chunk
        and chunk count (``block_size``, ``num_blocks``): a snapshot, for the metrics scrape."""
        state = {"waiting": self._scheduler.waiting_count(), "running": len(self._batch),
                 "kv_used_bytes": self._batch.held_bytes(), "kv_total_bytes": self._batch.kv_capacity_bytes}
        blocks = self._batch.prefix_blocks()
        if blocks is not None:
            state["block_size"], state["num_blocks"] = blocks
        return state

    def fewer_steps(self) -> dict[str, int]:
        """Totals of the prefix cache and the drafts since start (a snapshot, for the metrics scrape)."""
        return {**dataclasses.asdict(self.prefix_cache.counts),
                "drafted": self._drafter.drafted, "accepted": self._drafter.accepted}

    def shutdown(self, grace_s: float) -> None:
        """Stop accepting, let running requests finish within ``grace_s``, cancel the rest, join."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while self.active_count() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._live.abort_all()
        self._stop = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def generate_blocking(self, request: GenerationRequest, timeout_s: float = 600) -> list[TokenEvent]:
        """Run one request to completion and return its events (warm-up, benchmarks, tests)."""
        events: list[TokenEvent] = []
        done = threading.Event()

        def sink(event: TokenEvent) -> None:
            events.append(event)
            if event.finished:
                done.set()

        self.submit(self.prepare(request), sink)
        if not done.wait(timeout_s):
            self.abort(request.request_id)
            raise TimeoutError(f"request {request.request_id} did not finish in {timeout_s} s")
        return events

    # --- the loop (engine thread) -------------------------------------------------------------
    def _run(self) -> None:
        # Set the intra-op thread count again from this thread: without it, torch run from a
        # second thread was measured 1.5x slower on the 2-core machine (its OpenMP team is not set
        # up like the main thread's). Then tune it under load unless pinned (engine/thread_tuner.py).
        self._threads = thread_policy(self.settings.threads, torch.set_num_threads, self._batch.thread_invariant)
        # Logits from the model are inference tensors; the pipeline edits them in place, so the
        # whole loop runs in inference mode (also the cheapest autograd setting).
        with torch.inference_mode():
            self._run_loop()

    def _run_loop(self) -> None:
        while True:
            if self._stop and not self._batch.states and not self._batch.searches:
                self._stepper.fail_waiting(FinishReason.CANCELLED, "the server shut down before this request ran")
                return
            try:
                worked = self._step()
                if worked:
                    self._set_healthy(True, "a step succeeded")
            except Exception as exc:  # an engine fault must not take the server down silently
                log.exception("engine step failed")
                self._stepper.fail_running(f"engine fault: {type(exc).__name__}: {exc}")
                self._faults += 1
                if self._faults >= MAX_CONSECUTIVE_FAULTS:
                    self._set_healthy(False, f"{self._faults} consecutive engine faults, last: {exc}")
                    # A fault before any row runs (the executor cannot be built) would hold the waiting requests
                    # forever: they end with the fault too, and the loop waits before it tries again.
                    fault = f"engine fault: {type(exc).__name__}: {exc}"
                    self._stepper.fail_waiting(FinishReason.ERROR, fault, error=fault)
                    self._wake.wait(IDLE_WAIT_S)
                    self._wake.clear()
                worked = True
            if not worked:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()

    def _set_healthy(self, healthy: bool, reason: str) -> None:
        """Report health changes: NOT_SERVING after repeated faults, SERVING again once a step succeeds."""
        if healthy:
            self._faults = 0
        if healthy != self.healthy:
            self.healthy = healthy
            log.log(logging.INFO if healthy else logging.ERROR, "engine %s: %s",
                    "healthy again" if healthy else "unhealthy", reason)
            if self._on_health:
                self._on_health(healthy, reason)

    def _step(self) -> bool:
        """One engine step (engine/step.py); False when idle."""
        worked = self._stepper.step(admit=not self._stop, threads=self._threads, observer=self.observer)
        self.steps += worked
        return worked

    def _forget(self, state: SequenceState) -> None:
        self._live.forget_state(state)
