"""Blocking client: one channel, deadlines on every call, retries only when nothing was received."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

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
from proctor_client.auth import BearerToken
from proctor_client.contracts import build_contract_request
from proctor_client.errors import ProctorError
from proctor_client.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    contracts_pb2,
    contracts_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
)

T = TypeVar("T")


class ProctorClient:
    """Sync client for proctor.v1.Generation; use as a context manager or call close().

    ``retries`` counts extra attempts after an UNAVAILABLE failure; every other failure raises ProctorError
    at once. ``timeout_s`` is the default deadline of a whole call, retries included (None: no deadline).
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
        if credentials is None:
            self._raw_channel = grpc.insecure_channel(target, options=opts)
        else:
            self._raw_channel = grpc.secure_channel(target, credentials, options=opts)
        self._channel = grpc.intercept_channel(self._raw_channel, BearerToken(token)) if token else self._raw_channel
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._contracts = contracts_pb2_grpc.ContractsStub(self._channel)
        self._audit = audit_pb2_grpc.AuditStub(self._channel)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel; in-flight calls are cancelled."""
        self._channel.close()

    def generate(
        self,
        request: generation_pb2.GenerateRequest | str | None = None,
        /,
        *,
        timeout_s: TimeoutArg = UNSET,
        **kwargs: Any,
    ) -> generation_pb2.GenerateResponse:
        """Generate a whole completion from a GenerateRequest, or a prompt / ``messages=`` + build_request kwargs."""
        message = coerce_request(request, kwargs)
        return self._unary(self._stub.Generate, message, resolve_timeout(timeout_s, self.timeout_s))

    def stream_generate(
        self,
        request: generation_pb2.GenerateRequest | str | None = None,
        /,
        *,
        timeout_s: TimeoutArg = UNSET,
        **kwargs: Any,
    ) -> Iterator[generation_pb2.GenerateChunk]:
        """Stream chunks; arguments are validated now, the call starts on the first ``next()``.

        Closing the iterator early (``break``) cancels the call.
        """
        message = coerce_request(request, kwargs)
        return self._stream(message, resolve_timeout(timeout_s, self.timeout_s))

    def model_info(self, *, timeout_s: TimeoutArg = UNSET) -> generation_pb2.ModelInfo:
        """Describe the loaded model and the server."""
        request = generation_pb2.GetModelInfoRequest()
        return self._unary(self._stub.GetModelInfo, request, resolve_timeout(timeout_s, self.timeout_s))

    def list_schemas(self, *, timeout_s: TimeoutArg = UNSET) -> list[generation_pb2.RegisteredSchema]:
        """The JSON schemas registered on the server (each usable as ``schema_ref="name@version"``)."""
        request = generation_pb2.ListSchemasRequest()
        response = self._unary(self._stub.ListSchemas, request, resolve_timeout(timeout_s, self.timeout_s))
        return list(response.schemas)


    def draft_contract(
        self,
        request: contracts_pb2.DraftContractRequest | str,
        /,
        *,
        timeout_s: TimeoutArg = UNSET,
        **kwargs: Any,
    ) -> contracts_pb2.DraftContractResponse:
        """Draft a contract: a DraftContractRequest, or a template name + ``build_contract_request`` kwargs
        (``parties=["Acme Corp:disclosing", ...], required_clauses=["4.2"], facts={...}``)."""
        message = request if isinstance(request, contracts_pb2.DraftContractRequest) else build_contract_request(
            request, **kwargs)
        return self._unary(self._contracts.DraftContract, message, resolve_timeout(timeout_s, self.timeout_s))

    def list_templates(self, *, timeout_s: TimeoutArg = UNSET) -> list[contracts_pb2.ContractTemplate]:
        """The contract templates registered on the server (usable as DraftContract's ``template``)."""
        request = contracts_pb2.ListTemplatesRequest()
        response = self._unary(self._contracts.ListTemplates, request, resolve_timeout(timeout_s, self.timeout_s))
        return list(response.templates)

    def audit_record(self, audit_id: str, *, timeout_s: TimeoutArg = UNSET) -> audit_pb2.AuditRecord:
        """One audit record (``record_json`` is its canonical JSON; see docs/audit-format.md)."""
        request = audit_pb2.GetRecordRequest(audit_id=audit_id)
        return self._unary(self._audit.GetRecord, request, resolve_timeout(timeout_s, self.timeout_s))

    def verify_log(self, *, timeout_s: TimeoutArg = UNSET) -> audit_pb2.VerifyLogResponse:
        """Have the server verify its whole audit log (hash chain, checkpoint signatures)."""
        request = audit_pb2.VerifyLogRequest()
        return self._unary(self._audit.VerifyLog, request, resolve_timeout(timeout_s, self.timeout_s))

    def replay(self, audit_id: str, *, timeout_s: TimeoutArg = UNSET) -> audit_pb2.ReplayResponse:
        """Re-run a recorded generation on the server and compare it token by token."""
        request = audit_pb2.ReplayRequest(audit_id=audit_id)
        return self._unary(self._audit.Replay, request, resolve_timeout(timeout_s, self.timeout_s))

    def checkpoint(self, tree_size: int = 0, *, timeout_s: TimeoutArg = UNSET) -> audit_pb2.SignedCheckpoint:
        """A signed checkpoint of the audit log's Merkle tree (0: the latest)."""
        request = audit_pb2.GetCheckpointRequest(tree_size=tree_size)
        return self._unary(self._audit.GetCheckpoint, request, resolve_timeout(timeout_s, self.timeout_s))

    def create_checkpoint(self, *, timeout_s: TimeoutArg = UNSET) -> audit_pb2.SignedCheckpoint:
        """Have the server write a checkpoint over every record committed so far, and return it."""
        request = audit_pb2.CreateCheckpointRequest()
        return self._unary(self._audit.CreateCheckpoint, request, resolve_timeout(timeout_s, self.timeout_s))

    def inclusion_proof(self, audit_id: str, tree_size: int = 0, *,
                        timeout_s: TimeoutArg = UNSET) -> audit_pb2.InclusionProof:
        """A record's ``tlog-proof`` in a signed checkpoint (0: the latest); ``verify_proof`` checks it offline."""
        request = audit_pb2.GetInclusionProofRequest(audit_id=audit_id, tree_size=tree_size)
        return self._unary(self._audit.GetInclusionProof, request, resolve_timeout(timeout_s, self.timeout_s))

    def consistency_proof(self, from_size: int, to_size: int, *,
                          timeout_s: TimeoutArg = UNSET) -> audit_pb2.ConsistencyProof:
        """The RFC 9162 proof that the log of ``from_size`` records is a prefix of the log of ``to_size``."""
        request = audit_pb2.GetConsistencyProofRequest(from_size=from_size, to_size=to_size)
        return self._unary(self._audit.GetConsistencyProof, request, resolve_timeout(timeout_s, self.timeout_s))

    def add_cosignature(self, tree_size: int, witness_vkey: str, signature_line: str, *,
                        timeout_s: TimeoutArg = UNSET) -> bool:
        """Hand a witness's cosignature of the checkpoint of ``tree_size`` to the log (False: it had one)."""
        request = audit_pb2.AddCosignatureRequest(tree_size=tree_size, witness_vkey=witness_vkey,
                                                  signature_line=signature_line)
        response = self._unary(self._audit.AddCosignature, request, resolve_timeout(timeout_s, self.timeout_s))
        return bool(response.stored)

    def wait_ready(self, timeout_s: float) -> generation_pb2.ModelInfo:
        """Poll GetModelInfo until it succeeds (server up and model loaded) or ``timeout_s`` passes.

        Raises ProctorError: DEADLINE_EXCEEDED when the server never became ready, or the first error that
        is neither UNAVAILABLE nor DEADLINE_EXCEEDED (e.g. UNIMPLEMENTED: not a Proctor server).
        """
        deadline = Deadline(timeout_s)
        request = generation_pb2.GetModelInfoRequest()
        last = "no attempt"
        while True:
            remaining = deadline.remaining() or 0.0
            try:
                return self._stub.GetModelInfo(request, timeout=max(remaining, 0.001), wait_for_ready=True)
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
            time.sleep(READY_POLL_S)

    def _unary(self, method: Callable[..., T], request: Any, timeout_s: float | None) -> T:
        deadline = Deadline(timeout_s)
        attempt = 0
        while True:
            try:
                return method(request, timeout=deadline.remaining())
            except grpc.RpcError as error:
                delay = self._policy.delay(status_code(error), attempt, deadline.remaining())
                if delay is None:
                    raise ProctorError.from_rpc_error(error) from error
            time.sleep(delay)
            attempt += 1

    def _stream(
        self, request: generation_pb2.GenerateRequest, timeout_s: float | None
    ) -> Iterator[generation_pb2.GenerateChunk]:
        deadline = Deadline(timeout_s)
        attempt = 0
        while True:
            call = self._stub.StreamGenerate(request, timeout=deadline.remaining())
            received = False
            try:
                for chunk in call:
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
            time.sleep(delay)
            attempt += 1
