"""The OpenAI-compatible routes, as a Starlette app over the call layer (api/generation_service.py).

A generation runs through the same pieces as a gRPC call, in the same order, and nothing is read or parsed for a
caller before it is admitted: the call's observation (api/observer.py: metrics by the route's template, the trace
from ``traceparent``, the access log line) → the admission rules (api/admission.py), from the headers alone
(bearer token or client certificate → caller, role, rate: 401, 403, 429) → the body, read against the caller's own
size limit (413, refused from its ``Content-Length`` before a byte is read) → the body checked and converted into
the call layer's request (400 naming the key) → the caller's concurrent-generation slot → the call layer
(check_request, admission, the engine, moderation, the audit record, which names the route and the caller the
body's ``user`` asserts). The door describes the call to the layer as a ``CallInfo`` (its headers, peer and client
certificate) and answers what the layer raises, a domain error, in OpenAI's error object (openai_http/errors.py);
an answer's events become OpenAI's JSON (openai_http/answers.py) or server-sent events (openai_http/sse.py).

Every request label is from a closed set: the service ``openai``, the route's template (``/v1/models/{model}``,
never the path it matched) or ``other`` for a request no route serves, and a status name (gRPC's names, as every
door's). A refusal that leaves a large body (or one of unknown length) unread closes the connection, so that body
is never read at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from proctor.api.admission import Admission
from proctor.api.answered import Answer, Released
from proctor.api.call_info import GONE, CallInfo, Identity
from proctor.api.caller_limits import request_bytes_limit
from proctor.api.check_request import DraftIntake
from proctor.api.failures import failure_of
from proctor.api.generation_service import GenerationService
from proctor.api.observer import CallObserver, gone_code, publish, unpublish
from proctor.api.readiness import Serving
from proctor.audit.tlog_http import CHECKPOINT_ROUTE, TILE_PATH, TILE_ROUTE, tlog_response
from proctor.audit.tlog_read import TlogReader
from proctor.config import Settings
from proctor.domain import ShuttingDown
from proctor.observability.calls import CallObservation
from proctor.openai_http.answers import ChunkWriter, unary_answer
from proctor.openai_http.body import CHAT, COMPLETION, ParsedCall, parse_body
from proctor.openai_http.errors import (
    BodyError,
    body_error_response,
    error_response,
    failure_response,
    status_of,
)
from proctor.openai_http.fields import param_of
from proctor.openai_http.responses import ResponseEvents, parse_responses, response_object
from proctor.openai_http.sse import chat_events, response_events

SERVICE = "openai"  # the metrics' and traces' service label of the HTTP routes
GENERATE_METHOD = "/proctor.v1.Generation/Generate"  # the role and generation slot a completion takes
MODELS_METHOD = "/proctor.v1.Generation/GetModelInfo"
TLOG_METHOD = "/proctor.v1.Audit/GetCheckpoint"  # the role a tiled-log read takes (audit:read), unless --tlog-public
AUDIT_HEADER = "x-proctor-audit-id"
# The request headers the call's code reads (as gRPC metadata): credentials, trace context, the asserted caller.
FORWARDED_HEADERS = ("authorization", "traceparent", "tracestate", "x-proctor-caller")
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
T = TypeVar("T")


def call_info(request: Request) -> CallInfo:
    """The call a Starlette request makes: the headers its code reads, its peer, its verified client certificate
    (the ASGI TLS extension that openai_http/server.py adds to uvicorn's scope)."""
    headers, client = request.headers, request.client
    tls = (request.scope.get("extensions") or {}).get("tls") or {}
    chain = tls.get("client_cert_chain") or []
    return CallInfo(peer=f"ipv4:{client[0]}:{client[1]}" if client is not None else "",
                    metadata={name: headers[name] for name in FORWARDED_HEADERS if name in headers},
                    certificate={"x509_pem_cert": (chain[0].encode(),)} if chain else {})


@dataclass
class HttpDoor:
    """The HTTP door's collaborators: the gRPC door's own admission rules, call observer and call layer."""

    settings: Settings
    service: GenerationService
    admission: Admission
    observer: CallObserver
    serving: Serving  # the health service's answer (api/readiness.py): ready, or alive
    tlog: TlogReader | None = None  # the audit log's checkpoint and tiles (None: this server keeps no audit log)

    def app(self) -> Starlette:
        routes = [Route(ROUTES[CHAT], self.chat, methods=["POST"]),
                  Route(ROUTES[COMPLETION], self.completions, methods=["POST"]),
                  Route(ROUTES[RESPONSES], self.responses, methods=["POST"]),
                  Route(MODELS_ROUTE, self.models, methods=["GET"]),
                  Route("/v1/models/{model:path}", self.model, methods=["GET"]),
                  Route("/health", self.health_check, methods=["GET"]),
                  Route("/ready", self.health_check, methods=["GET"]),
                  Route(CHECKPOINT_ROUTE, self.tlog_checkpoint, methods=["GET"]),
                  Route(TILE_PATH, self.tlog_tile, methods=["GET"])]
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

    async def tlog_checkpoint(self, request: Request) -> Response:
        return await self._tlog(request, CHECKPOINT_ROUTE, None)

    async def tlog_tile(self, request: Request) -> Response:
        return await self._tlog(request, TILE_ROUTE, request.path_params["path"])

    async def _tlog(self, request: Request, route: str, tile_path: str | None) -> Response:
        """The tiled log (c2sp.org/tlog-tiles: audit/tlog_http.py), observed as ``route`` and admitted as a read of
        the audit log (role audit:read) unless ``--tlog-public``; it needs no model, so it answers while one loads."""
        info = call_info(request)

        async def call() -> AsyncGenerator[Response, None]:
            if not self.settings.tlog_public:
                await self._admit(TLOG_METHOD, info)
            if self.tlog is None:
                yield PlainTextResponse("this server keeps no audit log (--no-audit)\n", status_code=404)
                return
            yield await tlog_response(self.tlog, tile_path)

        try:
            (response,) = [answered async for answered in self._observed(call(), route, info)]
        except Exception as exc:  # a refusal (401, 403, 429), in OpenAI's error object as every refusal here
            response = failure_response(exc, param_of)
        return _closing_if_unread(request, response)

    def _model_ids(self) -> list[str]:
        model_id = str(self.service.model_info.get("model_id") or "")
        return [model_id] if model_id else []

    def _model_card(self, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "proctor"}

    async def models(self, request: Request) -> Response:
        return await self._answered(request, MODELS_METHOD, MODELS_ROUTE, lambda: JSONResponse(
            {"object": "list", "data": [self._model_card(m) for m in self._model_ids()]}))

    async def model(self, request: Request) -> Response:
        wanted = request.path_params["model"]

        def answer() -> Response:
            if wanted not in self._model_ids():
                raise BodyError(f"The model {wanted!r} does not exist", "model", 404, "model_not_found")
            return JSONResponse(self._model_card(wanted))
        return await self._answered(request, MODELS_METHOD, MODEL_ROUTE, answer)

    async def _answered(self, request: Request, method: str, route: str, answer: Callable[[], Response]) -> Response:
        """A call that generates nothing, observed (as ``route``) and admitted as the gRPC method ``method`` is."""
        info = call_info(request)

        async def call() -> AsyncGenerator[Response, None]:
            await self._admit(method, info)
            if not self.service.serving:
                raise ShuttingDown("the model is still loading; retry shortly")
            yield answer()

        try:
            (response,) = [answered async for answered in self._observed(call(), route, info)]
        except BodyError as error:
            response = body_error_response(error)
        except Exception as exc:  # a domain error (or anything unexpected: a 500 naming its error id)
            response = failure_response(exc, param_of)
        return _closing_if_unread(request, response)

    async def _admit(self, method: str, info: CallInfo) -> Identity | None:
        """The admission rules of a call of the gRPC method ``method``: the caller, its role, its rate (None when
        open); a refusal is a domain error."""
        return self.admission.admit(method, info)

    async def _observed(self, inner: AsyncGenerator[T, None], route: str, info: CallInfo) -> AsyncGenerator[T, None]:
        """``inner`` observed as a call of ``route``: its observation is the current call's while it runs and is
        recorded once, when it ends, with the status it ended with."""
        observation = self.observer.open(SERVICE, route, info.trace_metadata(), info.peer)
        token = publish(observation)
        failure: BaseException | None = None
        try:
            async with contextlib.aclosing(inner):
                async for item in inner:
                    yield item
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.observer.close(observation, _status(failure, observation))
            unpublish(token)

    async def _generate(self, request: Request, kind: str) -> Response:
        route, info = ROUTES[kind], call_info(request)
        stream = self._observed(self._generation(request, kind, route, info), route, info)
        params: dict[str, str] = {}  # proto path → body key, where the call's body named a field otherwise
        try:
            call = await anext(stream)
            assert isinstance(call, ParsedCall)
            params = call.params
            first = await anext(stream)
        except BodyError as error:
            return _closing_if_unread(request, body_error_response(error))
        except Exception as exc:  # a domain error (or anything unexpected: a 500 naming its error id)
            return _closing_if_unread(request, failure_response(exc, lambda path: param_of(path, params)))
        created, fingerprint = int(time.time()), self._fingerprint()
        if isinstance(first, Answer):
            with contextlib.suppress(StopAsyncIteration):
                await anext(stream)  # the observation ends: metrics, span, log line
            answer = unary_answer(call, first, created, fingerprint)
            if call.responses_echo is not None:
                answer = response_object(answer, call)
            return JSONResponse(answer, headers={AUDIT_HEADER: first.audit_id})
        assert isinstance(first, Released)
        writer = ChunkWriter(call, created, fingerprint)
        events = chat_events(writer, first, stream, param_of) if call.responses_echo is None else \
            response_events(writer, ResponseEvents(call, created), first, stream, param_of)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={AUDIT_HEADER: first.audit_id, "Cache-Control": "no-cache"})

    async def _generation(self, request: Request, kind: str, route: str,
                          info: CallInfo) -> AsyncGenerator[ParsedCall | Answer | Released, None]:
        """The call: the caller admitted from the headers, the body read and parsed, then the call layer's answer
        or the stream's events, within the caller's generation slot."""
        identity = await self._admit(GENERATE_METHOD, info)
        raw = await self._read_json(request, identity)
        call = parse_responses(raw) if kind == RESPONSES else parse_body(raw, kind)
        if call.model not in self._model_ids():
            raise BodyError(f"The model {call.model!r} does not exist; GET /v1/models lists this server's",
                            "model", 404, "model_not_found")
        yield call
        info = info.admitted(identity).asserting(call.user)  # the body's user: the caller it asserts
        intake, method = DraftIntake(call.draft.request(), call.draft.violations()), f"POST {route}"
        with self.admission.generation_slot(identity):
            if not call.stream:
                yield await self.service.generate(intake, info, method)
                return
            async with contextlib.aclosing(self.service.stream(intake, info, method)) as stream:
                async for released in stream:
                    yield released

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
        metrics = self.observer.metrics
        if metrics is not None:
            metrics.requests.labels(SERVICE, OTHER, UNROUTED_CODES.get(exc.status_code, "INVALID_ARGUMENT")).inc()
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        answer = error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)
        return _closing_if_unread(request, answer)

    def _fingerprint(self) -> str:
        info = self.service.model_info
        return f"proctor-{str(info.get('weights_sha256') or '')[:12]}"


def _json(data: bytes) -> object:
    """Standard JSON only: NaN and Infinity are refused, as JSON (RFC 8259) has no such numbers."""
    return json.loads(data, parse_constant=_no_constant)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _status(failure: BaseException | None, observation: CallObservation) -> str:
    """The status an observed call ended with, by name (a body refused before any work: its own)."""
    if failure is None:
        return "OK"
    if isinstance(failure, GONE):
        return gone_code(observation, None)  # HTTP calls have no deadline of their own
    if isinstance(failure, BodyError):
        return status_of(failure)
    return failure_of(failure).code


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
    return _closing_if_unread(request, failure_response(exc, param_of))
