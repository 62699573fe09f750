"""Plain request/result types shared by the API and the engine (no protobuf, no torch)."""

from proctor.domain.errors import (
    EngineFault,
    FieldViolation,
    Overloaded,
    RequestValidationError,
    ShuttingDown,
)
from proctor.domain.events import FinishReason, TokenAlternative, TokenDetail, TokenEvent
from proctor.domain.request import (
    ChatMessage,
    GenerationRequest,
    SamplingParams,
    StoppingParams,
)

__all__ = [
    "ChatMessage",
    "EngineFault",
    "FieldViolation",
    "FinishReason",
    "GenerationRequest",
    "Overloaded",
    "RequestValidationError",
    "SamplingParams",
    "ShuttingDown",
    "StoppingParams",
    "TokenAlternative",
    "TokenDetail",
    "TokenEvent",
]
