"""asyncio client with the same surface and semantics as ProctorClient, over ``grpc.aio``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
import grpc.aio

from proctor_client._common import (
    READY_POLL_S,
    UNSET,
    ChannelOptions,
    Deadline,
    RetryPolicy,
    TimeoutArg,
    channel_options,
    coerce_request,
    resolve_timeout,
    status_code,
)
from proctor_client.auth import AsyncBearerToken
from proctor_client.contracts import build_contract_request
from proctor_client.errors import ProctorError
from proctor_client.v1 import contracts_pb2, contracts_pb2_grpc, generation_pb2, generation_pb2_grpc

T = TypeVar("T")


class AsyncProctorClient:
    """Async client for proctor.v1.Generation; use ``async with`` or ``await close()``.

    Create it inside the event loop that will use it (grpc.aio channels are bound to one loop).
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float | None = 60.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        options: ChannelOptions | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._policy = RetryPolicy(retries=retries, backoff_s=backoff_s)
        opts = channel_options(options)
        interceptors = [AsyncBearerToken(token)] if token else None
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=opts, interceptors=interceptors)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=opts, interceptors=interceptors)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._contracts = contracts_pb2_grpc.ContractsStub(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; in-flight calls are cancelled."""
        await self._channel.close()

    async def generate(
        self,
        request: generation_pb2.GenerateRequest | str | None = None,
        /,
        *,
        timeout_s: TimeoutArg = UNSET,
        **kwargs: Any,
    ) -> generation_pb2.GenerateResponse:
        """Generate a whole completion from a GenerateRequest, or a prompt / ``messages=`` + build_request kwargs."""
        message = coerce_request(request, kwargs)
        return await self._unary(self._stub.Generate, message, resolve_timeout(timeout_s, self.timeout_s))

    def stream_generate(
        self,
        request: generation_pb2.GenerateRequest | str | None = None,
        /,
        *,
        timeout_s: TimeoutArg = UNSET,
        **kwargs: Any,
    ) -> AsyncIterator[generation_pb2.GenerateChunk]:
        """Return an async iterator of chunks (``async for``); arguments are validated now, not on first use.

        Closing the iterator early (``aclose()`` or leaving ``async for``) cancels the call.
        """
        message = coerce_request(request, kwargs)
        return self._stream(message, resolve_timeout(timeout_s, self.timeout_s))

    async def model_info(self, *, timeout_s: TimeoutArg = UNSET) -> generation_pb2.ModelInfo:
        """Describe the loaded model and the server."""
        request = generation_pb2.GetModelInfoRequest()
        return await self._unary(self._stub.GetModelInfo, request, resolve_timeout(timeout_s, self.timeout_s))

    async def list_schemas(self, *, timeout_s: TimeoutArg = UNSET) -> list[generation_pb2.RegisteredSchema]:
        """The JSON schemas registered on the server (each usable as ``schema_ref="name@version"``)."""
        request = generation_pb2.ListSchemasRequest()
        response = await self._unary(self._stub.ListSchemas, request, resolve_timeout(timeout_s, self.timeout_s))
        return list(response.schemas)


    async def draft_contract(
        self,
        request: contracts_pb2.DraftContractRequest | str,
        /,
        *,
        timeout_s: TimeoutArg = UNSET,
        **kwargs: Any,
    ) -> contracts_pb2.DraftContractResponse:
        """Draft a contract (see ProctorClient.draft_contract)."""
        message = request if isinstance(request, contracts_pb2.DraftContractRequest) else build_contract_request(
            request, **kwargs)
        return await self._unary(self._contracts.DraftContract, message, resolve_timeout(timeout_s, self.timeout_s))

    async def list_templates(self, *, timeout_s: TimeoutArg = UNSET) -> list[contracts_pb2.ContractTemplate]:
        """The contract templates registered on the server."""
        request = contracts_pb2.ListTemplatesRequest()
        response = await self._unary(self._contracts.ListTemplates, request, resolve_timeout(timeout_s, self.timeout_s))
        return list(response.templates)

    async def wait_ready(self, timeout_s: float) -> generation_pb2.ModelInfo:
        """Poll GetModelInfo until it succeeds or ``timeout_s`` passes (see ProctorClient.wait_ready)."""
        deadline = Deadline(timeout_s)
        request = generation_pb2.GetModelInfoRequest()
        last = "no attempt"
        while True:
            remaining = deadline.remaining() or 0.0
            try:
                return await self._stub.GetModelInfo(request, timeout=max(remaining, 0.001), wait_for_ready=True)
            except grpc.RpcError as error:
                failure = ProctorError.from_rpc_error(error)
                if failure.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise failure from error
                last = str(failure)
            remaining = deadline.remaining() or 0.0
            if remaining <= READY_POLL_S:
                raise ProctorError(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"{self.target} not ready after {timeout_s:g} s (last: {last})"
                )
            await asyncio.sleep(READY_POLL_S)

    async def _unary(self, method: Callable[..., Awaitable[T]], request: Any, timeout_s: float | None) -> T:
        deadline = Deadline(timeout_s)
        attempt = 0
        while True:
            try:
                return await method(request, timeout=deadline.remaining())
            except grpc.RpcError as error:
                delay = self._policy.delay(status_code(error), attempt, deadline.remaining())
                if delay is None:
                    raise ProctorError.from_rpc_error(error) from error
            await asyncio.sleep(delay)
            attempt += 1

    async def _stream(
        self, request: generation_pb2.GenerateRequest, timeout_s: float | None
    ) -> AsyncIterator[generation_pb2.GenerateChunk]:
        deadline = Deadline(timeout_s)
        attempt = 0
        while True:
            call = self._stub.StreamGenerate(request, timeout=deadline.remaining())
            received = False
            try:
                async for chunk in call:
                    received = True
                    yield chunk
                return
            except grpc.RpcError as error:
                # Once a chunk arrived, a retry would repeat text the caller already has.
                delay = None if received else self._policy.delay(status_code(error), attempt, deadline.remaining())
                if delay is None:
                    raise ProctorError.from_rpc_error(error) from error
            finally:
                call.cancel()
            await asyncio.sleep(delay)
            attempt += 1
