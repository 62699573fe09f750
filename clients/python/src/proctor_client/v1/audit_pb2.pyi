from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetRecordRequest(_message.Message):
    __slots__ = ("audit_id",)
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    def __init__(self, audit_id: _Optional[str] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("seq", "audit_id", "record_json", "hash", "prev_hash")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_JSON_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    audit_id: str
    record_json: str
    hash: str
    prev_hash: str
    def __init__(self, seq: _Optional[int] = ..., audit_id: _Optional[str] = ..., record_json: _Optional[str] = ..., hash: _Optional[str] = ..., prev_hash: _Optional[str] = ...) -> None: ...

class ExportRecordsRequest(_message.Message):
    __slots__ = ("since_ms", "until_ms", "caller", "request_id", "finish_reason")
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    since_ms: int
    until_ms: int
    caller: str
    request_id: str
    finish_reason: str
    def __init__(self, since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., caller: _Optional[str] = ..., request_id: _Optional[str] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class VerifyLogRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VerifyLogResponse(_message.Message):
    __slots__ = ("ok", "records", "checkpoints", "first_bad_seq", "problem", "seconds")
    OK_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    FIRST_BAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    records: int
    checkpoints: int
    first_bad_seq: int
    problem: str
    seconds: float
    def __init__(self, ok: _Optional[bool] = ..., records: _Optional[int] = ..., checkpoints: _Optional[int] = ..., first_bad_seq: _Optional[int] = ..., problem: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class ReplayRequest(_message.Message):
    __slots__ = ("audit_id",)
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    def __init__(self, audit_id: _Optional[str] = ...) -> None: ...

class ReplayResponse(_message.Message):
    __slots__ = ("exact_match", "steps_compared", "first_divergent_step", "recorded_token_id", "replayed_token_id", "recorded_token_text", "replayed_token_text", "max_logprob_drift", "recorded_finish_reason", "replayed_finish_reason", "message", "replay_audit_id")
    EXACT_MATCH_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMPARED_FIELD_NUMBER: _ClassVar[int]
    FIRST_DIVERGENT_STEP_FIELD_NUMBER: _ClassVar[int]
    RECORDED_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDED_TOKEN_TEXT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_TOKEN_TEXT_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROB_DRIFT_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    exact_match: bool
    steps_compared: int
    first_divergent_step: int
    recorded_token_id: int
    replayed_token_id: int
    recorded_token_text: str
    replayed_token_text: str
    max_logprob_drift: float
    recorded_finish_reason: str
    replayed_finish_reason: str
    message: str
    replay_audit_id: str
    def __init__(self, exact_match: _Optional[bool] = ..., steps_compared: _Optional[int] = ..., first_divergent_step: _Optional[int] = ..., recorded_token_id: _Optional[int] = ..., replayed_token_id: _Optional[int] = ..., recorded_token_text: _Optional[str] = ..., replayed_token_text: _Optional[str] = ..., max_logprob_drift: _Optional[float] = ..., recorded_finish_reason: _Optional[str] = ..., replayed_finish_reason: _Optional[str] = ..., message: _Optional[str] = ..., replay_audit_id: _Optional[str] = ...) -> None: ...
