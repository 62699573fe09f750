from proctor_client.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContractParty(_message.Message):
    __slots__ = ("name", "role", "jurisdiction")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    JURISDICTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    jurisdiction: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., jurisdiction: _Optional[str] = ...) -> None: ...

class RequiredClause(_message.Message):
    __slots__ = ("id", "title")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ...) -> None: ...

class DraftContractRequest(_message.Message):
    __slots__ = ("request_id", "template", "parties", "required_clauses", "facts", "language", "max_new_tokens", "seed", "temperature", "max_attempts", "forbidden_phrases", "subject_id")
    class FactsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_CLAUSES_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    FORBIDDEN_PHRASES_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    template: str
    parties: _containers.RepeatedCompositeFieldContainer[ContractParty]
    required_clauses: _containers.RepeatedCompositeFieldContainer[RequiredClause]
    facts: _containers.ScalarMap[str, str]
    language: str
    max_new_tokens: int
    seed: int
    temperature: float
    max_attempts: int
    forbidden_phrases: _containers.RepeatedScalarFieldContainer[str]
    subject_id: str
    def __init__(self, request_id: _Optional[str] = ..., template: _Optional[str] = ..., parties: _Optional[_Iterable[_Union[ContractParty, _Mapping]]] = ..., required_clauses: _Optional[_Iterable[_Union[RequiredClause, _Mapping]]] = ..., facts: _Optional[_Mapping[str, str]] = ..., language: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., temperature: _Optional[float] = ..., max_attempts: _Optional[int] = ..., forbidden_phrases: _Optional[_Iterable[str]] = ..., subject_id: _Optional[str] = ...) -> None: ...

class ClauseCheck(_message.Message):
    __slots__ = ("id", "title", "present")
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    present: bool
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., present: _Optional[bool] = ...) -> None: ...

class ContractAttempt(_message.Message):
    __slots__ = ("attempt", "audit_id", "seed", "temperature", "max_new_tokens", "repetition_penalty", "reason", "completion_tokens", "finish_reason", "valid", "errors", "total_ms", "receipt")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    audit_id: str
    seed: int
    temperature: float
    max_new_tokens: int
    repetition_penalty: float
    reason: str
    completion_tokens: int
    finish_reason: _generation_pb2.FinishReason
    valid: bool
    errors: _containers.RepeatedScalarFieldContainer[str]
    total_ms: float
    receipt: str
    def __init__(self, attempt: _Optional[int] = ..., audit_id: _Optional[str] = ..., seed: _Optional[int] = ..., temperature: _Optional[float] = ..., max_new_tokens: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., reason: _Optional[str] = ..., completion_tokens: _Optional[int] = ..., finish_reason: _Optional[_Union[_generation_pb2.FinishReason, str]] = ..., valid: _Optional[bool] = ..., errors: _Optional[_Iterable[str]] = ..., total_ms: _Optional[float] = ..., receipt: _Optional[str] = ...) -> None: ...

class DraftContractResponse(_message.Message):
    __slots__ = ("request_id", "template", "schema_ref", "contract_json", "valid", "errors", "required_clauses", "audit_id", "attempts", "schema_sha256", "language", "usage", "total_ms", "receipt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_JSON_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_CLAUSES_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SHA256_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    template: str
    schema_ref: str
    contract_json: str
    valid: bool
    errors: _containers.RepeatedScalarFieldContainer[str]
    required_clauses: _containers.RepeatedCompositeFieldContainer[ClauseCheck]
    audit_id: str
    attempts: _containers.RepeatedCompositeFieldContainer[ContractAttempt]
    schema_sha256: str
    language: str
    usage: _generation_pb2.Usage
    total_ms: float
    receipt: str
    def __init__(self, request_id: _Optional[str] = ..., template: _Optional[str] = ..., schema_ref: _Optional[str] = ..., contract_json: _Optional[str] = ..., valid: _Optional[bool] = ..., errors: _Optional[_Iterable[str]] = ..., required_clauses: _Optional[_Iterable[_Union[ClauseCheck, _Mapping]]] = ..., audit_id: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[ContractAttempt, _Mapping]]] = ..., schema_sha256: _Optional[str] = ..., language: _Optional[str] = ..., usage: _Optional[_Union[_generation_pb2.Usage, _Mapping]] = ..., total_ms: _Optional[float] = ..., receipt: _Optional[str] = ...) -> None: ...

class ListTemplatesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TemplateFact(_message.Message):
    __slots__ = ("name", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ContractTemplate(_message.Message):
    __slots__ = ("name", "version", "description", "schema_ref", "languages", "roles", "clauses", "facts", "max_clauses")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_REF_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    CLAUSES_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CLAUSES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    description: str
    schema_ref: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[str]
    clauses: _containers.RepeatedCompositeFieldContainer[RequiredClause]
    facts: _containers.RepeatedCompositeFieldContainer[TemplateFact]
    max_clauses: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., description: _Optional[str] = ..., schema_ref: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[str]] = ..., clauses: _Optional[_Iterable[_Union[RequiredClause, _Mapping]]] = ..., facts: _Optional[_Iterable[_Union[TemplateFact, _Mapping]]] = ..., max_clauses: _Optional[int] = ...) -> None: ...

class ListTemplatesResponse(_message.Message):
    __slots__ = ("templates",)
    TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    templates: _containers.RepeatedCompositeFieldContainer[ContractTemplate]
    def __init__(self, templates: _Optional[_Iterable[_Union[ContractTemplate, _Mapping]]] = ...) -> None: ...
