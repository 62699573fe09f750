"""The Generation servicer: validate and convert, hand over to the engine, stream events back.

It never imports torch and never lets a protobuf type past ``convert.py``. The engine runs on its
own thread; its events come back through a ``LoopRelay`` (one loop wake-up per burst) into an asyncio queue.

Input screens and output moderators run here, once per call, in a worker thread (never per decode
step): screens right after ``prepare`` (a block answers the call with the screen's reply and nothing
is submitted), moderators on the final output before the audit record is committed (a block
replaces the output with the moderator's reply). A stream with moderators is held back until then.
The call's events (and so the audit record's ``output`` and ``tokens``) stay the model's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc

from proctor import __version__
from proctor.api.audit_trail import MODEL_FIELDS, AuditStoreUnavailable, AuditTrail, AuditWriteFailed
from proctor.api.caller_limits import capped_request
from proctor.api.convert import chunk_from_event, default_plugin_calls, request_from_proto, response_from_events
from proctor.api.errors import abort_code, abort_with
from proctor.api.gate import current_identity
from proctor.api.loop_relay import LoopRelay
from proctor.api.samples import sample_events, wants_samples
from proctor.api.size_limits import bounded_dict
from proctor.audit.records import CallRecord, PrivacyPolicy
from proctor.config import Settings
from proctor.decoding.plugins.api import ModerationInput, PluginContext, ScreenInput
from proctor.decoding.plugins.moderation import (
    ModerationFault,
    ModerationPlugin,
    Outcome,
    moderate_output,
    screen_input,
)
from proctor.domain import (
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
from proctor.observability.calls import PREPARE, VALIDATE, stage
from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc as pb_grpc

log = logging.getLogger("proctor.api")
EXPECTED = (RequestValidationError, Overloaded, ShuttingDown, EngineFault)
# The caller went away: a cancel (client, deadline) or the closing of a stream at a yield. Recorded, never answered.
GONE = (asyncio.CancelledError, GeneratorExit)
DEADLINE_MESSAGE = "the call's deadline passed during generation"


class GenerationEngine(Protocol):
    """What the API needs from the engine (kept abstract so api/ never imports torch)."""

    def admission(self) -> contextlib.AbstractContextManager[None]: ...
    def prepare(self, request: GenerationRequest) -> object: ...
    def submit(self, prepared: object, sink: object) -> int: ...
    def abort(self, request_id: str) -> None: ...


class RegisteredSchemaView(Protocol):
    """A registered schema as ListSchemas shows it."""

    name: str
    version: str
    description: str
    schema_json: str


class MasksView(Protocol):
    """The per-call plugins the API runs itself (screens and moderators) and the plugins reported."""

    screens: tuple[ModerationPlugin, ...]
    moderators: tuple[ModerationPlugin, ...]
    plugins: tuple[PluginInfo, ...]


class PreparedView(Protocol):
    """What the API reads from a prepared request (for the audit record and the screens)."""

    rendered_prompt: str
    prompt_ids: tuple[int, ...]
    masks: MasksView


class GenerationServicer(pb_grpc.GenerationServicer):
    """Serves once ``attach`` gave it a started engine; before that every call is UNAVAILABLE."""

    def __init__(self, settings: Settings, audit: AuditTrail | None = None) -> None:
        self._settings = settings
        self._engine_or_none: GenerationEngine | None = None
        self._model_info: dict[str, object] = {}
        self._schemas: list[RegisteredSchemaView] = []
        self.audit = audit or AuditTrail(None, PrivacyPolicy(), compliance=False, top_n=0)
        self._relays: dict[asyncio.AbstractEventLoop, LoopRelay] = {}

    def attach(self, engine: GenerationEngine, model_info: dict[str, object],
               schemas: list[RegisteredSchemaView] | None = None) -> None:
        self._engine_or_none = engine
        self._model_info = model_info
        self._schemas = list(schemas or [])
        self.audit.model = {k: model_info.get(k) for k in MODEL_FIELDS}
        self._check_default_moderation(engine)

    def _check_default_moderation(self, engine: object) -> None:
        """The server's own screens and moderators must exist and take their params: else the start fails
        (ValueError), rather than every request failing. Engines without a plugin registry (tests) skip it."""
        registry, loaded = getattr(engine, "plugins", None), getattr(engine, "loaded", None)
        if registry is None or loaded is None:
            return
        context = PluginContext(loaded.tokenizer, loaded.vocab_size, frozenset(loaded.eos_token_ids))
        for field, kind in (("input_screens", "input_screen"), ("output_moderators", "output_moderator")):
            try:
                registry.instantiate(default_plugin_calls(self._settings, field), kind, context)
            except RequestValidationError as exc:
                raise ValueError(f"--{field.replace('_', '-')}: {exc}") from exc

    @property
    def _engine(self) -> GenerationEngine:
        if self._engine_or_none is None:
            raise ShuttingDown("the model is still loading; retry shortly")
        return self._engine_or_none

    def _convert(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext,
                 call: CallRecord) -> GenerationRequest:
        try:
            with stage(VALIDATE):
                request = request_from_proto(message, self._settings, context.time_remaining())
            return self.admit_request(request, call)
        except Exception:
            call.raw_request = bounded_dict(message)
            raise

    def max_new_tokens_limit(self) -> int:
        return self._settings.max_new_tokens_limit

    async def _converted(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext,
                         call: CallRecord) -> GenerationRequest:
        """The converted request; a bad one is recorded on ``call`` and the RPC aborted."""
        try:
            return self._convert(message, context, call)
        except BaseException as exc:
            await self._fail(call, exc, context)
            raise

    def admit_request(self, request: GenerationRequest, call: CallRecord) -> GenerationRequest:
        """A converted request as this call runs it: the caller's token cap, the audit's settings."""
        identity = current_identity()
        if identity is not None:
            request = capped_request(request, identity.caller, self._settings.default_max_new_tokens)
        if self.audit.enabled:
            request = dataclasses.replace(request, audited=True, audit_top_n=self.audit.top_n)
        call.request = request
        return request

    async def run_call(self, method: str, request: GenerationRequest, context: grpc.aio.ServicerContext,
                       before_commit: Callable[[CallRecord, list[TokenEvent]], None]) -> tuple[list[TokenEvent], str]:
        """Run an already converted request as one audited call of ``method`` (another service's attempt):
        ``before_commit`` adds to the record what only that service knows. Returns the events and audit id."""
        call = self.audit.begin(method, context)
        try:
            request = self.admit_request(request, call)
            events = await self.collect(request, call)
            self._final_status(events[-1], call)
            released = await self._moderated(call, events)
            before_commit(call, released)
            await self.audit.commit(call)
        except BaseException as exc:
            await self._fail(call, exc, context)
            raise
        await self._deadline_status(events[-1], context)
        return released, call.audit_id

    async def _start(self, request: GenerationRequest, call: CallRecord) -> asyncio.Queue[TokenEvent]:
        engine = self._engine
        self.audit.check_available()
        with engine.admission():  # a full queue refuses the call here, before any work on it
            with stage(PREPARE):  # its end is the submission: the engine's timings count from there
                try:
                    prepared, screening = await asyncio.to_thread(self._prepare_and_screen, engine, request)
                except ModerationFault as exc:
                    call.moderation = exc.verdicts
                    raise
            view: PreparedView = prepared  # type: ignore[assignment]
            call.rendered_prompt, call.prompt_tokens = view.rendered_prompt, len(view.prompt_ids)
            call.moderators, call.moderation = view.masks.moderators, screening.verdicts
            queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
            if screening.blocked:  # nothing is generated: the call ends with the screen's reply
                call.moderation_reply = screening.reply
                queue.put_nowait(TokenEvent(
                    request.request_id, finish_reason=FinishReason.BLOCKED, finish_detail=screening.detail,
                    usage=Usage(len(view.prompt_ids), 0), seed=request.sampling.seed or 0,
                    plugins=view.masks.plugins))
                return queue
            relay = self._relay_for(asyncio.get_running_loop())
            engine.submit(prepared, lambda event: relay.send(queue.put_nowait, event))
        return queue

    @staticmethod
    def _prepare_and_screen(engine: GenerationEngine, request: GenerationRequest) -> tuple[object, Outcome]:
        """Prepare the request, then run its input screens on the rendered input (worker thread)."""
        prepared = engine.prepare(request)
        view: PreparedView = prepared  # type: ignore[assignment]
        if not view.masks.screens:
            return prepared, Outcome()
        return prepared, screen_input(view.masks.screens, _screen_input(request, view.rendered_prompt))

    async def _moderated(self, call: CallRecord, events: list[TokenEvent]) -> list[TokenEvent]:
        """The events the caller gets: the screens' and moderators' verdicts on the final one, or one final
        event with the reply when the input was blocked or the output withheld (the call's own events and
        so the record's ``output`` stay the model's). Requests without screens or moderators pass as they are."""
        final = events[-1]
        if final.finish_reason is FinishReason.BLOCKED:
            return [dataclasses.replace(final, text=call.moderation_reply or "", moderation=call.moderation)]
        if call.moderators and final.finish_reason is not FinishReason.DEADLINE:
            assert call.request is not None
            moderation_input = ModerationInput("".join(e.text for e in events),
                                               _screen_input(call.request, call.rendered_prompt or ""))
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

    async def events(self, request: GenerationRequest, call: CallRecord) -> AsyncIterator[TokenEvent]:
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
                self._engine.abort(request.request_id)

    async def Generate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        call = self.audit.begin("Generate", context)
        request = await self._converted(message, context, call)
        if wants_samples(request):  # n completions, each its own audited call (api/samples.py)
            events, audit_id = await sample_events(self, "Generate", request, context)
            return response_from_events(events, request, audit_id)
        try:
            events = await self.collect(request, call)
            self._final_status(events[-1], call)
            released = await self._moderated(call, events)
            await self.audit.commit(call)
        except BaseException as exc:
            await self._fail(call, exc, context)
            raise
        await self._deadline_status(events[-1], context)
        return response_from_events(released, request, call.audit_id)

    async def StreamGenerate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[pb.GenerateChunk]:
        call = self.audit.begin("StreamGenerate", context)
        request = await self._converted(message, context, call)
        if wants_samples(request):  # n completions arrive whole at the end (api/samples.py)
            events, audit_id = await sample_events(self, "StreamGenerate", request, context)
            for event in events:
                if event.token_ids or event.text or event.finished:
                    yield chunk_from_event(event, request, audit_id)
            return
        try:
            held = bool(request.output_moderators)  # the output is released only once moderated
            async with contextlib.aclosing(self.events(request, call)) as events:
                async for event in events:
                    if not event.finished:
                        if not held and (event.token_ids or event.text):
                            yield chunk_from_event(event, request, call.audit_id)
                        continue
                    self._final_status(event, call)
                    released = await self._moderated(call, list(call.events))
                    await self.audit.commit(call)  # compliance: the final chunk waits for the record
                    await self._deadline_status(event, context)
                    for out in released if held else released[-1:]:
                        if out.token_ids or out.text or out.finished:
                            yield chunk_from_event(out, request, call.audit_id)
        except grpc.aio.AbortError:
            raise
        except GONE:  # the stream was cancelled or closed at a yield: record it; nobody is left to answer
            await self._record_gone(call)
            raise
        except BaseException as exc:
            await self._fail(call, exc, context)

    async def _record_gone(self, call: CallRecord) -> None:
        """Record a call whose caller went away (cancelled, deadline, stream closed), without waiting for it."""
        self.audit.status_from(call, asyncio.CancelledError())
        with contextlib.suppress(AuditWriteFailed):
            await self.audit.commit(call, wait=False)

    async def _fail(self, call: CallRecord, exc: BaseException, context: grpc.aio.ServicerContext) -> None:
        """Record the failed call (once) and abort with the mapped status; a cancel is only recorded."""
        if isinstance(exc, GONE):
            await self._record_gone(call)
            return
        if not isinstance(exc, grpc.aio.AbortError):
            self.audit.status_from(call, exc)
        if not isinstance(exc, AuditWriteFailed):
            try:
                # Compliance mode waits for a failed call's record too, except where waiting defeats the answer:
                # load shedding (a refusal must stay cheap under overload: it is submitted, and lands within the
                # writer's next batch) and a store that is down. (A cancel never waits: _record_gone.)
                unwaited = isinstance(exc, Overloaded | AuditStoreUnavailable)
                await self.audit.commit(call, wait=False if unwaited else None)
            except AuditWriteFailed as audit_exc:
                exc = audit_exc
        if isinstance(exc, grpc.aio.AbortError):
            return
        if not isinstance(exc, EXPECTED):
            log.error("call failed", exc_info=exc)
        await abort_with(context, exc)

    @staticmethod
    def _final_status(event: TokenEvent, call: CallRecord) -> None:
        if event.finish_reason is FinishReason.DEADLINE:
            call.status_code, call.status_message = "DEADLINE_EXCEEDED", DEADLINE_MESSAGE

    async def _deadline_status(self, event: TokenEvent, context: grpc.aio.ServicerContext) -> None:
        """A request that ran out of time ends with DEADLINE_EXCEEDED, as gRPC callers expect."""
        if event.finish_reason is FinishReason.DEADLINE:
            await abort_code(context, grpc.StatusCode.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        if self._engine_or_none is None:
            await abort_with(context, ShuttingDown("the model is still loading; retry shortly"))
        info = pb.ModelInfo(server_version=__version__,
                            max_new_tokens_limit=self._settings.max_new_tokens_limit,
                            default_max_new_tokens=self._settings.default_max_new_tokens)
        for key, value in self._model_info.items():
            if value is None:
                continue
            if key == "eos_token_ids":
                info.eos_token_ids.extend(value)  # type: ignore[arg-type]
            else:
                setattr(info, key, value)
        return info

    async def ListSchemas(self, request: pb.ListSchemasRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ListSchemasResponse:
        return pb.ListSchemasResponse(schemas=[
            pb.RegisteredSchema(name=s.name, version=s.version, description=s.description, schema=s.schema_json)
            for s in self._schemas])


def _screen_input(request: GenerationRequest, rendered: str) -> ScreenInput:
    messages = None if request.messages is None else tuple((m.role, m.content) for m in request.messages)
    return ScreenInput(rendered, messages)
