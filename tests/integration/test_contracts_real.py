"""Contract drafting over gRPC with the real model: required clauses by construction, the audit record of each
attempt, exact replay, a tight budget closed valid, Chinese end to end, and input errors named by field."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import grpc
import pytest
from helpers.oracles import assert_valid_json, registered_schema

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import audit_pb2, audit_pb2_grpc
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def audit(server: object) -> audit_pb2_grpc.AuditStub:
    channel = grpc.insecure_channel(server.address)  # type: ignore[attr-defined]
    yield audit_pb2_grpc.AuditStub(channel)
    channel.close()


def record(audit: audit_pb2_grpc.AuditStub, audit_id: str) -> dict[str, Any]:
    return json.loads(audit.GetRecord(audit_pb2.GetRecordRequest(audit_id=audit_id)).record_json)


def test_an_nda_holds_every_required_clause_party_and_fact(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    response = client.draft_contract(
        "contract/nda", parties=["Acme Corp:disclosing:Delaware", "Beta LLC:receiving"],
        required_clauses=["4.2", "7=Governing Law"], facts={"term_months": 24, "governing_law": "State of New York"},
        request_id="nda-1", timeout_s=300)
    assert response.valid, list(response.errors)
    assert response.template == "contract/nda@1" and response.schema_ref == "contract/nda@1"
    contract = assert_valid_json(response.contract_json, registered_schema(client, response.schema_ref))
    assert [(c["id"], c["title"]) for c in contract["clauses"][:2]] == [("4.2", "Return of Materials"),
                                                                        ("7", "Governing Law")]
    assert [(p["name"], p["role"]) for p in contract["parties"]] == [("Acme Corp", "disclosing"),
                                                                     ("Beta LLC", "receiving")]
    assert contract["parties"][0]["jurisdiction"] == "Delaware"
    assert contract["term_months"] == 24 and contract["governing_law"] == "State of New York"
    assert [(c.id, c.present) for c in response.required_clauses] == [("4.2", True), ("7", True)]
    assert len(response.attempts) == 1 and response.attempts[0].audit_id == response.audit_id

    stored = record(audit, response.audit_id)
    assert stored["method"] == "DraftContract" and stored["request_id"] == "nda-1#1"
    assert stored["contract"]["template"] == "contract/nda@1" and stored["contract"]["attempt"] == 1
    assert stored["contract"]["required_clauses"] == [{"id": "4.2", "title": "Return of Materials"},
                                                      {"id": "7", "title": "Governing Law"}]
    assert stored["contract"]["check"]["valid"] is True
    assert stored["contract"]["schema_sha256"] == response.schema_sha256
    assert stored["output"]["text"] == response.contract_json
    replay = audit.Replay(audit_pb2.ReplayRequest(audit_id=response.audit_id), timeout=300)
    assert replay.exact_match, replay.message


def test_a_draft_at_a_tight_budget_is_closed_valid_with_every_required_clause(client: ProctorClient, audit) -> None:  # type: ignore[no-untyped-def]
    """Issue 45: the clause text that runs long is closed, every required clause still listed; a budget below the
    shortest valid contract is refused naming the contract's own field, and a closed attempt replays exactly."""
    parts: dict[str, Any] = {"parties": ["Fabrikam Inc:provider:Delaware", "Tailspin LLC:client"],
                             "required_clauses": ["5", "7"], "timeout_s": 300}
    with pytest.raises(ProctorError) as refused:
        client.draft_contract("contract/service-agreement", max_new_tokens=10, request_id="sa-small", **parts)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.field_violations[0][0] == "max_new_tokens", refused.value.field_violations
    minimum = int(re.search(r"ask for at least (\d+)", str(refused.value)).group(1))  # type: ignore[union-attr]
    response = client.draft_contract("contract/service-agreement", max_new_tokens=minimum + 12,
                                     request_id="sa-tight", **parts)
    (attempt,) = response.attempts
    assert attempt.finish_reason == pb.FINISH_REASON_CLOSED_AT_BUDGET and response.valid, list(response.errors)
    assert [c.id for c in response.required_clauses if c.present] == ["5", "7"]
    assert_valid_json(response.contract_json, registered_schema(client, response.schema_ref))
    stored = record(audit, response.audit_id)
    assert stored["finish"]["reason"] == "closed_at_budget" and stored["usage"]["closing_tokens"] > 0
    replay = audit.Replay(audit_pb2.ReplayRequest(audit_id=response.audit_id), timeout=300)
    assert replay.exact_match, replay.message


def test_a_chinese_contract_comes_out_whole(client: ProctorClient, audit, model_dir) -> None:  # type: ignore[no-untyped-def]
    response = client.draft_contract(
        "contract/nda", language="zh",
        parties=["上海星辰科技有限公司:disclosing:上海", "北京云图数据有限公司:receiving:北京"],
        required_clauses=["3=保密期限", "7=争议解决"], facts={"governing_law": "中华人民共和国法律"},
        forbidden_phrases=["信息"], request_id="nda-zh", timeout_s=300)
    assert response.valid, list(response.errors)
    contract = assert_valid_json(response.contract_json, registered_schema(client, response.schema_ref))
    assert [c["title"] for c in contract["clauses"][:2]] == ["保密期限", "争议解决"]
    assert "\ufffd" not in response.contract_json and "信息" not in response.contract_json
    assert unicodedata.is_normalized("NFC", response.contract_json)
    stored = record(audit, response.audit_id)
    # The text is the whole token sequence decoded at once: the incremental detokenizer added no space and
    # split no character.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.decode([t["id"] for t in stored["tokens"]]) == response.contract_json
    assert stored["contract"]["language"] == "zh"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"template": "contract/lease"}, "template"),
    ({"parties": ["A:boss", "B:both"]}, "parties[0].role"),
    ({"required_clauses": ["1", "2", "3", "4", "5"]}, "required_clauses"),
    ({"facts": {"term_months": 500}}, "facts[term_months]"),
    ({"language": "fr"}, "language"),
    ({"template": "contract/service-agreement", "language": "zh",
      "parties": ["A:provider", "B:client"]}, "language"),
])
def test_what_cannot_be_drafted_is_invalid_argument_naming_the_field(client: ProctorClient, kwargs: dict[str, Any],
                                                                     field: str) -> None:
    arguments: dict[str, Any] = {"template": "contract/nda", "parties": ["A:both", "B:both"], **kwargs}
    with pytest.raises(ProctorError) as error:
        client.draft_contract(arguments.pop("template"), **arguments, timeout_s=30)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in error.value.field_violations] == [field]


def test_list_templates_describes_what_a_caller_may_fill_in(client: ProctorClient) -> None:
    templates = {f"{t.name}@{t.version}": t for t in client.list_templates()}
    nda = templates["contract/nda@1"]
    assert list(nda.roles) == ["disclosing", "receiving", "both"] and list(nda.languages) == ["en", "zh"]
    assert {f.name for f in nda.facts} == {"effective_date", "term_months", "governing_law"}
    assert ("4.2", "Return of Materials") in [(c.id, c.title) for c in nda.clauses] and nda.max_clauses == 4


def test_a_contract_bundle_is_checked_offline_by_a_counterparty(server, audit_db, tmp_path,  # type: ignore[no-untyped-def]
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor contract draft --out C --proof-out P --checkpoint-now`, then, with only the two files and the
    log's published key, `proctor-client verify-proof P --contract C`; an edited contract is refused."""
    from pathlib import Path

    from proctor.audit.chain import load_or_create_signing_key, log_signer
    from proctor.cli import main
    from proctor_client.cli import main as client_main

    contract, proof = tmp_path / "nda.json", tmp_path / "nda.tlog-proof"
    status = main(["contract", "draft", "--template", "contract/nda", "--party", "Acme Corp:disclosing",
                   "--party", "Beta LLC:receiving", "--fact", "term_months=12", "--addr", server.address,
                   "--out", str(contract), "--proof-out", str(proof), "--checkpoint-now"])
    assert status == 0 and proof.exists(), capsys.readouterr().err
    vkey = log_signer(load_or_create_signing_key(Path(f"{audit_db}.key"))).verifier.vkey()
    capsys.readouterr()
    assert client_main(["verify-proof", str(proof), "--public-key", vkey, "--contract", str(contract)]) == 0
    out = capsys.readouterr().out
    assert "ok    contract:" in out and "VERIFIED" in out
    edited = json.loads(contract.read_text())
    edited["term_months"] = 36
    contract.write_text(json.dumps(edited))
    assert client_main(["verify-proof", str(proof), "--public-key", vkey, "--contract", str(contract)]) == 1
    assert "NOT VERIFIED: the contract check failed" in capsys.readouterr().out
