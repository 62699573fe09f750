"""A contract draft request as the service sees it, once converted from the wire (no protobuf here)."""

from __future__ import annotations

from dataclasses import dataclass


class ContractInputError(ValueError):
    """The caller's request cannot be drafted; ``field`` names the request field (INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Party:
    name: str
    role: str
    jurisdiction: str = ""


@dataclass(frozen=True)
class RequiredClause:
    id: str
    title: str = ""  # empty: the template's catalogue title for the id, else the model writes one


@dataclass(frozen=True)
class ContractRequest:
    request_id: str
    template: str  # "contract/nda" (latest) or "contract/nda@1"
    parties: tuple[Party, ...]
    required_clauses: tuple[RequiredClause, ...] = ()
    facts: tuple[tuple[str, str], ...] = ()
    language: str = "en"
    max_new_tokens: int | None = None  # None: the template's
    seed: int | None = None
    temperature: float | None = None  # None or 0: greedy first attempt
    max_attempts: int | None = None  # None: the template's; 1: no repair
    forbidden: tuple[str, ...] = ()
    subject_id: str = ""  # whose data the draft holds (audit erasure): every attempt's record is sealed under it
