"""JSON pointers into one schema document, following its local ``$ref``s (``#/$defs/party``).

Templates name parts of a registered schema by pointer; the schema registry already refuses any
``$ref`` that is not local, so a local lookup is all a template ever needs.
"""

from __future__ import annotations

from typing import Any

MAX_REF_HOPS = 32  # a $ref chain longer than this is a cycle


class PointerError(ValueError):
    pass


def resolve_local(root: dict[str, Any], pointer: str, node: dict[str, Any] | None = None) -> dict[str, Any]:
    """The subschema at ``pointer`` ("/properties/parties"; "" is the root), or ``node`` itself when given,
    with any ``$ref`` at that place followed (a sibling keyword next to a ``$ref`` is refused: merging it
    would change the schema's meaning)."""
    current = node if node is not None else _walk(root, pointer)
    for _ in range(MAX_REF_HOPS):
        if not isinstance(current, dict):
            raise PointerError(f"{pointer or '#'} is not a schema object")
        ref = current.get("$ref")
        if ref is None:
            return current
        if len(current) > 1:
            raise PointerError(f"{pointer or '#'}: a $ref with sibling keywords is not supported here")
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise PointerError(f"{pointer or '#'}: only local $refs are supported ({ref!r})")
        current = _walk(root, ref[1:])
    raise PointerError(f"{pointer or '#'}: $ref chain longer than {MAX_REF_HOPS}")


def _walk(root: dict[str, Any], pointer: str) -> Any:
    if pointer and not pointer.startswith("/"):
        raise PointerError(f"{pointer!r} is not a JSON pointer (it starts with /)")
    current: Any = root
    for raw in pointer.split("/")[1:] if pointer else ():
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict) and key in current:
            current = current[key]
        elif isinstance(current, list) and key.isdigit() and int(key) < len(current):
            current = current[int(key)]
        else:
            raise PointerError(f"{pointer}: nothing at {key!r}")
    return current


def set_at(root: dict[str, Any], pointer: str, value: Any) -> None:
    """Replace the value at ``pointer`` (which must exist) in ``root``, in place."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    if not parts:
        raise PointerError("cannot replace the root")
    parent = _walk(root, "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts[:-1])
                   if len(parts) > 1 else "")
    if not isinstance(parent, dict) or parts[-1] not in parent:
        raise PointerError(f"{pointer}: nothing to replace")
    parent[parts[-1]] = value
