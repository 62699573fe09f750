"""Every subschema of a schema, by JSON pointer, including the targets of local ``$ref``s.

One walk for the guard, the relaxation and the final touches, so none of them misses a subschema
that is reached only through a reference into an unknown container (OpenAPI's
``#/components/schemas/X``). References are followed once each; cycles end the walk there.
Negative positions (``not``, ``if``) are reported so callers can stay out of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from proctor.constraints.schema_keywords import NEGATIVE, pointer, pointer_tokens, resolve_pointer, subschemas


@dataclass(frozen=True, slots=True)
class Site:
    """A subschema and where it is (``negative``: under ``not`` or ``if`` somewhere on the way)."""

    path: str
    node: object
    negative: bool


def reachable(root: object, *, skip: frozenset[tuple[str, str]] = frozenset()) -> Iterator[Site]:
    """Each subschema once (first path found), depth-first; ``skip``: (path, keyword) not to enter."""
    seen: set[str] = set()
    stack: list[Site] = [Site("#", root, False)]
    while stack:
        site = stack.pop()
        if site.path in seen:
            continue
        seen.add(site.path)
        yield site
        node = site.node
        if not isinstance(node, dict):
            continue
        children = []
        for tokens, sub in subschemas(node):
            if (site.path, str(tokens[0])) in skip:
                continue
            children.append(Site(pointer(site.path, *tokens), sub, site.negative or tokens[0] in NEGATIVE))
        ref = node.get("$ref")
        if isinstance(ref, str) and (site.path, "$ref") not in skip:
            target = resolve_pointer(root, ref)
            if target is not None:
                children.append(Site(canonical_pointer(ref), target, site.negative))
        stack.extend(reversed(children))


def canonical_pointer(ref: str) -> str:
    """``#/a/b`` spelled as ``pointer`` spells it (so a path reached two ways compares equal)."""
    return pointer("#", *pointer_tokens(ref))


def node_at(root: object, path: str) -> object | None:
    return resolve_pointer(root, path)


def contains_ref(node: object) -> bool:
    """Whether any ``$ref`` sits in ``node``'s subschemas (data values are not looked into)."""
    return any(isinstance(site.node, dict) and "$ref" in site.node
               for site in _positions_only(node))


def _positions_only(node: object) -> Iterator[Site]:
    stack = [Site("#", node, False)]
    while stack:
        site = stack.pop()
        yield site
        if isinstance(site.node, dict):
            stack.extend(Site(pointer(site.path, *t), sub, False) for t, sub in subschemas(site.node))


def all_refs(root: object) -> list[str]:
    return [site.node["$ref"] for site in _positions_only(root)
            if isinstance(site.node, dict) and isinstance(site.node.get("$ref"), str)]
