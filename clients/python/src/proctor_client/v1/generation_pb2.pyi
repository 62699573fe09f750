from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BeamEarlyStopping(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BEAM_EARLY_STOPPING_UNSPECIFIED: _ClassVar[BeamEarlyStopping]
    BEAM_EARLY_STOPPING_HEURISTIC: _ClassVar[BeamEarlyStopping]
    BEAM_EARLY_STOPPING_WHEN_FULL: _ClassVar[BeamEarlyStopping]
    BEAM_EARLY_STOPPING_NEVER: _ClassVar[BeamEarlyStopping]

class ModerationDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODERATION_DECISION_UNSPECIFIED: _ClassVar[ModerationDecision]
    MODERATION_DECISION_ALLOW: _ClassVar[ModerationDecision]
    MODERATION_DECISION_BLOCK: _ClassVar[ModerationDecision]

class GrammarSyntax(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAMMAR_SYNTAX_UNSPECIFIED: _ClassVar[GrammarSyntax]
    GRAMMAR_SYNTAX_LARK: _ClassVar[GrammarSyntax]
    GRAMMAR_SYNTAX_EBNF: _ClassVar[GrammarSyntax]

class Speculation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPECULATION_UNSPECIFIED: _ClassVar[Speculation]
    SPECULATION_ON: _ClassVar[Speculation]
    SPECULATION_OFF: _ClassVar[Speculation]

class ContextOverflow(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTEXT_OVERFLOW_UNSPECIFIED: _ClassVar[ContextOverflow]
    CONTEXT_OVERFLOW_REFUSE: _ClassVar[ContextOverflow]
    CONTEXT_OVERFLOW_DROP_OLDEST_TURNS: _ClassVar[ContextOverflow]
    CONTEXT_OVERFLOW_KEEP_START_AND_END: _ClassVar[ContextOverflow]

class ConstraintBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSTRAINT_BACKEND_UNSPECIFIED: _ClassVar[ConstraintBackend]
    CONSTRAINT_BACKEND_AUTO: _ClassVar[ConstraintBackend]
    CONSTRAINT_BACKEND_XGRAMMAR: _ClassVar[ConstraintBackend]
    CONSTRAINT_BACKEND_LLGUIDANCE: _ClassVar[ConstraintBackend]
    CONSTRAINT_BACKEND_OUTLINES: _ClassVar[ConstraintBackend]

class JsonWhitespace(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JSON_WHITESPACE_UNSPECIFIED: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_COMPACT: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_FLEXIBLE: _ClassVar[JsonWhitespace]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP_STRING: _ClassVar[FinishReason]
    FINISH_REASON_STOP_TOKEN: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_DEADLINE: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
    FINISH_REASON_CONSTRAINT_COMPLETE: _ClassVar[FinishReason]
    FINISH_REASON_DEAD_END: _ClassVar[FinishReason]
    FINISH_REASON_FORBIDDEN_PHRASE: _ClassVar[FinishReason]
    FINISH_REASON_REPETITION: _ClassVar[FinishReason]
    FINISH_REASON_STOP_CRITERION: _ClassVar[FinishReason]
    FINISH_REASON_BLOCKED: _ClassVar[FinishReason]
    FINISH_REASON_MODERATED: _ClassVar[FinishReason]
    FINISH_REASON_CLOSED_AT_BUDGET: _ClassVar[FinishReason]

class FormatHandling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FORMAT_HANDLING_UNSPECIFIED: _ClassVar[FormatHandling]
    FORMAT_HANDLING_ENFORCED: _ClassVar[FormatHandling]
    FORMAT_HANDLING_VALIDATED: _ClassVar[FormatHandling]
    FORMAT_HANDLING_ANNOTATION: _ClassVar[FormatHandling]
BEAM_EARLY_STOPPING_UNSPECIFIED: BeamEarlyStopping
BEAM_EARLY_STOPPING_HEURISTIC: BeamEarlyStopping
BEAM_EARLY_STOPPING_WHEN_FULL: BeamEarlyStopping
BEAM_EARLY_STOPPING_NEVER: BeamEarlyStopping
MODERATION_DECISION_UNSPECIFIED: ModerationDecision
MODERATION_DECISION_ALLOW: ModerationDecision
MODERATION_DECISION_BLOCK: ModerationDecision
GRAMMAR_SYNTAX_UNSPECIFIED: GrammarSyntax
GRAMMAR_SYNTAX_LARK: GrammarSyntax
GRAMMAR_SYNTAX_EBNF: GrammarSyntax
SPECULATION_UNSPECIFIED: Speculation
SPECULATION_ON: Speculation
SPECULATION_OFF: Speculation
CONTEXT_OVERFLOW_UNSPECIFIED: ContextOverflow
CONTEXT_OVERFLOW_REFUSE: ContextOverflow
CONTEXT_OVERFLOW_DROP_OLDEST_TURNS: ContextOverflow
CONTEXT_OVERFLOW_KEEP_START_AND_END: ContextOverflow
CONSTRAINT_BACKEND_UNSPECIFIED: ConstraintBackend
CONSTRAINT_BACKEND_AUTO: ConstraintBackend
CONSTRAINT_BACKEND_XGRAMMAR: ConstraintBackend
CONSTRAINT_BACKEND_LLGUIDANCE: ConstraintBackend
CONSTRAINT_BACKEND_OUTLINES: ConstraintBackend
JSON_WHITESPACE_UNSPECIFIED: JsonWhitespace
JSON_WHITESPACE_COMPACT: JsonWhitespace
JSON_WHITESPACE_FLEXIBLE: JsonWhitespace
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP_STRING: FinishReason
FINISH_REASON_STOP_TOKEN: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_DEADLINE: FinishReason
FINISH_REASON_ERROR: FinishReason
FINISH_REASON_CONSTRAINT_COMPLETE: FinishReason
FINISH_REASON_DEAD_END: FinishReason
FINISH_REASON_FORBIDDEN_PHRASE: FinishReason
FINISH_REASON_REPETITION: FinishReason
FINISH_REASON_STOP_CRITERION: FinishReason
FINISH_REASON_BLOCKED: FinishReason
FINISH_REASON_MODERATED: FinishReason
FINISH_REASON_CLOSED_AT_BUDGET: FinishReason
FORMAT_HANDLING_UNSPECIFIED: FormatHandling
FORMAT_HANDLING_ENFORCED: FormatHandling
FORMAT_HANDLING_VALIDATED: FormatHandling
FORMAT_HANDLING_ANNOTATION: FormatHandling

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages", "tools_json")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools_json: str
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools_json: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "no_repeat_ngram_size", "seed", "typical_p", "greedy_first_tokens", "forced_tokens", "num_beams", "length_penalty", "early_stopping", "first_tokens_temperature")
    class ForcedTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    NO_REPEAT_NGRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TYPICAL_P_FIELD_NUMBER: _ClassVar[int]
    GREEDY_FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_BEAMS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    EARLY_STOPPING_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKENS_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    no_repeat_ngram_size: int
    seed: int
    typical_p: float
    greedy_first_tokens: int
    forced_tokens: _containers.ScalarMap[int, int]
    num_beams: int
    length_penalty: float
    early_stopping: BeamEarlyStopping
    first_tokens_temperature: float
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., no_repeat_ngram_size: _Optional[int] = ..., seed: _Optional[int] = ..., typical_p: _Optional[float] = ..., greedy_first_tokens: _Optional[int] = ..., forced_tokens: _Optional[_Mapping[int, int]] = ..., num_beams: _Optional[int] = ..., length_penalty: _Optional[float] = ..., early_stopping: _Optional[_Union[BeamEarlyStopping, str]] = ..., first_tokens_temperature: _Optional[float] = ...) -> None: ...

class ReturnedSequence(_message.Message):
    __slots__ = ("token_ids", "text", "score", "finish_reason", "audit_id", "tokens", "receipt")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    score: float
    finish_reason: FinishReason
    audit_id: str
    tokens: _containers.RepeatedCompositeFieldContainer[TokenDetail]
    receipt: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., audit_id: _Optional[str] = ..., tokens: _Optional[_Iterable[_Union[TokenDetail, _Mapping]]] = ..., receipt: _Optional[str] = ...) -> None: ...

class StoppingParams(_message.Message):
    __slots__ = ("max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "ignore_eos", "repetition", "must_include", "close_at_budget")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    MUST_INCLUDE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_AT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    min_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    repetition: RepetitionStop
    must_include: _containers.RepeatedScalarFieldContainer[str]
    close_at_budget: bool
    def __init__(self, max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., repetition: _Optional[_Union[RepetitionStop, _Mapping]] = ..., must_include: _Optional[_Iterable[str]] = ..., close_at_budget: _Optional[bool] = ...) -> None: ...

class RepetitionStop(_message.Message):
    __slots__ = ("ngram_size", "repeats")
    NGRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    ngram_size: int
    repeats: int
    def __init__(self, ngram_size: _Optional[int] = ..., repeats: _Optional[int] = ...) -> None: ...

class ForbiddenPhrases(_message.Message):
    __slots__ = ("phrases", "case_insensitive", "whole_word")
    PHRASES_FIELD_NUMBER: _ClassVar[int]
    CASE_INSENSITIVE_FIELD_NUMBER: _ClassVar[int]
    WHOLE_WORD_FIELD_NUMBER: _ClassVar[int]
    phrases: _containers.RepeatedScalarFieldContainer[str]
    case_insensitive: bool
    whole_word: bool
    def __init__(self, phrases: _Optional[_Iterable[str]] = ..., case_insensitive: _Optional[bool] = ..., whole_word: _Optional[bool] = ...) -> None: ...

class PluginCall(_message.Message):
    __slots__ = ("name", "params")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class PluginInfo(_message.Message):
    __slots__ = ("name", "version", "kind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    kind: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class ModerationVerdict(_message.Message):
    __slots__ = ("name", "version", "kind", "decision", "score", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    kind: str
    decision: ModerationDecision
    score: float
    reason: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., kind: _Optional[str] = ..., decision: _Optional[_Union[ModerationDecision, str]] = ..., score: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "messages", "sampling", "stopping", "top_logprobs", "token_details", "json_schema", "regex", "choice", "grammar", "schema_ref", "constraint_backend", "json_whitespace", "constraint_exact_only", "forbidden", "logit_bias", "allowed_token_ids", "logits_processors", "stopping_criteria", "confidence", "context_overflow", "input_screens", "output_moderators", "num_return_sequences", "speculation", "cache_prompt", "subject_id", "reasoning", "chat_template_kwargs_json")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_DETAILS_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_BACKEND_FIELD_NUMBER: _ClassVar[int]
    JSON_WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_EXACT_ONLY_FIELD_NUMBER: _ClassVar[int]
    FORBIDDEN_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGITS_PROCESSORS_FIELD_NUMBER: _ClassVar[int]
    STOPPING_CRITERIA_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCREENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_MODERATORS_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURN_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    CACHE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    messages: ChatMessages
    sampling: SamplingParams
    stopping: StoppingParams
    top_logprobs: int
    token_details: bool
    json_schema: str
    regex: str
    choice: ChoiceConstraint
    grammar: GrammarConstraint
    schema_ref: str
    constraint_backend: ConstraintBackend
    json_whitespace: JsonWhitespace
    constraint_exact_only: bool
    forbidden: ForbiddenPhrases
    logit_bias: _containers.ScalarMap[int, float]
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logits_processors: _containers.RepeatedCompositeFieldContainer[PluginCall]
    stopping_criteria: _containers.RepeatedCompositeFieldContainer[PluginCall]
    confidence: bool
    context_overflow: ContextOverflow
    input_screens: _containers.RepeatedCompositeFieldContainer[PluginCall]
    output_moderators: _containers.RepeatedCompositeFieldContainer[PluginCall]
    num_return_sequences: int
    speculation: Speculation
    cache_prompt: bool
    subject_id: str
    reasoning: Reasoning
    chat_template_kwargs_json: str
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., stopping: _Optional[_Union[StoppingParams, _Mapping]] = ..., top_logprobs: _Optional[int] = ..., token_details: _Optional[bool] = ..., json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[ChoiceConstraint, _Mapping]] = ..., grammar: _Optional[_Union[GrammarConstraint, _Mapping]] = ..., schema_ref: _Optional[str] = ..., constraint_backend: _Optional[_Union[ConstraintBackend, str]] = ..., json_whitespace: _Optional[_Union[JsonWhitespace, str]] = ..., constraint_exact_only: _Optional[bool] = ..., forbidden: _Optional[_Union[ForbiddenPhrases, _Mapping]] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., logits_processors: _Optional[_Iterable[_Union[PluginCall, _Mapping]]] = ..., stopping_criteria: _Optional[_Iterable[_Union[PluginCall, _Mapping]]] = ..., confidence: _Optional[bool] = ..., context_overflow: _Optional[_Union[ContextOverflow, str]] = ..., input_screens: _Optional[_Iterable[_Union[PluginCall, _Mapping]]] = ..., output_moderators: _Optional[_Iterable[_Union[PluginCall, _Mapping]]] = ..., num_return_sequences: _Optional[int] = ..., speculation: _Optional[_Union[Speculation, str]] = ..., cache_prompt: _Optional[bool] = ..., subject_id: _Optional[str] = ..., reasoning: _Optional[_Union[Reasoning, _Mapping]] = ..., chat_template_kwargs_json: _Optional[str] = ...) -> None: ...

class Reasoning(_message.Message):
    __slots__ = ("enabled", "max_tokens", "exclude")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    max_tokens: int
    exclude: bool
    def __init__(self, enabled: _Optional[bool] = ..., max_tokens: _Optional[int] = ..., exclude: _Optional[bool] = ...) -> None: ...

class ChoiceConstraint(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, options: _Optional[_Iterable[str]] = ...) -> None: ...

class GrammarConstraint(_message.Message):
    __slots__ = ("syntax", "text")
    SYNTAX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    syntax: GrammarSyntax
    text: str
    def __init__(self, syntax: _Optional[_Union[GrammarSyntax, str]] = ..., text: _Optional[str] = ...) -> None: ...

class PromptTruncation(_message.Message):
    __slots__ = ("policy", "original_prompt_tokens", "prompt_tokens", "dropped_messages", "dropped_tokens")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    policy: ContextOverflow
    original_prompt_tokens: int
    prompt_tokens: int
    dropped_messages: int
    dropped_tokens: int
    def __init__(self, policy: _Optional[_Union[ContextOverflow, str]] = ..., original_prompt_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., dropped_messages: _Optional[int] = ..., dropped_tokens: _Optional[int] = ...) -> None: ...

class SchemaValidation(_message.Message):
    __slots__ = ("valid", "errors")
    VALID_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, valid: _Optional[bool] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class ConstraintInfo(_message.Message):
    __slots__ = ("kind", "backend", "spec_sha256", "schema_ref", "cache_hit", "compile_ms", "exact", "relaxed_keywords", "formats", "remembered_keywords")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SPEC_SHA256_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    COMPILE_MS_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    RELAXED_KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    FORMATS_FIELD_NUMBER: _ClassVar[int]
    REMEMBERED_KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    backend: str
    spec_sha256: str
    schema_ref: str
    cache_hit: bool
    compile_ms: float
    exact: bool
    relaxed_keywords: _containers.RepeatedScalarFieldContainer[str]
    formats: _containers.RepeatedCompositeFieldContainer[FormatUse]
    remembered_keywords: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., backend: _Optional[str] = ..., spec_sha256: _Optional[str] = ..., schema_ref: _Optional[str] = ..., cache_hit: _Optional[bool] = ..., compile_ms: _Optional[float] = ..., exact: _Optional[bool] = ..., relaxed_keywords: _Optional[_Iterable[str]] = ..., formats: _Optional[_Iterable[_Union[FormatUse, _Mapping]]] = ..., remembered_keywords: _Optional[_Iterable[str]] = ...) -> None: ...

class FormatUse(_message.Message):
    __slots__ = ("path", "format", "handling")
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    HANDLING_FIELD_NUMBER: _ClassVar[int]
    path: str
    format: str
    handling: FormatHandling
    def __init__(self, path: _Optional[str] = ..., format: _Optional[str] = ..., handling: _Optional[_Union[FormatHandling, str]] = ...) -> None: ...

class GenerationAttempt(_message.Message):
    __slots__ = ("attempt", "seed", "temperature", "completion_tokens", "finish_reason", "valid", "errors")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    seed: int
    temperature: float
    completion_tokens: int
    finish_reason: FinishReason
    valid: bool
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, attempt: _Optional[int] = ..., seed: _Optional[int] = ..., temperature: _Optional[float] = ..., completion_tokens: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., valid: _Optional[bool] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "decode_steps", "drafted_tokens", "accepted_tokens", "closing_tokens", "reasoning_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLOSING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    decode_steps: int
    drafted_tokens: int
    accepted_tokens: int
    closing_tokens: int
    reasoning_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., decode_steps: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., closing_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "text", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    text: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenDetail(_message.Message):
    __slots__ = ("token_id", "text", "logprob", "final_logprob", "top_logprobs", "removed_by")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    FINAL_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_BY_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    text: str
    logprob: float
    final_logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    removed_by: str
    def __init__(self, token_id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ..., final_logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., removed_by: _Optional[str] = ...) -> None: ...

class Confidence(_message.Message):
    __slots__ = ("tokens", "mean_token_probability", "min_token_probability", "mean_top2_gap", "min_top2_gap")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_TOKEN_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKEN_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    MEAN_TOP2_GAP_FIELD_NUMBER: _ClassVar[int]
    MIN_TOP2_GAP_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    mean_token_probability: float
    min_token_probability: float
    mean_top2_gap: float
    min_top2_gap: float
    def __init__(self, tokens: _Optional[int] = ..., mean_token_probability: _Optional[float] = ..., min_token_probability: _Optional[float] = ..., mean_top2_gap: _Optional[float] = ..., min_top2_gap: _Optional[float] = ...) -> None: ...

class PhraseInclusion(_message.Message):
    __slots__ = ("phrase", "included")
    PHRASE_FIELD_NUMBER: _ClassVar[int]
    INCLUDED_FIELD_NUMBER: _ClassVar[int]
    phrase: str
    included: bool
    def __init__(self, phrase: _Optional[str] = ..., included: _Optional[bool] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "time_to_first_token_ms", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "tokens", "timings", "seed", "audit_id", "finish_detail", "schema_validation", "constraint", "plugins", "attempts", "confidence", "must_include", "prompt_truncation", "moderation", "sequences", "receipt", "reasoning_text")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MUST_INCLUDE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    MODERATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    REASONING_TEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    tokens: _containers.RepeatedCompositeFieldContainer[TokenDetail]
    timings: Timings
    seed: int
    audit_id: str
    finish_detail: str
    schema_validation: SchemaValidation
    constraint: ConstraintInfo
    plugins: _containers.RepeatedCompositeFieldContainer[PluginInfo]
    attempts: _containers.RepeatedCompositeFieldContainer[GenerationAttempt]
    confidence: Confidence
    must_include: _containers.RepeatedCompositeFieldContainer[PhraseInclusion]
    prompt_truncation: PromptTruncation
    moderation: _containers.RepeatedCompositeFieldContainer[ModerationVerdict]
    sequences: _containers.RepeatedCompositeFieldContainer[ReturnedSequence]
    receipt: str
    reasoning_text: str
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., tokens: _Optional[_Iterable[_Union[TokenDetail, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., seed: _Optional[int] = ..., audit_id: _Optional[str] = ..., finish_detail: _Optional[str] = ..., schema_validation: _Optional[_Union[SchemaValidation, _Mapping]] = ..., constraint: _Optional[_Union[ConstraintInfo, _Mapping]] = ..., plugins: _Optional[_Iterable[_Union[PluginInfo, _Mapping]]] = ..., attempts: _Optional[_Iterable[_Union[GenerationAttempt, _Mapping]]] = ..., confidence: _Optional[_Union[Confidence, _Mapping]] = ..., must_include: _Optional[_Iterable[_Union[PhraseInclusion, _Mapping]]] = ..., prompt_truncation: _Optional[_Union[PromptTruncation, _Mapping]] = ..., moderation: _Optional[_Iterable[_Union[ModerationVerdict, _Mapping]]] = ..., sequences: _Optional[_Iterable[_Union[ReturnedSequence, _Mapping]]] = ..., receipt: _Optional[str] = ..., reasoning_text: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "tokens", "finish_reason", "usage", "timings", "seed", "audit_id", "finish_detail", "schema_validation", "constraint", "plugins", "attempts", "confidence", "must_include", "prompt_truncation", "moderation", "sequences", "receipt", "reasoning_text")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MUST_INCLUDE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    MODERATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    REASONING_TEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    tokens: _containers.RepeatedCompositeFieldContainer[TokenDetail]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    seed: int
    audit_id: str
    finish_detail: str
    schema_validation: SchemaValidation
    constraint: ConstraintInfo
    plugins: _containers.RepeatedCompositeFieldContainer[PluginInfo]
    attempts: _containers.RepeatedCompositeFieldContainer[GenerationAttempt]
    confidence: Confidence
    must_include: _containers.RepeatedCompositeFieldContainer[PhraseInclusion]
    prompt_truncation: PromptTruncation
    moderation: _containers.RepeatedCompositeFieldContainer[ModerationVerdict]
    sequences: _containers.RepeatedCompositeFieldContainer[ReturnedSequence]
    receipt: str
    reasoning_text: str
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., tokens: _Optional[_Iterable[_Union[TokenDetail, _Mapping]]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., seed: _Optional[int] = ..., audit_id: _Optional[str] = ..., finish_detail: _Optional[str] = ..., schema_validation: _Optional[_Union[SchemaValidation, _Mapping]] = ..., constraint: _Optional[_Union[ConstraintInfo, _Mapping]] = ..., plugins: _Optional[_Iterable[_Union[PluginInfo, _Mapping]]] = ..., attempts: _Optional[_Iterable[_Union[GenerationAttempt, _Mapping]]] = ..., confidence: _Optional[_Union[Confidence, _Mapping]] = ..., must_include: _Optional[_Iterable[_Union[PhraseInclusion, _Mapping]]] = ..., prompt_truncation: _Optional[_Union[PromptTruncation, _Mapping]] = ..., moderation: _Optional[_Iterable[_Union[ModerationVerdict, _Mapping]]] = ..., sequences: _Optional[_Iterable[_Union[ReturnedSequence, _Mapping]]] = ..., receipt: _Optional[str] = ..., reasoning_text: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "weights_sha256", "tokenizer_sha256", "dtype", "device", "context_length_tokens", "vocab_size", "eos_token_ids", "pad_token_id", "bos_token_id", "server_version", "max_new_tokens_limit", "default_max_new_tokens", "weights", "weights_revision", "runner", "sampler_revision", "prefill_chunk_tokens", "batch_invariant", "model_signature", "model_signer", "reasoning_parser", "closing_revision")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_SHA256_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PAD_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_REVISION_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_REVISION_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BATCH_INVARIANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIGNER_FIELD_NUMBER: _ClassVar[int]
    REASONING_PARSER_FIELD_NUMBER: _ClassVar[int]
    CLOSING_REVISION_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    weights_sha256: str
    tokenizer_sha256: str
    dtype: str
    device: str
    context_length_tokens: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    pad_token_id: int
    bos_token_id: int
    server_version: str
    max_new_tokens_limit: int
    default_max_new_tokens: int
    weights: str
    weights_revision: int
    runner: str
    sampler_revision: int
    prefill_chunk_tokens: int
    batch_invariant: bool
    model_signature: str
    model_signer: str
    reasoning_parser: str
    closing_revision: int
    def __init__(self, model_id: _Optional[str] = ..., weights_sha256: _Optional[str] = ..., tokenizer_sha256: _Optional[str] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., context_length_tokens: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., pad_token_id: _Optional[int] = ..., bos_token_id: _Optional[int] = ..., server_version: _Optional[str] = ..., max_new_tokens_limit: _Optional[int] = ..., default_max_new_tokens: _Optional[int] = ..., weights: _Optional[str] = ..., weights_revision: _Optional[int] = ..., runner: _Optional[str] = ..., sampler_revision: _Optional[int] = ..., prefill_chunk_tokens: _Optional[int] = ..., batch_invariant: _Optional[bool] = ..., model_signature: _Optional[str] = ..., model_signer: _Optional[str] = ..., reasoning_parser: _Optional[str] = ..., closing_revision: _Optional[int] = ...) -> None: ...

class ListSchemasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisteredSchema(_message.Message):
    __slots__ = ("name", "version", "description", "schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    description: str
    schema: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., description: _Optional[str] = ..., schema: _Optional[str] = ...) -> None: ...

class ListSchemasResponse(_message.Message):
    __slots__ = ("schemas",)
    SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    schemas: _containers.RepeatedCompositeFieldContainer[RegisteredSchema]
    def __init__(self, schemas: _Optional[_Iterable[_Union[RegisteredSchema, _Mapping]]] = ...) -> None: ...
