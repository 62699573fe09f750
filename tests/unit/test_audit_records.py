"""Building records: every parameter survives the round trip replay relies on, and the privacy policy
keeps prompt and output out of the record."""

from __future__ import annotations

import dataclasses
import json

import pytest

from proctor.audit.canonical import canonical
from proctor.audit.records import CallRecord, PrivacyPolicy, build_body, request_from_dict, request_to_dict
from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    FinishReason,
    ForbiddenParams,
    GenerationRequest,
    PluginCall,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
    TokenAlternative,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.events import Usage

REQUEST = GenerationRequest(
    request_id="r1", messages=(ChatMessage("user", "Secret plan: buy Acme"),),
    sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=None, repetition_penalty=1.1),
    stopping=StoppingParams(max_new_tokens=9, stop=("END",), repetition=RepetitionParams(4, 3)),
    constraint=ConstraintRequest("choice", options=("yes", "no")), forbidden=ForbiddenParams(("acme",), True, True),
    logit_bias=((5, -100.0),), allowed_token_ids=(1, 2), top_logprobs=2,
    logits_processors=(PluginCall("phrase_bias", {"phrases": ["x"]}, "logits_processors[0]"),),
    audit_top_n=5, audited=True)
EVENTS = [
    TokenEvent("r1", (7,), "ye", (TokenDetail(7, "ye", -0.1, -0.05, (TokenAlternative(7, "ye", -0.1),), "", 2),)),
    TokenEvent("r1", (8,), "s", (TokenDetail(8, "s", -0.2, -0.01, (), "forbidden", 1),),
               finish_reason=FinishReason.CONSTRAINT_COMPLETE, usage=Usage(5, 2), seed=2**63 - 5),
]


def call(**kw: object) -> CallRecord:
    base = CallRecord(audit_id="a1", method="Generate", received_ms=1, caller={"identity": "peer"}, model={},
                      request=REQUEST, rendered_prompt="<|user|>Secret plan: buy Acme", prompt_tokens=5,
                      events=list(EVENTS))
    for key, value in kw.items():
        setattr(base, key, value)
    return base


def test_every_parameter_round_trips_with_the_seed_used() -> None:
    data = json.loads(canonical(request_to_dict(REQUEST, 2**63 - 5)))  # through canonical JSON, as stored
    rebuilt = request_from_dict(data, "r1")
    assert rebuilt.sampling.seed == 2**63 - 5
    assert rebuilt == dataclasses.replace(REQUEST, sampling=dataclasses.replace(REQUEST.sampling, seed=2**63 - 5))


def test_a_record_from_before_close_at_budget_replays_without_it() -> None:
    """Records written before the field existed were generated without the budget rule: rebuilt without it, so
    their replay takes the same tokens; a new record keeps what it ran with."""
    data = json.loads(canonical(request_to_dict(REQUEST, 3)))
    assert data["stopping"]["close_at_budget"] is True and request_from_dict(data, "r1").stopping.close_at_budget
    del data["stopping"]["close_at_budget"]
    assert request_from_dict(data, "r1").stopping.close_at_budget is False


def test_full_policy_keeps_text_and_tokens() -> None:
    body = json.loads(canonical(build_body(call(), 2, PrivacyPolicy())))
    assert body["prompt"] == {"policy": "full", "text": "<|user|>Secret plan: buy Acme", "tokens": 5}
    assert body["output"] == {"policy": "full", "text": "yes"}
    assert [(t["id"], t["allowed"], t["removed_by"]) for t in body["tokens"]] == [(7, 2, ""), (8, 1, "forbidden")]
    assert body["finish"]["reason"] == "constraint_complete" and body["request"]["sampling"]["seed"] == str(2**63 - 5)


def test_hmac_policy_keeps_no_prompt_or_output_text() -> None:
    policy = PrivacyPolicy("hmac", "hmac", b"k" * 32)
    raw = canonical(build_body(call(), 2, policy)).decode()
    for secret in ("Secret plan", "buy Acme", '"ye"'):  # (the choice options are the constraint, not output)
        assert secret not in raw, secret
    body = json.loads(raw)
    assert body["prompt"]["hmac_sha256"] == policy.digest("<|user|>Secret plan: buy Acme")
    assert body["output"]["hmac_sha256"] == policy.digest("yes")
    assert body["tokens"][0]["id_hmac"] == policy.digest("7") and "id" not in body["tokens"][0]
    assert body["request"]["messages"] is None


def test_a_policy_needs_its_key() -> None:
    with pytest.raises(ValueError, match="key"):
        PrivacyPolicy("hmac", "full", None)
    with pytest.raises(ValueError, match="full"):
        PrivacyPolicy("partial", "full", None)
