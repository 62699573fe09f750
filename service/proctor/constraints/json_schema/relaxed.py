"""The validated fallback's superset: a schema with what an engine would not enforce dropped.

Every keyword the guard (``support``) reports for the engine is dropped where it stands,
and every ``oneOf`` is read as ``anyOf`` ("at least one" for "exactly one"). Dropping an
assertion in a positive position can only admit more instances; the guard never looks below
``not`` or ``if`` (no engine enforces them, so they go whole), so no drop lands in a negative
position. Keywords whose meaning depends on a sibling (``additionalProperties`` on
``properties``, ``items`` on ``prefixItems``) go with it. The property test (every instance valid
before is valid after, on the Test Suite and MaskBench) is in tests/unit/test_schema_rewrite.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema.keywords import NEGATIVE, pointer_tokens, resolve_pointer
from proctor.constraints.json_schema.support import POLICIES, Problem, describe, prepare_schema, problems_for
from proctor.constraints.json_schema.walk import Site, reachable

MAX_RELAX_PASSES = 8
# Dropping one of these changes what its siblings mean (additionalProperties reads properties'
# names, items follows prefixItems): the siblings go too, so the result stays a superset.
DROP_WITH = {
    "properties": ("additionalProperties", "unevaluatedProperties"),
    "patternProperties": ("additionalProperties", "unevaluatedProperties"),
    "prefixItems": ("items", "unevaluatedItems"),
    "items": ("unevaluatedItems",),
    "contains": ("minContains", "maxContains"),
    "if": ("then", "else"),
}
# What the coarse relaxation drops besides: keywords whose combinations an engine checks itself
# and may refuse (overlapping patternProperties, intersections of regexes it cannot decide).
COARSE = ("patternProperties", "pattern", "propertyNames")
# Problems no superset can stand in for: a nested $id re-bases the references below it.
UNRELAXABLE = frozenset({"$id", "(not a schema)"})


@dataclass(frozen=True, slots=True)
class Relaxed:
    """The superset an engine enforces in place of a schema, and what was relaxed to get it."""

    schema: object
    relaxed: tuple[Problem, ...]


def relax(schema: object, backend: str, *, coarse: bool = False) -> Relaxed:
    """The schema with every keyword ``backend`` would not enforce dropped: a superset (see module doc).

    ``coarse`` also drops the keywords an engine may still refuse in combination (``COARSE``: its own
    checks, e.g. llguidance's "patternProperty regexes are not disjoint"): the second try.
    Raises ConstraintError when a problem has no superset (a nested ``$id`` that re-bases refs).
    """
    policy = POLICIES[backend]
    current = prepare_schema(schema)
    current, relaxed = _one_of_as_any_of(current)
    if coarse:
        found = [(site.path, kw) for site in _positive_sites(current) if isinstance(site.node, dict)
                 for kw in COARSE if kw in site.node]
        current = _drop(current, found)
        relaxed += found
    for _ in range(MAX_RELAX_PASSES):
        problems = problems_for(current, policy)
        if not problems:
            return Relaxed(current, tuple(relaxed))
        positive = {site.path for site in _positive_sites(current)}
        blocked = [p for p in problems if p[1] in UNRELAXABLE or p[0] not in positive]
        if blocked:
            raise ConstraintError(describe(blocked) + " (no validated fallback: it cannot be relaxed)", backend)
        current = _drop(current, problems)
        relaxed += problems
    raise ConstraintError("the schema could not be relaxed into one the engine enforces", backend)


def _positive_sites(schema: object) -> list[Site]:
    """Subschemas reachable without passing through ``not`` or ``if`` (a node also reached from
    inside one is still positive: those keywords are dropped whole, so only its positive uses stay)."""
    sites = list(reachable(schema))
    negative = frozenset((site.path, kw) for site in sites if isinstance(site.node, dict)
                         for kw in NEGATIVE if kw in site.node)
    return list(reachable(schema, skip=negative))


def _one_of_as_any_of(schema: object) -> tuple[object, list[Problem]]:
    """Every remaining ``oneOf`` read as ``anyOf`` (a superset: "at least one" for "exactly one")."""
    out = copy.deepcopy(schema)
    changed: list[Problem] = []
    paths = sorted((s.path for s in _positive_sites(out) if isinstance(s.node, dict) and "oneOf" in s.node),
                   key=lambda p: -len(pointer_tokens(p)))
    for path in paths:
        node = resolve_pointer(out, path)
        if not isinstance(node, dict) or not isinstance(node.get("oneOf"), list):
            continue
        branches = node.pop("oneOf")
        if "anyOf" in node:
            node.setdefault("allOf", []).append({"anyOf": branches})
        else:
            node["anyOf"] = branches
        changed.append((path, "oneOf"))
    return out, changed


def _drop(schema: object, problems: list[Problem]) -> object:
    out = copy.deepcopy(schema)
    for path, kw in sorted(problems, key=lambda p: -len(pointer_tokens(p[0]))):
        node = resolve_pointer(out, path)
        if isinstance(node, dict):
            for key in (kw, *DROP_WITH.get(kw, ())):
                node.pop(key, None)
    return out
