"""Building a DraftContractRequest from plain values (what the client methods and the CLI take)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from proctor_client.v1 import contracts_pb2


def parse_party(text: str) -> contracts_pb2.ContractParty:
    """``"Acme Corp:disclosing"`` or ``"Acme Corp:disclosing:Delaware"`` (the name may not hold a colon)."""
    parts = [p.strip() for p in text.split(":")]
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"party {text!r}: expected NAME:ROLE or NAME:ROLE:JURISDICTION")
    return contracts_pb2.ContractParty(name=parts[0], role=parts[1], jurisdiction=parts[2] if len(parts) == 3 else "")


def parse_clause(text: str) -> contracts_pb2.RequiredClause:
    """``"4.2"`` (the template's title) or ``"4.2=Return of Materials"``."""
    clause_id, _, title = text.partition("=")
    if not clause_id.strip():
        raise ValueError(f"clause {text!r}: expected ID or ID=TITLE")
    return contracts_pb2.RequiredClause(id=clause_id.strip(), title=title.strip())


def parse_fact(text: str) -> tuple[str, str]:
    """``"term_months=24"``."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"fact {text!r}: expected NAME=VALUE")
    return name.strip(), value.strip()


def build_contract_request(
    template: str,
    parties: Iterable[str | contracts_pb2.ContractParty],
    *,
    required_clauses: Iterable[str | contracts_pb2.RequiredClause] = (),
    facts: Mapping[str, Any] | None = None,
    language: str = "",
    request_id: str = "",
    max_new_tokens: int | None = None,
    seed: int | None = None,
    temperature: float | None = None,
    max_attempts: int | None = None,
    forbidden_phrases: Iterable[str] = (),
    subject_id: str = "",
) -> contracts_pb2.DraftContractRequest:
    message = contracts_pb2.DraftContractRequest(
        request_id=request_id, template=template, language=language,
        parties=[parse_party(p) if isinstance(p, str) else p for p in parties],
        required_clauses=[parse_clause(c) if isinstance(c, str) else c for c in required_clauses],
        facts={str(k): str(v) for k, v in (facts or {}).items()}, forbidden_phrases=list(forbidden_phrases),
        subject_id=subject_id)
    for name, value in (("max_new_tokens", max_new_tokens), ("seed", seed), ("temperature", temperature),
                        ("max_attempts", max_attempts)):
        if value is not None:
            setattr(message, name, value)
    return message
