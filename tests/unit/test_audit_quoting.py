"""Fields that quote content (issue 54, part 3): a canary planted in each is sealed with the record's content and
gone with its key, and the ``hmac`` policy leaves none of it readable; what an auditor needs stays in the clear.
(The same through a real server and ``proctor audit erase``: tests/integration/test_erasure_canary_real.py.)"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from proctor.audit.canonical import canonical
from proctor.audit.keystore import FileKeyStore
from proctor.audit.records import (
    CallRecord,
    PrivacyPolicy,
    build_body,
    recorded_subject,
    request_from_dict,
    request_to_dict,
    subject_of,
)
from proctor.audit.sealing import open_body, seal
from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    FinishReason,
    ForbiddenParams,
    GenerationRequest,
    StoppingParams,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.events import Attempt, ModerationVerdict, PhraseInclusion, SchemaCheck, Usage

CANARY = "Canary" + secrets.token_hex(6)


def canary(field: str) -> str:
    return f"{CANARY}-{field}"


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "const": canary("const"),
                                                    "default": canary("default"), "examples": [canary("examples")]},
                                           "kind": {"enum": [canary("enum"), "other"]}}}
REQUEST = GenerationRequest(
    request_id="r1", messages=(ChatMessage("user", canary("prompt")),),
    stopping=StoppingParams(max_new_tokens=9, stop=(canary("stop"),), must_include=(canary("must-include"),)),
    constraint=ConstraintRequest("json_schema", text=json.dumps(SCHEMA)),
    forbidden=ForbiddenParams((canary("forbidden"),)), subject_id="alice")
FINAL = TokenEvent(
    "r1", (8,), "}", (TokenDetail(8, "}", -0.2, -0.01),), finish_reason=FinishReason.STOP_STRING,
    finish_detail=f"stop string {canary('detail')!r}", usage=Usage(5, 2), seed=3,
    schema_check=SchemaCheck(False, (f"at $.name: {canary('validation')!r} was expected",), (("$.name", "const"),)),
    must_include=(PhraseInclusion(canary("must-include"), True),),
    attempts=(Attempt(1, 3, 0.0, 2, FinishReason.STOP_STRING, False, (canary("attempt"),)),))
EVENTS = [TokenEvent("r1", (7,), canary("output"), (TokenDetail(7, canary("token"), -0.1, -0.05),)), FINAL]


def call(**kw: object) -> CallRecord:
    base = CallRecord(audit_id="a1", method="Generate", received_ms=1, caller={"identity": "svc"}, model={},
                      request=REQUEST, rendered_prompt=canary("rendered"), prompt_tokens=5, events=list(EVENTS),
                      status_code="INVALID_ARGUMENT", status_message=f"unknown role {canary('status')!r}",
                      moderation=(ModerationVerdict("m", "1", "output_moderator", "allow", 0.1, canary("reason")),),
                      moderation_reply=None)
    for key, value in kw.items():
        setattr(base, key, value)
    return base


def planted(text: str) -> list[str]:
    return sorted({part.split("-", 1)[1].split("'")[0].split('"')[0] for part in text.split(CANARY)[1:]})


def test_a_sealed_record_holds_no_canary_in_the_clear_and_opens_to_every_one(tmp_path: Path) -> None:
    body = json.loads(canonical(build_body(call(), 2, PrivacyPolicy())))
    assert len(planted(canonical(body).decode())) >= 14  # the canaries are there before sealing
    keys = FileKeyStore(tmp_path / "keys")
    key_id, key = keys.key_for("alice", "2026-12-07", "svc")
    sealed = json.loads(canonical(seal(body, key_id, key)))
    assert planted(canonical(sealed).decode()) == []
    readable = {"status": sealed["status"]["code"], "finish": sealed["finish"]["reason"],
                "valid": sealed["schema_validation"]["valid"], "sites": sealed["schema_validation"]["sites"]}
    assert readable == {"status": "INVALID_ARGUMENT", "finish": "stop_string", "valid": False,
                        "sites": [{"path": "$.name", "keyword": "const"}]}
    assert open_body(sealed, keys) == body
    keys.destroy(key_id)
    erased = open_body(sealed, keys)
    assert planted(canonical(erased).decode()) == [] and erased["erased"] == {"key_id": key_id}
    assert erased["status"] == {"code": "INVALID_ARGUMENT", "message": None} and erased["finish"]["detail"] is None


def test_a_record_without_quotes_seals_to_the_shape_it_had(tmp_path: Path) -> None:
    body = json.loads(canonical(build_body(call(status_code="OK", status_message="", events=[EVENTS[0]],
                                                moderation=()), 2, PrivacyPolicy())))
    keys = FileKeyStore(tmp_path / "keys")
    key_id, key = keys.key_for("alice", "2026-12-07", "svc")
    sealed = seal(body, key_id, key)
    assert sealed["status"] == {"code": "OK", "message": ""}
    assert open_body(sealed, keys) == body


def test_the_hmac_policy_leaves_no_canary_readable() -> None:
    policy = PrivacyPolicy("hmac", "hmac", b"k" * 32)
    raw_call = call(request=None, raw_request={"messages": [{"role": canary("raw"), "content": "x"}]})
    for record in (call(), raw_call):
        text = canonical(build_body(record, 2, policy)).decode()
        assert planted(text) == [], planted(text)
    body = build_body(call(), 2, policy)
    assert body["request"]["stopping"]["stop"] == ["hmac-sha256:" + policy.digest(canary("stop"))]
    schema = json.loads(body["request"]["constraint"]["text"])
    assert schema["properties"]["name"]["type"] == "string"  # the structure stays; the data is digested
    assert body["schema_validation"]["sites"] == [{"path": "$.name", "keyword": "const"}]


def test_one_prompt_policy_scrubs_what_quotes_the_input_and_keeps_the_output() -> None:
    body = build_body(call(), 2, PrivacyPolicy("hmac", "full", b"k" * 32))
    assert planted(json.dumps(body["request"])) == []
    assert body["output"]["text"] == canary("output") + "}"
    assert body["status"]["message"].startswith("hmac-sha256:")  # a refusal may quote either


def test_a_record_belongs_to_its_subject_and_a_replay_keeps_it() -> None:
    data = json.loads(canonical(request_to_dict(REQUEST, 3)))
    assert request_from_dict(data, "replay-1").subject_id == "alice"
    assert recorded_subject({"request": data, "caller": {"identity": "auditor"}}) == "alice"
    older = {**data, "subject_id": ""}  # before the server filled it in: the caller was the subject
    assert recorded_subject({"request": older, "caller": {"identity": "svc"}}) == "svc"
    assert subject_of(REQUEST, {"identity": "svc"}) == "alice"
    assert subject_of(None, {"identity": "svc"}, {"subjectId": "bob"}) == "bob"
    assert subject_of(None, {"identity": "svc"}, {"subjectId": "x" * 300}) == "svc"
