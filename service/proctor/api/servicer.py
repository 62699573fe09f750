"""The Generation servicer: validate and convert, hand over to the engine, stream events back.

It never imports torch and never lets a protobuf type past ``convert.py``. The engine runs on its
own thread; its events come back through ``loop.call_soon_threadsafe`` into an asyncio queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from proctor import __version__
from proctor.api.convert import chunk_from_event, request_from_proto, response_from_events
from proctor.api.errors import abort_with
from proctor.config import Settings
from proctor.domain import (
    EngineFault,
    FinishReason,
    GenerationRequest,
    Overloaded,
    RequestValidationError,
    ShuttingDown,
    TokenEvent,
)
from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc as pb_grpc

log = logging.getLogger("proctor.api")
EXPECTED = (RequestValidationError, Overloaded, ShuttingDown, EngineFault)


class GenerationEngine(Protocol):
    """What the API needs from the engine (kept abstract so api/ never imports torch)."""

    def prepare(self, request: GenerationRequest) -> object: ...
    def submit(self, prepared: object, sink: object) -> int: ...
    def abort(self, request_id: str) -> None: ...


class RegisteredSchemaView(Protocol):
    """A registered schema as ListSchemas shows it."""

    name: str
    version: str
    description: str
    schema_json: str


class GenerationServicer(pb_grpc.GenerationServicer):
    """Serves once ``attach`` gave it a started engine; before that every call is UNAVAILABLE."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._engine_or_none: GenerationEngine | None = None
        self._model_info: dict[str, object] = {}
        self._schemas: list[RegisteredSchemaView] = []

    def attach(self, engine: GenerationEngine, model_info: dict[str, object],
               schemas: list[RegisteredSchemaView] | None = None) -> None:
        self._engine_or_none = engine
        self._model_info = model_info
        self._schemas = list(schemas or [])

    @property
    def _engine(self) -> GenerationEngine:
        if self._engine_or_none is None:
            raise ShuttingDown("the model is still loading; retry shortly")
        return self._engine_or_none

    async def _start(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext
                     ) -> tuple[GenerationRequest, asyncio.Queue[TokenEvent]]:
        engine = self._engine
        request = request_from_proto(message, self._settings, context.time_remaining())
        prepared = await asyncio.to_thread(engine.prepare, request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        engine.submit(prepared, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event))
        return request, queue

    async def _events(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[TokenEvent]:
        """The request's events until the final one; aborts the request if the call goes away."""
        request, queue = await self._start(message, context)
        finished = False
        try:
            while True:
                event = await queue.get()
                if event.error is not None:
                    raise EngineFault(event.error)
                yield event
                if event.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self._engine.abort(request.request_id)

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        try:
            events = [event async for event in self._events(request, context)]
        except EXPECTED as exc:
            await abort_with(context, exc)
            raise AssertionError("unreachable") from exc
        except Exception as exc:
            log.exception("Generate failed")
            await abort_with(context, exc)
            raise AssertionError("unreachable") from exc
        await self._finish_status(events[-1], context)
        return response_from_events(events)

    async def StreamGenerate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[pb.GenerateChunk]:
        try:
            async for event in self._events(request, context):
                if event.finished:
                    await self._finish_status(event, context)
                if event.token_ids or event.text or event.finished:
                    yield chunk_from_event(event)
        except EXPECTED as exc:
            await abort_with(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log.exception("StreamGenerate failed")
            await abort_with(context, exc)

    async def _finish_status(self, event: TokenEvent, context: grpc.aio.ServicerContext) -> None:
        """A request that ran out of time ends with DEADLINE_EXCEEDED, as gRPC callers expect."""
        if event.finish_reason is FinishReason.DEADLINE:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed during generation")

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
