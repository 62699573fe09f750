"""A template's schema narrowed to one request, so what the caller fixed holds by construction.

The token mask can only produce what the schema admits, so the request's parts become schema:

* parties: the party array becomes ``prefixItems`` of one object per party (its name and role as
  ``const``, its jurisdiction too when given) with ``items: false``; a slot template (provider/client)
  gets the consts in each slot's object;
* required clauses: the clause array's first items are ``prefixItems`` with the clause ``id`` (and its
  title, given or from the template's catalogue) as ``const``; the model may add clauses after them up
  to the template's ``maxItems``;
* facts (dates, amounts, governing law): ``const`` at the fact's pointer.

Each value is first checked against the *template's* subschema for it (a 200-character party name, a
term of 500 months, a clause id that is not a clause number are the caller's errors, named by field),
so the specialised schema only ever narrows the template's: a contract valid under it is valid under
the template's schema too. The result is plain JSON Schema text, compiled and cached like any other
(the compile cache keys on the text, so a repeated specialisation compiles once).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from proctor.contracts.pointers import resolve_local, set_at
from proctor.contracts.request import ContractInputError, ContractRequest, Party, RequiredClause
from proctor.contracts.templates import ContractTemplate, FactSpec


@dataclass(frozen=True)
class Specialised:
    schema: dict[str, Any]
    schema_json: str
    schema_sha256: str  # what the responses and audit records name it by
    clauses: tuple[RequiredClause, ...]  # required clauses with their titles filled in from the catalogue
    facts: tuple[tuple[str, Any], ...]  # parsed fact values, in the template's order


def specialise(template: ContractTemplate, request: ContractRequest) -> Specialised:
    root = copy.deepcopy(template.schema.schema)
    _parties(root, template, request.parties)
    facts = _facts(root, template, request.facts)
    clauses = _clauses(root, template, request.required_clauses)
    text = json.dumps(root, ensure_ascii=False, separators=(",", ":"))
    return Specialised(root, text, hashlib.sha256(text.encode()).hexdigest(), clauses, facts)


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], field: str) -> None:
    """``value`` must satisfy the template's own subschema (local $refs resolved against ``root``)."""
    validator = jsonschema.Draft202012Validator({**schema, "$defs": root.get("$defs", {})})
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        raise ContractInputError(field, f"{value!r} does not fit the template: {error.message}")


def _property(root: dict[str, Any], item: dict[str, Any], key: str) -> dict[str, Any]:
    return resolve_local(root, "", item["properties"][key])


def _party_object(root: dict[str, Any], base: dict[str, Any], party: Party, index: int,
                  keys: tuple[str, str, str]) -> dict[str, Any]:
    name_key, role_key, jurisdiction_key = keys
    item = copy.deepcopy(base)
    _check(party.name, _property(root, base, name_key), root, f"parties[{index}].name")
    item["properties"][name_key] = {"const": party.name}
    if role_key:
        item["properties"][role_key] = {"const": party.role}
    if party.jurisdiction:
        if not jurisdiction_key or jurisdiction_key not in base.get("properties", {}):
            raise ContractInputError(f"parties[{index}].jurisdiction", "this template records no jurisdiction")
        _check(party.jurisdiction, _property(root, base, jurisdiction_key), root, f"parties[{index}].jurisdiction")
        item["properties"][jurisdiction_key] = {"const": party.jurisdiction}
    return item


def _parties(root: dict[str, Any], template: ContractTemplate, parties: tuple[Party, ...]) -> None:
    spec = template.parties
    for index, party in enumerate(parties):
        if party.role not in spec.roles:
            raise ContractInputError(f"parties[{index}].role",
                                     f"{party.role!r} is not a role of {template.ref}; roles: {', '.join(spec.roles)}")
    if spec.slots:
        roles = [p.role for p in parties]
        missing = [role for role, _ in spec.slots if role not in roles]
        if missing or len(roles) != len(set(roles)):
            raise ContractInputError("parties", f"{template.ref} needs exactly one party per role: "
                                                f"{', '.join(r for r, _ in spec.slots)}")
        for index, party in enumerate(parties):
            pointer = dict(spec.slots)[party.role]
            base = resolve_local(root, pointer)
            set_at(root, pointer, _party_object(root, base, party, index, (spec.name, "", spec.jurisdiction)))
        return
    if not spec.min_count <= len(parties) <= (spec.max_count or len(parties)):
        bound = (f"exactly {spec.min_count}" if spec.min_count == spec.max_count
                 else f"{spec.min_count} to {spec.max_count or 'any number of'}")
        raise ContractInputError("parties", f"{template.ref} takes {bound} parties, got {len(parties)}")
    array = resolve_local(root, spec.path)
    base = resolve_local(root, "", array.get("items", {}))
    items = [_party_object(root, base, party, index, (spec.name, spec.role, spec.jurisdiction))
             for index, party in enumerate(parties)]
    narrowed = {k: v for k, v in array.items() if k not in ("items", "prefixItems", "minItems", "maxItems")}
    set_at(root, spec.path, {**narrowed, "prefixItems": items, "items": False,
                             "minItems": len(items), "maxItems": len(items)})


def _fact_value(spec: FactSpec, raw: str) -> Any:
    """A fact arrives as text; the template's subschema says what type it is."""
    kind = spec.schema.get("type")
    try:
        if kind == "integer":
            return int(raw)
        if kind == "number":
            return float(raw)
        if kind == "boolean":
            return {"true": True, "false": False}[raw.lower()]
    except (ValueError, KeyError):
        raise ContractInputError(f"facts[{spec.name}]", f"{raw!r} is not a {kind}") from None
    return raw


def _facts(root: dict[str, Any], template: ContractTemplate,
           facts: tuple[tuple[str, str], ...]) -> tuple[tuple[str, Any], ...]:
    values: dict[str, Any] = {}
    for name, raw in facts:
        spec = template.fact(name)
        if spec is None:
            known = ", ".join(f.name for f in template.facts) or "none"
            raise ContractInputError(f"facts[{name}]", f"{template.ref} has no fact {name!r}; its facts: {known}")
        value = _fact_value(spec, raw)
        _check(value, spec.schema, root, f"facts[{name}]")
        set_at(root, spec.path, {"const": value})
        values[name] = value
    return tuple((f.name, values[f.name]) for f in template.facts if f.name in values)


def _clauses(root: dict[str, Any], template: ContractTemplate,
             required: tuple[RequiredClause, ...]) -> tuple[RequiredClause, ...]:
    spec = template.clauses
    if spec.max_count and len(required) > spec.max_count:
        raise ContractInputError("required_clauses", f"{template.ref} holds at most {spec.max_count} clauses, "
                                                     f"{len(required)} were required")
    array = resolve_local(root, spec.path)
    base = resolve_local(root, "", array.get("items", {}))
    seen: set[str] = set()
    filled: list[RequiredClause] = []
    prefix: list[dict[str, Any]] = []
    for index, clause in enumerate(required):
        if clause.id in seen:
            raise ContractInputError(f"required_clauses[{index}].id", f"clause {clause.id!r} is required twice")
        seen.add(clause.id)
        _check(clause.id, _property(root, base, spec.id), root, f"required_clauses[{index}].id")
        title = clause.title or spec.title_of(clause.id)
        item = copy.deepcopy(base)
        item["properties"][spec.id] = {"const": clause.id}
        if title:
            _check(title, _property(root, base, spec.title), root, f"required_clauses[{index}].title")
            item["properties"][spec.title] = {"const": title}
        prefix.append(item)
        filled.append(RequiredClause(clause.id, title))
    if prefix:
        set_at(root, spec.path, {**array, "prefixItems": prefix,
                                 "minItems": max(int(array.get("minItems", 0)), len(prefix))})
    return tuple(filled)
