"""Typed sync and asyncio client for the Proctor generation service (proctor.v1.Generation).

Depends on grpcio and protobuf only; the generated stubs live in ``proctor_client.v1``.
"""

from __future__ import annotations

from proctor_client._version import __version__
from proctor_client.aio_client import AsyncProctorClient
from proctor_client.auth import tls_credentials
from proctor_client.errors import ProctorError
from proctor_client.request import build_request
from proctor_client.sync_client import ProctorClient
from proctor_client.v1.generation_pb2 import (
    ChatMessage,
    ConstraintInfo,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    GenerateResponse,
    ModelInfo,
    RegisteredSchema,
    SchemaValidation,
)

__all__ = [
    "AsyncProctorClient",
    "ChatMessage",
    "ConstraintInfo",
    "FinishReason",
    "GenerateChunk",
    "GenerateRequest",
    "GenerateResponse",
    "ModelInfo",
    "ProctorClient",
    "ProctorError",
    "RegisteredSchema",
    "SchemaValidation",
    "__version__",
    "build_request",
    "tls_credentials",
]
