from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class CreateCheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("tree_size",)
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    tree_size: int
    def __init__(self, tree_size: _Optional[int] = ...) -> None: ...

class SignedCheckpoint(_message.Message):
    __slots__ = ("note", "origin", "tree_size", "root_hash")
    NOTE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    note: str
    origin: str
    tree_size: int
    root_hash: bytes
    def __init__(self, note: _Optional[str] = ..., origin: _Optional[str] = ..., tree_size: _Optional[int] = ..., root_hash: _Optional[bytes] = ...) -> None: ...

class GetInclusionProofRequest(_message.Message):
    __slots__ = ("audit_id", "tree_size")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    tree_size: int
    def __init__(self, audit_id: _Optional[str] = ..., tree_size: _Optional[int] = ...) -> None: ...

class InclusionProof(_message.Message):
    __slots__ = ("tlog_proof", "index", "tree_size", "path")
    TLOG_PROOF_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    tlog_proof: str
    index: int
    tree_size: int
    path: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, tlog_proof: _Optional[str] = ..., index: _Optional[int] = ..., tree_size: _Optional[int] = ..., path: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetConsistencyProofRequest(_message.Message):
    __slots__ = ("from_size", "to_size")
    FROM_SIZE_FIELD_NUMBER: _ClassVar[int]
    TO_SIZE_FIELD_NUMBER: _ClassVar[int]
    from_size: int
    to_size: int
    def __init__(self, from_size: _Optional[int] = ..., to_size: _Optional[int] = ...) -> None: ...

class ConsistencyProof(_message.Message):
    __slots__ = ("from_size", "to_size", "hashes")
    FROM_SIZE_FIELD_NUMBER: _ClassVar[int]
    TO_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    from_size: int
    to_size: int
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, from_size: _Optional[int] = ..., to_size: _Optional[int] = ..., hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

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
    __slots__ = ("since_ms", "until_ms", "caller", "request_id", "finish_reason", "kind")
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    since_ms: int
    until_ms: int
    caller: str
    request_id: str
    finish_reason: str
    kind: str
    def __init__(self, since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., caller: _Optional[str] = ..., request_id: _Optional[str] = ..., finish_reason: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

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

class AddCosignatureRequest(_message.Message):
    __slots__ = ("tree_size", "witness_vkey", "signature_line")
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    WITNESS_VKEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_LINE_FIELD_NUMBER: _ClassVar[int]
    tree_size: int
    witness_vkey: str
    signature_line: str
    def __init__(self, tree_size: _Optional[int] = ..., witness_vkey: _Optional[str] = ..., signature_line: _Optional[str] = ...) -> None: ...

class AddCosignatureResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    def __init__(self, stored: _Optional[bool] = ...) -> None: ...
