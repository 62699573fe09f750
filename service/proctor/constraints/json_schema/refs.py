"""Local ``$ref``s in one place: following them, and refusing the ones no instance can satisfy.

``check_refs`` refuses a reference that points nowhere in the schema, and a schema that admits no
finite value — a ``$ref`` cycle with no base case (``a → b → a``, or an object that requires a
property whose schema is the object again): engines would compile it and generate until the
token limit. The test is a least fixed point of "has a finite instance" over necessary
conditions only, so it never refuses a schema that has one.
"""

from __future__ import annotations

from typing import Any

from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema.keywords import resolve_pointer
from proctor.constraints.json_schema.walk import reachable


def deref(node: object, root: object, hops: int = 8) -> object:
    """Follow a node that is only a local ``$ref`` (up to ``hops`` times) to what it points to."""
    while hops and isinstance(node, dict) and isinstance(node.get("$ref"), str) and len(node) == 1:
        target = resolve_pointer(root, node["$ref"])
        if target is None:
            return node
        node, hops = target, hops - 1
    return node


def check_refs(schema: object) -> None:
    """Refuse local references that point nowhere and schemas with no finite instance (ref cycles)."""
    for site in reachable(schema):
        node = site.node
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref.startswith("#") and resolve_pointer(schema, ref) is None and (ref == "#" or ref.startswith("#/")):
                raise ConstraintError(f"'$ref' at {site.path} points to {ref!r}, which does not exist in the schema")
    if isinstance(schema, dict) and not _productive_root(schema):
        raise ConstraintError("the schema admits no finite value (a '$ref' cycle with no base case, or only "
                              "false branches)")


def _productive_root(root: dict[str, Any]) -> bool:
    """Least fixed point of "has a finite instance", over necessary conditions only (sound for refusal)."""
    nodes = [site.node for site in reachable(root) if isinstance(site.node, dict)]
    good: set[int] = set()
    changed = True
    while changed:
        changed = False
        for node in nodes:
            if id(node) not in good and _finite(node, root, good):
                good.add(id(node))
                changed = True
    return id(root) in good


def _ok(sub: object, good: set[int]) -> bool:
    return sub is not False and (not isinstance(sub, dict) or id(sub) in good)


def _finite(node: dict[str, Any], root: object, good: set[int]) -> bool:
    if isinstance(node.get("$ref"), str):
        target = resolve_pointer(root, node["$ref"])
        if target is not None and not _ok(target, good):
            return False
    if isinstance(node.get("allOf"), list) and not all(_ok(m, good) for m in node["allOf"]):
        return False
    for kw in ("anyOf", "oneOf"):
        if isinstance(node.get(kw), list) and node[kw] and not any(_ok(m, good) for m in node[kw]):
            return False
    declared = node.get("type")
    props: dict[str, Any] = node["properties"] if isinstance(node.get("properties"), dict) else {}
    required = node.get("required") if declared in ("object", ["object"]) else None
    if isinstance(required, list) and not all(_ok(props.get(n, True), good) for n in required if isinstance(n, str)):
        return False
    if declared in ("array", ["array"]) and isinstance(node.get("minItems"), int) and node["minItems"] > 0:
        prefix: list[object] = node["prefixItems"] if isinstance(node.get("prefixItems"), list) else []
        needed = prefix[: node["minItems"]]
        if node["minItems"] > len(prefix):
            needed = [*needed, node.get("items", True)]
        if not all(_ok(sub, good) for sub in needed):
            return False
    return True
