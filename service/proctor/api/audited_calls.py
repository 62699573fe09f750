"""One audited call through the engine: admit → prepare (and screen) → submit → collect → moderate → audit.

Every servicer that generates runs its calls here: Generate and StreamGenerate (api/servicer.py), the n
sampled completions (api/samples.py), contract drafts (api/contracts_servicer.py) and replays
(api/audit_servicer.py). It never imports torch: the engine is seen through ``GenerationEngine``.

Input screens and output moderators run here, once per call, in a worker thread (never per decode step):
screens right after ``prepare`` (a block answers the call with the screen's reply and nothing is
submitted), moderators on the final output before the audit record is committed (a block replaces the
output with the moderator's reply). The call's events (and so the audit record's ``output`` and
``tokens``) stay the model's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Generic, Protocol, TypeVar

from proctor.api.audit_trail import AuditStoreUnavailable, AuditTrail, AuditWriteFailed
from proctor.api.call_info import GONE, CallInfo
from proctor.api.caller_limits import output_limits
from proctor.api.loop_relay import LoopRelay
from proctor.audit.records import CallRecord, subject_of
from proctor.config import Settings
from proctor.decoding.plugins.api import ModerationInput, ScreenInput
from proctor.decoding.plugins.moderation import (
    ModerationFault,
    ModerationPlugin,
    Outcome,
    moderate_output,
    screen_input,
)
from proctor.domain import (
    DeadlineExceeded,
    EngineFault,
    FinishReason,
    GenerationRequest,
    Overloaded,
    PluginInfo,
    RequestValidationError,
    ShuttingDown,
    TokenEvent,
)
from proctor.domain.events import Usage
from proctor.domain.output_budget import budgeted
from proctor.observability.calls import PREPARE, stage

DEADLINE_MESSAGE = "the call's deadline passed during generation"
EventSink = Callable[[TokenEvent], None]
BeforeCommit = Callable[[CallRecord, list[TokenEvent]], None]


class CallPlugins(Protocol):
    """The per-call plugins the API runs itself (screens and moderators) and every plugin reported."""

    @property
    def screens(self) -> tuple[ModerationPlugin, ...]: ...
    @property
    def moderators(self) -> tuple[ModerationPlugin, ...]: ...
    @property
    def plugins(self) -> tuple[PluginInfo, ...]: ...


class PreparedView(Protocol):
    """What the API reads from a prepared request (for the audit record and the screens)."""

    @property
    def rendered_prompt(self) -> str: ...
    @property
    def prompt_ids(self) -> tuple[int, ...]: ...
    @property
    def controls(self) -> CallPlugins: ...


P = TypeVar("P", bound=PreparedView)


class GenerationEngine(Protocol[P]):
    """What the API needs from the engine (abstract, so api/ never imports torch); ``P``: its prepared request."""

    def admission(self) -> contextlib.AbstractContextManager[None]: ...
    def prepare(self, request: GenerationRequest) -> P: ...
    def submit(self, prepared: P, sink: EventSink) -> int: ...
    def abort(self, request_id: str) -> None: ...


def with_receipt(events: list[TokenEvent], call: CallRecord) -> list[TokenEvent]:
    """The answered events, the final one carrying the record's receipt (when the log gave one)."""
    if not call.receipt:
        return events
    return [*events[:-1], dataclasses.replace(events[-1], receipt=call.receipt)]


class AuditedCalls(Generic[P]):
    """Runs calls once ``attach`` gave it a started engine; before that every call is UNAVAILABLE."""

    def __init__(self, settings: Settings, audit: AuditTrail) -> None:
        self.settings = settings
        self.audit = audit
        self.engine_or_none: GenerationEngine[P] | None = None
        self._relays: dict[asyncio.AbstractEventLoop, LoopRelay] = {}

    @property
    def engine(self) -> GenerationEngine[P]:
        if self.engine_or_none is None:
            raise ShuttingDown("the model is still loading; retry shortly")
        return self.engine_or_none

    def admit(self, request: GenerationRequest, call: CallRecord, info: CallInfo) -> GenerationRequest:
        """A checked request as this call runs it: with the audit's settings, its subject (records.subject_of: what
        its record is sealed under, and what an erasure drops from the prefix cache) and the prefix cache's namespace
        (the caller's own; none when the request, the caller's entry or, by default, an ``hmac`` prompt policy
        keeps prompts out of the cache), kept on the call's record."""
        caller = info.caller
        allowed = caller.prompt_cache if caller is not None and caller.prompt_cache is not None \
            else self.settings.audit_prompt_policy == "full"  # prompts kept out of the audit: out of the cache too
        keep = request.cache_prompt and allowed
        request = dataclasses.replace(request, prefix_cache_scope=(caller.name if caller is not None else "")
                                      if keep else None, subject_id=subject_of(request, call.caller))
        if self.audit.enabled:
            request = dataclasses.replace(request, audited=True, audit_top_n=self.audit.top_n)
        call.request = request
        return request

    async def run_call(self, method: str, request: GenerationRequest, info: CallInfo,
                       before_commit: BeforeCommit | None = None, *, built_here: bool = False,
                       fields: Mapping[str, str] | None = None) -> tuple[list[TokenEvent], str]:
        """Run a request as one audited call of ``method``: ``before_commit`` adds to the record what only the
        calling service knows. ``built_here``: a request the server built itself (a contract attempt), which
        check_request never saw, so the caller's token cap is applied here; ``fields``: its fields' names as
        the caller set them, for a refusal. Returns the events the caller gets and the audit id; a failure is
        recorded and raised as the domain error its door answers (api/failures.py)."""
        return await self.run(self.audit.begin(method, info), request, info, before_commit,
                              built_here=built_here, fields=fields)

    async def run(self, call: CallRecord, request: GenerationRequest, info: CallInfo,
                  before_commit: BeforeCommit | None = None, *, built_here: bool = False,
                  fields: Mapping[str, str] | None = None) -> tuple[list[TokenEvent], str]:
        """``run_call`` for a call whose record was begun already."""
        try:
            if built_here:
                request = budgeted(request, output_limits(self.settings, info.caller))
            request = self.admit(request, call, info)
            events = await self.collect(request, call)
            self.final_status(events[-1], call)
            released = await self.moderated(call, events)
            if before_commit is not None:
                before_commit(call, released)
            await self.audit.commit(call, answered="".join(event.text for event in released))
        except BaseException as exc:
            renamed = exc.renamed(fields) if fields and isinstance(exc, RequestValidationError) else exc
            raise await self.fail(call, renamed)  # noqa: B904 (exc itself, or the record's failure)
        self.check_deadline(events[-1])
        return with_receipt(released, call), call.audit_id

    async def _start(self, request: GenerationRequest, call: CallRecord) -> asyncio.Queue[TokenEvent]:
        engine = self.engine
        self.audit.check_available()
        with engine.admission():  # a full queue refuses the call here, before any work on it
            with stage(PREPARE):  # its end is the submission: the engine's timings count from there
                try:
                    prepared, screening = await asyncio.to_thread(self._prepare_and_screen, engine, request)
                except ModerationFault as exc:
                    call.moderation = exc.verdicts
                    raise
            call.rendered_prompt, call.prompt_tokens = prepared.rendered_prompt, len(prepared.prompt_ids)
            call.moderators, call.moderation = prepared.controls.moderators, screening.verdicts
            queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
            if screening.blocked:  # nothing is generated: the call ends with the screen's reply
                call.moderation_reply = screening.reply
                queue.put_nowait(TokenEvent(
                    request.request_id, finish_reason=FinishReason.BLOCKED, finish_detail=screening.detail,
                    usage=Usage(len(prepared.prompt_ids), 0), seed=request.sampling.seed or 0,
                    plugins=prepared.controls.plugins))
                return queue
            relay = self._relay_for(asyncio.get_running_loop())
            engine.submit(prepared, lambda event: relay.send(queue.put_nowait, event))
        return queue

    @staticmethod
    def _prepare_and_screen(engine: GenerationEngine[P], request: GenerationRequest) -> tuple[P, Outcome]:
        """Prepare the request, then run its input screens on the rendered input (worker thread)."""
        prepared = engine.prepare(request)
        if not prepared.controls.screens:
            return prepared, Outcome()
        return prepared, screen_input(prepared.controls.screens, screened_input(request, prepared.rendered_prompt))

    async def moderated(self, call: CallRecord, events: list[TokenEvent]) -> list[TokenEvent]:
        """The events the caller gets: the screens' and moderators' verdicts on the final one, or one final
        event with the reply when the input was blocked or the output withheld (the call's own events and
        so the record's ``output`` stay the model's). Requests without screens or moderators pass as they are."""
        final = events[-1]
        if final.finish_reason is FinishReason.BLOCKED:
            return [dataclasses.replace(final, text=call.moderation_reply or "", moderation=call.moderation)]
        if call.moderators and final.finish_reason is not FinishReason.DEADLINE:
            assert call.request is not None
            moderation_input = ModerationInput("".join(e.text for e in events),
                                               screened_input(call.request, call.rendered_prompt or ""))
            try:
                outcome = await asyncio.to_thread(moderate_output, call.moderators, moderation_input, call.moderation)
            except ModerationFault as exc:
                call.moderation = exc.verdicts
                raise
            call.moderation = outcome.verdicts
            if outcome.blocked:
                call.moderation_reply, call.output_withheld = outcome.reply, True
                return [dataclasses.replace(final, token_ids=(), text=outcome.reply, details=(),
                                            finish_reason=FinishReason.MODERATED, finish_detail=outcome.detail,
                                            moderation=outcome.verdicts)]
        if not call.moderation:
            return events
        return [*events[:-1], dataclasses.replace(final, moderation=call.moderation)]

    def _relay_for(self, loop: asyncio.AbstractEventLoop) -> LoopRelay:
        relay = self._relays.get(loop)
        if relay is None:
            relay = self._relays[loop] = LoopRelay(loop)
        return relay

    async def collect(self, request: GenerationRequest, call: CallRecord) -> list[TokenEvent]:
        """All the request's events (``events`` closed on every path: a cancel aborts the engine request now)."""
        async with contextlib.aclosing(self.events(request, call)) as events:
            return [event async for event in events]

    async def events(self, request: GenerationRequest, call: CallRecord) -> AsyncGenerator[TokenEvent, None]:
        """The request's events until the final one (also kept on ``call``); aborts it if the call goes away.
        Iterate it under ``contextlib.aclosing``, so the abort runs when the call ends, not when it is collected."""
        queue = await self._start(request, call)
        finished = False
        try:
            while True:
                event = await queue.get()
                call.events.append(event)
                if event.error is not None:
                    raise EngineFault(event.error)
                yield event
                if event.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.engine.abort(request.request_id)

    async def record_gone(self, call: CallRecord) -> None:
        """Record a call whose caller went away (cancelled, deadline, stream closed), without waiting for it."""
        self.audit.status_from(call, asyncio.CancelledError())
        with contextlib.suppress(AuditWriteFailed):
            await self.audit.commit(call, wait=False)

    async def fail(self, call: CallRecord, exc: BaseException) -> BaseException:
        """Record the failed call (once) and return what its door answers: ``exc``, or the failure to write its
        record. A cancel is only recorded."""
        if isinstance(exc, GONE):
            await self.record_gone(call)
            return exc
        self.audit.status_from(call, exc)
        if isinstance(exc, AuditWriteFailed):
            return exc
        try:
            # Compliance mode waits for a failed call's record too, except where waiting defeats the answer:
            # load shedding (a refusal must stay cheap under overload: it is submitted, and lands within the
            # writer's next batch) and a store that is down. (A cancel never waits: record_gone.)
            unwaited = isinstance(exc, Overloaded | AuditStoreUnavailable)
            await self.audit.commit(call, wait=False if unwaited else None)
        except AuditWriteFailed as audit_exc:
            return audit_exc
        return exc

    @staticmethod
    def final_status(event: TokenEvent, call: CallRecord) -> None:
        if event.finish_reason is FinishReason.DEADLINE:
            call.status_code, call.status_message = "DEADLINE_EXCEEDED", DEADLINE_MESSAGE

    @staticmethod
    def check_deadline(event: TokenEvent) -> None:
        """A request that ran out of time ends with DeadlineExceeded (after its record), as gRPC callers expect."""
        if event.finish_reason is FinishReason.DEADLINE:
            raise DeadlineExceeded(DEADLINE_MESSAGE)


def screened_input(request: GenerationRequest, rendered: str) -> ScreenInput:
    """What the screens and moderators read of the input: the rendered prompt and the chat messages."""
    messages = None if request.messages is None else tuple((m.role, m.content) for m in request.messages)
    return ScreenInput(rendered, messages)

