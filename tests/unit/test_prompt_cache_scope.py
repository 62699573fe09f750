"""Which prompts may outlive their request in the prefix cache (api/audited_calls.AuditedCalls.admit).

The privacy rules: a caller's chunks live in its own namespace; its callers-file entry decides, and without
one the server does: on, unless prompts are kept out of the audit trail (``--audit-prompt-policy hmac``); a
request's ``cache_prompt: false`` always wins. A request without a namespace reads and leaves nothing
(engine/prefix_cache.py; tests/integration/test_fewer_steps_real.py checks the engine side)."""

from __future__ import annotations

import pytest
from helpers.engine import tiny_settings

from proctor.api.audit_trail import AuditTrail
from proctor.api.audited_calls import AuditedCalls
from proctor.api.call_info import CallInfo, Identity
from proctor.api.callers import Caller
from proctor.audit.records import CallRecord, PrivacyPolicy
from proctor.domain import GenerationRequest


def scope(policy: str, caller: Caller | None, cache_prompt: bool = True) -> str | None:
    runner: AuditedCalls[object] = AuditedCalls(tiny_settings(audit_prompt_policy=policy, audit=False),
                                            AuditTrail(None, PrivacyPolicy(), compliance=False, top_n=0))
    info = CallInfo(identity=Identity(caller, "token") if caller is not None else None)
    request = runner.admit(GenerationRequest(request_id="r", prompt="Hi", cache_prompt=cache_prompt),
                           CallRecord(audit_id="", method="Generate", received_ms=0, caller={}, model={}), info)
    return request.prefix_cache_scope


def caller(name: str, prompt_cache: bool | None) -> Caller:
    return Caller(name=name, roles=frozenset({"generate"}), token_sha256="0" * 64, prompt_cache=prompt_cache)


@pytest.mark.parametrize(("policy", "who", "expected"), [
    ("full", None, ""),  # open server: one shared namespace
    ("hmac", None, None),
    ("full", caller("alice", None), "alice"),
    ("hmac", caller("alice", None), None),
    ("hmac", caller("alice", True), "alice"),
    ("full", caller("alice", False), None),
])
def test_the_namespace_follows_the_caller_then_the_server(policy: str, who: Caller | None,
                                                          expected: str | None) -> None:
    assert scope(policy, who) == expected


def test_a_request_that_asks_for_no_caching_gets_none_whoever_calls() -> None:
    assert scope("full", None, cache_prompt=False) is None
    assert scope("full", caller("alice", True), cache_prompt=False) is None
