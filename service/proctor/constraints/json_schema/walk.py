"""Every subschema of a schema, by JSON pointer, including the targets of local ``$ref``s.

One walk for the guard, the relaxation and the final touches, so none of them misses a subschema
that is reached only through a reference into an unknown container (OpenAPI's
``#/components/schemas/X``). References are followed once each; cycles end the walk there.
Negative positions (``not``, ``if``) are reported so callers can stay out of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from proctor.constraints.json_schema.keywords import NEGATIVE, pointer, pointer_tokens, resolve_pointer, subschemas


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


@dataclass(frozen=True, slots=True)
class RefIndex:
    """Where local ``$ref``s point, so positional walkers also reach schemas kept in unknown keywords.

    OpenAPI-style schemas keep subschemas under keys no vocabulary defines (``#/components/...``,
    ``#/data/...``) and reach them by ``$ref``; a walker that only follows schema positions would
    leave those untouched (not restated in 2020-12 terms, not rewritten). ``descend`` copies the
    way down to each such target and hands the target to ``visit``.
    """

    targets: frozenset[str]
    ancestors: frozenset[str]

    @classmethod
    def of(cls, root: object) -> RefIndex:
        targets = {canonical_pointer(site.node["$ref"]) for site in reachable(root)
                   if isinstance(site.node, dict) and isinstance(site.node.get("$ref"), str)
                   and site.node["$ref"].startswith("#/")}
        ancestors: set[str] = set()
        for target in targets:
            tokens = pointer_tokens(target)
            ancestors.update(pointer("#", *tokens[:i]) for i in range(1, len(tokens)))
        return cls(frozenset(targets), frozenset(ancestors))

    def descend(self, value: object, path: str, visit: Callable[[object, str], object]) -> object:
        """``value`` (at ``path``, under a keyword that is not a schema position) with ref targets visited."""
        if path in self.targets:
            return visit(value, path)
        if path not in self.ancestors:
            return value
        if isinstance(value, dict):
            return {key: self.descend(sub, pointer(path, key), visit) for key, sub in value.items()}
        if isinstance(value, list):
            return [self.descend(sub, pointer(path, index), visit) for index, sub in enumerate(value)]
        return value
