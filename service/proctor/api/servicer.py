"""The Generation servicer: the gRPC door of the call layer (api/generation_service.py).

It turns the message into the call layer's request (``ProtoIntake``: api/check_request.py checks it there, once),
the context into a ``CallInfo`` (api/grpc_calls.py), the domain events back into protobuf (api/convert.py), and
a domain error into the gRPC status of the one table (api/failures.py, in gRPC's form by api/errors.py). It never
imports torch, and no protobuf type gets past ``convert.py`` and ``check_request.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

from proctor import __version__
from proctor.api.check_request import ProtoIntake
from proctor.api.convert import chunk_from_event, response_from_events
from proctor.api.errors import abort_with
from proctor.api.generation_service import GenerationService
from proctor.api.grpc_calls import answering, call_info_of
from proctor.domain import ShuttingDown
from proctor_client.v1 import generation_pb2 as pb
from proctor_client.v1 import generation_pb2_grpc as pb_grpc


class GenerationServicer(pb_grpc.GenerationServicer):
    """``service`` over gRPC; before a model is attached every call is UNAVAILABLE."""

    def __init__(self, service: GenerationService) -> None:
        self.service = service

    async def Generate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        async with answering(context):
            answer = await self.service.generate(ProtoIntake(message), call_info_of(context), "Generate")
        return response_from_events(answer.events, answer.request, answer.audit_id)

    async def StreamGenerate(self, message: pb.GenerateRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[pb.GenerateChunk]:
        stream = self.service.stream(ProtoIntake(message), call_info_of(context), "StreamGenerate")
        async with answering(context), contextlib.aclosing(stream):
            async for released in stream:
                yield chunk_from_event(released.event, released.request, released.audit_id)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        if not self.service.serving:
            await abort_with(context, ShuttingDown("the model is still loading; retry shortly"))
        settings = self.service.settings
        info = pb.ModelInfo(server_version=__version__, max_new_tokens_limit=settings.max_new_tokens_limit,
                            default_max_new_tokens=settings.default_max_new_tokens)
        for key, value in self.service.model_info.items():
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
            for s in self.service.schemas])
