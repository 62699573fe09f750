"""Contract templates, schema specialisation, the server's check and the repair plan (no model needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from proctor.constraints.registry import SchemaRegistry
from proctor.contracts.attempt_plans import (
    LENGTH_GROWTH,
    REPETITION_PENALTY,
    RETRY_TEMPERATURE,
    check_contract,
    first_plan,
    generation_request,
    next_plan,
    render_messages,
)
from proctor.contracts.request import ContractInputError, ContractRequest, Party, RequiredClause
from proctor.contracts.specialise import specialise
from proctor.contracts.templates import TemplateError, TemplateRegistry, default_template_directory
from proctor.domain import FinishReason
from proctor.domain.seeds import attempt_seed

SCHEMAS = SchemaRegistry.load()
TEMPLATES = TemplateRegistry.load(SCHEMAS)
NDA = TEMPLATES.resolve("contract/nda")
SERVICE = TEMPLATES.resolve("contract/service-agreement@1")


def nda_request(**changes: object) -> ContractRequest:
    base = ContractRequest("r1", "contract/nda", (Party("Acme Corp", "disclosing", "Delaware"),
                                                  Party("Beta LLC", "receiving")),
                           (RequiredClause("4.2"), RequiredClause("7", "Law")), (("term_months", "24"),))
    return ContractRequest(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def nda_document(**changes: object) -> dict[str, object]:
    document: dict[str, object] = {
        "title": "NDA", "effective_date": "2026-01-01", "term_months": 24, "governing_law": "Delaware",
        "confidential_information": "Everything.",
        "parties": [{"name": "Acme Corp", "jurisdiction": "Delaware", "role": "disclosing"},
                    {"name": "Beta LLC", "jurisdiction": "Ohio", "role": "receiving"}],
        "clauses": [{"id": "4.2", "title": "Return of Materials", "text": "Return them."},
                    {"id": "7", "title": "Law", "text": "Delaware law."}]}
    document.update(changes)
    return document


def test_the_shipped_templates_load_with_their_pinned_schemas() -> None:
    assert [t.ref for t in TEMPLATES.list()] == ["contract/nda@1", "contract/service-agreement@1"]
    assert NDA.schema.ref == "contract/nda@1" and NDA.parties.roles == ("disclosing", "receiving", "both")
    assert {code for code, _ in NDA.languages} == {"en", "zh"}
    assert SERVICE.parties.roles == ("provider", "client")
    assert NDA.clauses.title_of("4.2") == "Return of Materials" and NDA.clauses.max_count == 4


def test_a_specialised_schema_holds_the_required_parts_by_construction() -> None:
    specialised = specialise(NDA, nda_request())
    validator = jsonschema.Draft202012Validator(specialised.schema)
    assert validator.is_valid(nda_document())
    assert specialised.clauses == (RequiredClause("4.2", "Return of Materials"), RequiredClause("7", "Law"))
    rejected = [
        nda_document(clauses=[{"id": "7", "title": "Law", "text": "x"}]),  # 4.2 missing
        nda_document(clauses=[{"id": "7", "title": "Law", "text": "x"},
                              {"id": "4.2", "title": "Return of Materials", "text": "x"}]),  # out of order
        nda_document(term_months=12),  # the fact
        nda_document(parties=[{"name": "Acme Corp", "jurisdiction": "Delaware", "role": "receiving"},
                              {"name": "Beta LLC", "jurisdiction": "Ohio", "role": "receiving"}]),  # the role
        nda_document(parties=[{"name": "Acme Inc", "jurisdiction": "Delaware", "role": "disclosing"},
                              {"name": "Beta LLC", "jurisdiction": "Ohio", "role": "receiving"}]),  # the name
    ]
    for document in rejected:
        assert not validator.is_valid(document), document


def test_a_specialised_schema_only_narrows_the_templates() -> None:
    """Whatever the specialised schema accepts, the template's schema accepts too (checked on variations)."""
    specialised = jsonschema.Draft202012Validator(specialise(NDA, nda_request()).schema)
    base = jsonschema.Draft202012Validator(NDA.schema.schema)
    variations = [nda_document(), nda_document(clauses=nda_document()["clauses"] + [  # type: ignore[operator]
        {"id": "9", "title": "Extra", "text": "More."}]), nda_document(title="")]
    for document in variations:
        if specialised.is_valid(document):
            assert base.is_valid(document), document
    assert not specialised.is_valid(variations[2]) and not base.is_valid(variations[2])


def test_slot_templates_fix_each_party_in_its_slot() -> None:
    request = ContractRequest("r", "contract/service-agreement", (Party("Fab", "provider", "Delaware"),
                                                                   Party("Tail", "client")),
                              facts=(("currency", "EUR"), ("fee_amount", "1200")))
    schema = specialise(SERVICE, request).schema
    assert schema["properties"]["provider"]["properties"]["name"] == {"const": "Fab"}
    assert schema["properties"]["client"]["properties"]["name"] == {"const": "Tail"}
    assert schema["properties"]["fees"]["properties"]["amount"] == {"const": 1200}
    with pytest.raises(ContractInputError) as error:
        specialise(SERVICE, ContractRequest("r", "x", (Party("A", "provider"), Party("B", "provider"))))
    assert error.value.field == "parties"


@pytest.mark.parametrize(("changes", "field"), [
    ({"parties": (Party("A", "boss"), Party("B", "both"))}, "parties[0].role"),
    ({"parties": (Party("A", "both"),)}, "parties"),
    ({"parties": (Party("A" * 61, "both"), Party("B", "both"))}, "parties[0].name"),
    ({"required_clauses": (RequiredClause("x.1"),)}, "required_clauses[0].id"),
    ({"required_clauses": (RequiredClause("1"), RequiredClause("1"))}, "required_clauses[1].id"),
    ({"required_clauses": tuple(RequiredClause(str(n)) for n in range(1, 6))}, "required_clauses"),
    ({"required_clauses": (RequiredClause("9", "T" * 51),)}, "required_clauses[0].title"),
    ({"facts": (("term_months", "500"),)}, "facts[term_months]"),
    ({"facts": (("term_months", "two"),)}, "facts[term_months]"),
    ({"facts": (("colour", "red"),)}, "facts[colour]"),
    ({"facts": (("effective_date", "2026-02-31x"),)}, "facts[effective_date]"),
])
def test_what_the_template_cannot_hold_is_named_by_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ContractInputError) as error:
        specialise(NDA, nda_request(**changes))
    assert error.value.field == field and error.value.message


def test_the_check_reports_each_required_clause() -> None:
    specialised = specialise(NDA, nda_request())
    good = check_contract(json.dumps(nda_document()), NDA, specialised)
    assert good.valid and not good.errors and [c.present for c in good.clauses] == [True, True]
    missing = check_contract(json.dumps(nda_document(clauses=[{"id": "7", "title": "Law", "text": "x"}])), NDA,
                             specialised)
    assert not missing.valid and [c.present for c in missing.clauses] == [False, True]
    assert any("4.2" in e for e in missing.errors)
    cut = check_contract(json.dumps(nda_document())[:-20], NDA, specialised)
    assert not cut.valid and "not complete JSON" in cut.errors[0]


def test_the_repair_plan_answers_what_went_wrong() -> None:
    first = first_plan(NDA, nda_request(), seed=5, limit=4096)
    assert (first.number, first.seed, first.temperature, first.max_new_tokens) == (1, 5, 0.0, NDA.max_new_tokens)
    longer = next_plan(first, FinishReason.LENGTH, 5, 4096)
    assert longer.max_new_tokens == int(NDA.max_new_tokens * LENGTH_GROWTH) and longer.seed == attempt_seed(5, 2)
    assert next_plan(first, FinishReason.LENGTH, 5, NDA.max_new_tokens).temperature == RETRY_TEMPERATURE  # capped
    looped = next_plan(longer, FinishReason.REPETITION, 5, 4096)
    assert looped.repetition_penalty == REPETITION_PENALTY and looped.temperature == RETRY_TEMPERATURE
    assert looped.number == 3 and "repeated" in looped.reason
    request = generation_request(nda_request(), NDA, specialise(NDA, nda_request()), looped,
                                 render_messages(NDA, nda_request(), specialise(NDA, nda_request())), None)
    assert request.sampling.repetition_penalty == REPETITION_PENALTY and request.stopping.max_new_tokens == \
        longer.max_new_tokens and request.constraint is not None and request.request_id == "r1#3"


def test_the_prompt_names_every_part_in_the_requested_language() -> None:
    request = nda_request(language="zh")
    messages = render_messages(NDA, request, specialise(NDA, request))
    assert messages[0].role == "system" and "合同" in messages[0].content
    assert [m.role for m in messages[1:]] == ["user", "assistant", "user"]
    assert all(part in messages[-1].content for part in ("Acme Corp (disclosing, Delaware)", "4.2 Return of Materials",
                                                         "7 Law", "term_months: 24"))


def _copy_templates(tmp_path: Path) -> Path:
    target = tmp_path / "templates"
    for path in default_template_directory().rglob("*.toml"):
        destination = target / path.relative_to(default_template_directory())
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return target


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda t: t.replace('schema = "contract/nda@1"', 'schema = "contract/nda"'), "pinned"),
    (lambda t: t.replace('schema = "contract/nda@1"', 'schema = "contract/nda@9"'), "versions"),
    (lambda t: t.replace('path = "/properties/clauses"', 'path = "/properties/clause"'), "nothing at"),
    (lambda t: t.replace("Draft a {title} as JSON.", "Draft a {tilte} as JSON.", 1), "unknown prompt field"),
    (lambda t: t.replace('"term_months":12', '"term_months":500', 1), "does not validate"),
    (lambda t: "colour = 'red'\n" + t, "unknown keys"),
])
def test_a_bad_template_stops_the_load_naming_its_file(tmp_path: Path, edit, reason: str) -> None:  # type: ignore[no-untyped-def]
    root = _copy_templates(tmp_path)
    path = root / "contract" / "nda" / "1.toml"
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(TemplateError) as error:
        TemplateRegistry.load(SCHEMAS, root)
    assert error.value.path == path and reason in error.value.reason


def test_a_new_version_is_a_new_file_and_latest_is_the_highest(tmp_path: Path) -> None:
    root = _copy_templates(tmp_path)
    text = (root / "contract" / "nda" / "1.toml").read_text(encoding="utf-8")
    (root / "contract" / "nda" / "10.toml").write_text(copy.copy(text).replace("Mutual Non-Disclosure", "NDA"),
                                                       encoding="utf-8")
    registry = TemplateRegistry.load(SCHEMAS, root)
    assert registry.resolve("contract/nda").version == "10" and registry.resolve("contract/nda@1").version == "1"
    with pytest.raises(KeyError, match="has the versions 1, 10"):
        registry.resolve("contract/nda@2")


def test_a_span_the_masks_forced_is_not_a_loop() -> None:
    """A schema const such as 25000 spells its zeros whatever the model prefers: no repetition stop there."""
    from proctor.decoding.stopping import repetition_stop
    from proctor.domain import RepetitionParams

    params = RepetitionParams(4, 3)
    zeros = [17, 15, 15, 15]
    assert repetition_stop(params, zeros) is not None
    assert repetition_stop(params, zeros, [False, True, True, True]) is None
    assert repetition_stop(params, zeros, [False, True, False, True]) is not None  # the model chose one of them


# A published template never changes (an audit record's "name@version" must always mean the same prompts):
# its bytes are pinned here. Changing a prompt means a new file (2.toml) and a new line below.
PUBLISHED = {
    "contract/nda/1.toml": "bc8fa093983246d137d4990d7aca969827d9fc1bb3dd2554da704404cf8bdce4",
    "contract/service-agreement/1.toml": "c38d9a474d8efc8a35c37f69f315d066eebe8fe2c742e07a75432cf0d597dde4",
}


def test_published_templates_are_immutable() -> None:
    import hashlib

    shipped = {p.relative_to(default_template_directory()).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in default_template_directory().rglob("*.toml")}
    changed = {name for name, digest in PUBLISHED.items() if shipped.get(name) != digest}
    assert not changed, f"published templates changed (add a new version file instead): {sorted(changed)}"
    unpinned = set(shipped) - set(PUBLISHED)
    assert not unpinned, f"pin the new template versions in PUBLISHED: {sorted(unpinned)}"
