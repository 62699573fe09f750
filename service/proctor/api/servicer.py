"""The Generation servicer: check the message, run the call (api/call_runner.py), answer in protobuf.

It never imports torch and never lets a protobuf type past ``convert.py`` and ``check_request.py``. The
engine runs on its own thread; its events come back through the call runner into an asyncio queue. A
stream with output moderators is held back until the output is moderated.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Protocol

import grpc

from proctor import __version__
from proctor.api.audit_trail import MODEL_FIELDS, AuditTrail
from proctor.api.call_runner import GONE, CallRunner, GenerationEngine, with_receipt
from proctor.api.check_request import check_request
from proctor.api.convert import chunk_from_event, default_plugin_calls, response_from_events
from proctor.api.errors import abort_with
from proctor.api.gate import current_identity
from proctor.api.samples import sample_events, wants_samples
from proctor.api.size_limits import bounded_dict
from proctor.audit.records import CallRecord, PrivacyPolicy
from proctor.config import Settings
from proctor.decoding.plugins.api import Kind, PluginContext
from proctor.decoding.plugins.registry import PluginRegistry
from proctor.domain import GenerationRequest, RequestValidationError, ShuttingDown
from proctor.observability.calls import VALIDATE, stage
from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc as pb_grpc


class RegisteredSchemaView(Protocol):
    """A registered schema as ListSchemas shows it."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def schema_json(self) -> str: ...


class ModelFacts(Protocol):
    """What the servicer checks the server's own plugins against (the loaded model)."""

    @property
    def tokenizer(self) -> Any: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...


class GenerationServicer(pb_grpc.GenerationServicer):
    """Serves once ``attach`` gave it a started engine; before that every call is UNAVAILABLE."""

    def __init__(self, settings: Settings, audit: AuditTrail | None = None) -> None:
        self._settings = settings
        self.runner: CallRunner[Any] = CallRunner(settings, audit or AuditTrail(None, PrivacyPolicy(), compliance=False,
                                                                       top_n=0))
        self._model_info: dict[str, object] = {}
        self._vocab_size: int | None = None
        self._schemas: list[RegisteredSchemaView] = []

    @property
    def model_info(self) -> dict[str, object]:
        """The loaded model's ModelInfo fields (empty before ``attach``)."""
        return self._model_info

    @property
    def audit(self) -> AuditTrail:
        return self.runner.audit

    def attach(self, engine: GenerationEngine[Any], model_info: dict[str, object],
               schemas: Sequence[RegisteredSchemaView] = (), *, plugins: PluginRegistry | None = None,
               model: ModelFacts | None = None) -> None:
        """Serve with ``engine``. With ``plugins`` and ``model`` the server's own screens and moderators are
        checked first: a missing one or bad params fails the start (ValueError), not every request."""
        if plugins is not None and model is not None:
            self._check_default_moderation(plugins, model)
        self.runner.engine_or_none = engine
        self._model_info = model_info
        vocab_size = model_info.get("vocab_size")
        self._vocab_size = vocab_size if isinstance(vocab_size, int) else None
        self._schemas = list(schemas)
        self.audit.model = {k: model_info.get(k) for k in MODEL_FIELDS}

    def _check_default_moderation(self, registry: PluginRegistry, model: ModelFacts) -> None:
        context = PluginContext(model.tokenizer, model.vocab_size, frozenset(model.eos_token_ids))
        lists: tuple[tuple[str, Kind], ...] = (("input_screens", "input_screen"),
                                               ("output_moderators", "output_moderator"))
        for field, kind in lists:
            try:
                registry.instantiate(default_plugin_calls(self._settings, field), kind, context)
            except RequestValidationError as exc:
                raise ValueError(f"--{field.replace('_', '-')}: {exc}") from exc

    async def _checked(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext,
                       call: CallRecord) -> GenerationRequest:
        """The checked request (api/check_request.py); a bad one is recorded on ``call`` and the RPC aborted."""
        try:
            identity = current_identity()
            with stage(VALIDATE):
                request = check_request(message, self._settings, time_remaining_s=context.time_remaining(),
                                        vocab_size=self._vocab_size,
                                        caller=identity.caller if identity is not None else None)
            call.request = request
            return request
        except BaseException as exc:
            call.raw_request = bounded_dict(message)
            await self.runner.fail(call, exc, context)
            raise

    async def Generate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        return await self.generate(message, context, "Generate")

    async def StreamGenerate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[pb.GenerateChunk]:
        async with contextlib.aclosing(self.stream_generate(message, context, "StreamGenerate")) as chunks:
            async for chunk in chunks:
                yield chunk

    async def generate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext,
                       method: str) -> pb.GenerateResponse:
        """A unary generation, audited as ``method`` (the RPC, or the HTTP route that called it)."""
        call = self.audit.begin(method, context)
        request = await self._checked(message, context, call)
        if wants_samples(request):  # n completions, each its own audited call (api/samples.py)
            events, audit_id = await sample_events(self.runner, method, request, context)
        else:
            events, audit_id = await self.runner.run(call, request, context)
        return response_from_events(events, request, audit_id)

    async def stream_generate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext,
                              method: str) -> AsyncGenerator[pb.GenerateChunk, None]:
        """A streamed generation, audited as ``method`` (the RPC, or the HTTP route that called it)."""
        call = self.audit.begin(method, context)
        request = await self._checked(message, context, call)
        if wants_samples(request):  # n completions arrive whole at the end (api/samples.py)
            events, audit_id = await sample_events(self.runner, method, request, context)
            for event in events:
                if event.token_ids or event.text or event.finished:
                    yield chunk_from_event(event, request, audit_id)
            return
        runner = self.runner
        try:
            request = runner.admit(request, call)
            held = bool(request.output_moderators)  # the output is released only once moderated
            async with contextlib.aclosing(runner.events(request, call)) as stream:
                async for event in stream:
                    if not event.finished:
                        if not held and (event.token_ids or event.text):
                            yield chunk_from_event(event, request, call.audit_id)
                        continue
                    runner.final_status(event, call)
                    released = await runner.moderated(call, list(call.events))
                    # the final chunk waits for the record (compliance; receipts: the answered text, all of it)
                    await self.audit.commit(call, answered="".join(out.text for out in released))
                    await runner.deadline_status(event, context)
                    released = with_receipt(released, call)
                    for out in released if held else released[-1:]:
                        if out.token_ids or out.text or out.finished:
                            yield chunk_from_event(out, request, call.audit_id)
        except grpc.aio.AbortError:
            raise
        except GONE:  # the stream was cancelled or closed at a yield: record it; nobody is left to answer
            await runner.record_gone(call)
            raise
        except BaseException as exc:
            await runner.fail(call, exc, context)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        if self.runner.engine_or_none is None:
            await abort_with(context, ShuttingDown("the model is still loading; retry shortly"))
        info = pb.ModelInfo(server_version=__version__,
                            max_new_tokens_limit=self._settings.max_new_tokens_limit,
                            default_max_new_tokens=self._settings.default_max_new_tokens)
        for key, value in self._model_info.items():
            if value is None:
                continue
            if key == "eos_token_ids" and isinstance(value, list):
                info.eos_token_ids.extend(value)
            else:
                setattr(info, key, value)
        return info

    async def ListSchemas(self, request: pb.ListSchemasRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ListSchemasResponse:
        return pb.ListSchemasResponse(schemas=[
            pb.RegisteredSchema(name=s.name, version=s.version, description=s.description, schema=s.schema_json)
            for s in self._schemas])
