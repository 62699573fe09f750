"""Plain request/result types shared by the API and the engine (no protobuf, no torch)."""

from proctor.domain.errors import (
    EngineFault,
    FieldViolation,
    Overloaded,
    RequestValidationError,
    ShuttingDown,
)
from proctor.domain.events import (
    Attempt,
    Confidence,
    ConstraintSummary,
    FinishReason,
    FormatUse,
    PhraseInclusion,
    PluginInfo,
    SchemaCheck,
    TokenAlternative,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.request import (
    ChatMessage,
    ConstraintRequest,
    ForbiddenParams,
    GenerationRequest,
    PluginCall,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
)

__all__ = [
    "Attempt",
    "ChatMessage",
    "Confidence",
    "ConstraintRequest",
    "ConstraintSummary",
    "EngineFault",
    "FieldViolation",
    "FinishReason",
    "ForbiddenParams",
    "FormatUse",
    "GenerationRequest",
    "Overloaded",
    "PhraseInclusion",
    "PluginCall",
    "PluginInfo",
    "RepetitionParams",
    "RequestValidationError",
    "SamplingParams",
    "SchemaCheck",
    "ShuttingDown",
    "StoppingParams",
    "TokenAlternative",
    "TokenDetail",
    "TokenEvent",
]
