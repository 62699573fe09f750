"""The OpenAI-compatible routes, as a Starlette app over the gRPC door's own code.

A generation runs through the same pieces as a gRPC call, in the same order, and nothing is read or parsed for a
caller before it is admitted: the telemetry's observation (metrics by the route's template, the trace from
``traceparent``, the access log line) → the gate, from the headers alone (bearer token or client certificate →
caller, role, rate: 401, 403, 429) → the body, read against the caller's own size limit (413, refused from its
``Content-Length`` before a byte is read) → the body checked and converted into a ``GenerateRequest`` (400 naming
the key) → the caller's concurrent-generation slot → the Generation servicer (check_request, admission, the
engine, moderation, the audit record, which names the route).

Every request label is from a closed set: the service ``openai``, the route's template (``/v1/models/{model}``,
never the path it matched) or ``other`` for a request no route serves, and a gRPC status name. A refusal that
leaves a large body (or one of unknown length) unread closes the connection, so that body is never read at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proctor.api.call_info import Identity
from proctor.api.caller_limits import request_bytes_limit
from proctor.api.check_request import ProtoIntake
from proctor.api.convert import chunk_from_event, response_from_events
from proctor.api.gate import ServerGate
from proctor.api.generation_service import GenerationService
from proctor.api.grpc_calls import answering, call_info_of
from proctor.api.readiness import Serving
from proctor.api.telemetry import TelemetryInterceptor
from proctor.config import Settings
from proctor.openai_http.answers import ChunkWriter, unary_answer
from proctor.openai_http.body import CHAT, COMPLETION, ParsedCall, parse_body
from proctor.openai_http.context import HttpAbort, HttpCallContext
from proctor.openai_http.errors import (
    BodyError,
    abort_response,
    body_error_response,
    error_response,
    grpc_code_of,
    server_error_response,
)
from proctor.openai_http.fields import param_of
from proctor.openai_http.responses import ResponseEvents, parse_responses, response_object
from proctor_client.v1 import generation_pb2 as pb

SERVICE = "openai"  # the metrics' and traces' service label of the HTTP routes
GENERATE_METHOD = "/proctor.v1.Generation/Generate"  # the role and generation slot a completion takes
MODELS_METHOD = "/proctor.v1.Generation/GetModelInfo"
AUDIT_HEADER = "x-proctor-audit-id"
OFF_LOOP_PARSE_BYTES = 256 * 1024  # a larger body is parsed in a worker thread, not on the event loop
RESPONSES = "responses"  # the Responses API: a chat call in its own shapes (openai_http/responses.py)
# The routes, by the template that is their metric label (the path a route matches is never a label).
ROUTES = {CHAT: "/v1/chat/completions", COMPLETION: "/v1/completions", RESPONSES: "/v1/responses"}
MODELS_ROUTE, MODEL_ROUTE = "/v1/models", "/v1/models/{model}"
OTHER = "other"  # the one label of every request no route serves (an unknown path, a method a route lacks)
UNROUTED_CODES = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}  # its status label (gRPC's names, as every label's)
# A refused body this small has mostly arrived with its headers (uvicorn holds up to 64 KiB), and closing with data
# unread would reset the connection under the answer: the connection stays open and uvicorn skips it. A larger one,
# or one of unknown length, closes the connection after the answer, so it is never read.
SKIPPABLE_BODY_BYTES = 64 * 1024
READY = {"/health": False, "/ready": True}  # liveness (the whole server) and readiness (the model serves calls)


@dataclass
class HttpDoor:
    """The HTTP door's collaborators: the gRPC server's own gate, telemetry, servicer and health."""

    settings: Settings
    service: GenerationService
    gate: ServerGate
    telemetry: TelemetryInterceptor
    serving: Serving  # the health service's answer (api/readiness.py): ready, or alive

    def app(self) -> Starlette:
        routes = [Route(ROUTES[CHAT], self.chat, methods=["POST"]),
                  Route(ROUTES[COMPLETION], self.completions, methods=["POST"]),
                  Route(ROUTES[RESPONSES], self.responses, methods=["POST"]),
                  Route(MODELS_ROUTE, self.models, methods=["GET"]),
                  Route("/v1/models/{model:path}", self.model, methods=["GET"]),
                  Route("/health", self.health_check, methods=["GET"]),
                  Route("/ready", self.health_check, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_error, Exception: _server_error})

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, COMPLETION)

    async def responses(self, request: Request) -> Response:
        return await self._generate(request, RESPONSES)

    async def health_check(self, request: Request) -> Response:
        """Liveness (/health) and readiness (/ready), as the gRPC health service answers them (drain included)."""
        serving = await self.serving(READY[request.url.path])
        return JSONResponse({"status": "SERVING" if serving else "NOT_SERVING"}, status_code=200 if serving else 503)

    def _model_ids(self) -> list[str]:
        info = self.service.model_info
        model_id = str(info.get("model_id") or "")
        return [model_id] if model_id else []

    def _model_card(self, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "proctor"}

    async def models(self, request: Request) -> Response:
        return await self._observed(request, MODELS_METHOD, MODELS_ROUTE, lambda: JSONResponse(
            {"object": "list", "data": [self._model_card(m) for m in self._model_ids()]}))

    async def model(self, request: Request) -> Response:
        wanted = request.path_params["model"]

        def answer() -> Response:
            if wanted not in self._model_ids():
                raise BodyError(f"The model {wanted!r} does not exist", "model", 404, "model_not_found")
            return JSONResponse(self._model_card(wanted))
        return await self._observed(request, MODELS_METHOD, MODEL_ROUTE, answer)

    async def _observed(self, request: Request, method: str, route: str, answer: Callable[[], Response]) -> Response:
        """A call that generates nothing, observed (as ``route``) and gated as the gRPC method ``method`` is."""
        context = HttpCallContext.of(request)

        async def behaviour(_: object, ctx: HttpCallContext) -> Response:
            await self._admit(method, ctx)
            if not self.service.serving:
                await ctx.abort(grpc.StatusCode.UNAVAILABLE, "the model is still loading; retry shortly")
            return _checked_body(answer, ctx)

        observed = self.telemetry.observe(behaviour, SERVICE, route, context.invocation_metadata())
        try:
            response: Response = await observed(None, context)
        except HttpAbort as abort:
            response = abort_response(abort, param_of)
        except BodyError as error:
            response = body_error_response(error)
        return _closing_if_unread(request, response)

    async def _admit(self, method: str, context: HttpCallContext) -> Any:
        """The gate's checks of a gRPC call of ``method``: the caller, its role and its rate (None when open)."""
        if self.gate.book is None:
            return None
        return await self.gate.admission(method)(context)

    async def _generate(self, request: Request, kind: str) -> Response:
        context = HttpCallContext.of(request)
        route = ROUTES[kind]
        observed = self.telemetry.observe(self._generation, SERVICE, route, context.invocation_metadata())
        stream = observed((request, kind, route), context)
        try:
            call: ParsedCall = await anext(stream)
            first = await anext(stream)
        except HttpAbort as abort:
            return _closing_if_unread(request, abort_response(abort, lambda path: param_of(path, context.params)))
        except BodyError as error:
            return _closing_if_unread(request, body_error_response(error))
        created = int(time.time())
        fingerprint = self._fingerprint()
        if not call.stream:
            with contextlib.suppress(StopAsyncIteration):
                await anext(stream)  # the observation ends: metrics, span, log line
            answer = unary_answer(call, first, created, fingerprint)
            if call.responses_echo is not None:
                answer = response_object(answer, call)
            return JSONResponse(answer, headers={AUDIT_HEADER: first.audit_id})
        writer = ChunkWriter(call, created, fingerprint)
        events = _events(writer, first, stream) if call.responses_echo is None else \
            _response_events(writer, ResponseEvents(call, created), first, stream)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={AUDIT_HEADER: context.audit_id, "Cache-Control": "no-cache"})

    async def _generation(self, args: tuple[Request, str, str],
                          context: HttpCallContext) -> AsyncGenerator[Any, None]:
        """The observed call: the caller admitted from the headers, the body read and parsed, then the unary
        response or the stream's chunks."""
        request, kind, route = args
        identity = await self._admit(GENERATE_METHOD, context)
        try:
            raw = await self._read_json(request, identity)
            call = parse_responses(raw) if kind == RESPONSES else parse_body(raw, kind)
            if call.model not in self._model_ids():
                raise BodyError(f"The model {call.model!r} does not exist; GET /v1/models lists this server's",
                                "model", 404, "model_not_found")
        except BodyError as error:
            context.set_code(grpc_code_of(error))
            raise
        context.params = call.params
        message = call.message
        if call.user:  # recorded as the caller the client asserts (as x-proctor-caller is)
            context.assert_caller(call.user)
        yield call
        async with self.gate.generation_slot(identity is not None, identity, context), answering(context):
            info, method = call_info_of(context), f"POST {route}"
            if not call.stream:
                answer = await self.service.generate(ProtoIntake(message), info, method)
                yield response_from_events(answer.events, answer.request, answer.audit_id)
                return
            stream = self.service.stream(ProtoIntake(message), info, method)
            async with contextlib.aclosing(stream):
                async for released in stream:
                    context.audit_id = released.audit_id
                    yield chunk_from_event(released.event, released.request, released.audit_id)

    async def _read_json(self, request: Request, identity: Identity | None) -> object:
        """The body as JSON, refused (413) past its caller's size limit before it is all read or parsed."""
        limit = request_bytes_limit(identity.caller if identity is not None else None,
                                    self.settings.max_message_bytes)
        assert limit is not None  # the server's limit is always set
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyError(f"the request body is {declared} bytes; the limit is {limit}", "body", 413)
        chunks, size = [], 0
        async for piece in request.stream():
            size += len(piece)
            if size > limit:
                raise BodyError(f"the request body is over the limit of {limit} bytes", "body", 413)
            chunks.append(piece)
        request.state.body_read = True
        data = b"".join(chunks)
        try:
            return await asyncio.to_thread(_json, data) if size > OFF_LOOP_PARSE_BYTES else _json(data)
        except (ValueError, RecursionError) as exc:
            raise BodyError(f"the request body is not valid JSON ({exc})", "body") from None

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """A request no route serves (404, 405): counted under the one label ``other``, never under its path."""
        assert isinstance(exc, HTTPException)
        metrics = self.telemetry.metrics
        if metrics is not None:
            metrics.requests.labels(SERVICE, OTHER, UNROUTED_CODES.get(exc.status_code, "INVALID_ARGUMENT")).inc()
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        answer = error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)
        return _closing_if_unread(request, answer)

    def _fingerprint(self) -> str:
        info = self.service.model_info
        return f"proctor-{str(info.get('weights_sha256') or '')[:12]}"


async def _events(writer: ChunkWriter, first: pb.GenerateChunk,
                  rest: AsyncGenerator[Any, None]) -> AsyncIterator[bytes]:
    """Server-sent events: OpenAI's chunks, the usage chunk when asked for, then ``[DONE]``."""
    async with contextlib.aclosing(rest):  # a client that leaves closes the call (record, engine abort)
        chunk: pb.GenerateChunk | None = first
        while chunk is not None:
            for out in writer.chunks(chunk):
                yield b"data: " + orjson.dumps(out) + b"\n\n"
            if chunk.finish_reason != pb.FINISH_REASON_UNSPECIFIED and writer.call.include_usage:
                yield b"data: " + orjson.dumps(writer.usage_chunk(chunk)) + b"\n\n"
            try:
                chunk = await anext(rest)
            except StopAsyncIteration:
                chunk = None
            except HttpAbort as abort:  # after the first chunk the status is sent: the error goes in the stream
                answer = abort_response(abort, param_of)
                yield b"data: " + bytes(answer.body) + b"\n\n"
                chunk = None
    yield b"data: [DONE]\n\n"


async def _response_events(writer: ChunkWriter, events: ResponseEvents, first: pb.GenerateChunk,
                           rest: AsyncGenerator[Any, None]) -> AsyncIterator[bytes]:
    """The Responses API's server-sent events (``event:`` and ``data:`` lines), from the chat stream's chunks."""
    async with contextlib.aclosing(rest):  # a client that leaves closes the call (record, engine abort)
        for name, payload in events.start(first.request_id):
            yield _event(name, payload)
        chunk: pb.GenerateChunk | None = first
        while chunk is not None:
            for out in writer.chunks(chunk):
                for name, payload in events.feed(out):
                    yield _event(name, payload)
                if "proctor" in out:  # the final chunk
                    for name, payload in events.finish(out, writer.usage_chunk(chunk)["usage"]):
                        yield _event(name, payload)
            try:
                chunk = await anext(rest)
            except StopAsyncIteration:
                chunk = None
            except HttpAbort as abort:  # after the first event the status is sent: the error goes in the stream
                error = json.loads(bytes(abort_response(abort, param_of).body))["error"]
                yield _event("error", {"type": "error", "sequence_number": events.sequence, **error})
                chunk = None


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _json(data: bytes) -> object:
    """Standard JSON only: NaN and Infinity are refused, as JSON (RFC 8259) has no such numbers."""
    return json.loads(data, parse_constant=_no_constant)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _checked_body(answer: Callable[[], Response], context: HttpCallContext) -> Response:
    try:
        return answer()
    except BodyError as error:
        context.set_code(grpc_code_of(error))
        raise


def _closing_if_unread(request: Request, response: Response) -> Response:
    """``response``, closing the connection after it when it leaves a large body (or one of unknown length) unread:
    uvicorn would otherwise read all of it, to find the next request on the connection."""
    if getattr(request.state, "body_read", False):
        return response
    declared = request.headers.get("content-length")
    if declared is None and "transfer-encoding" not in request.headers:
        return response
    if declared is not None and declared.isdigit() and int(declared) <= SKIPPABLE_BODY_BYTES:
        return response
    response.headers["connection"] = "close"
    return response


async def _server_error(request: Request, exc: Exception) -> Response:
    return _closing_if_unread(request, server_error_response(exc))
