"""Read a schema by its own draft (``$schema``) and restate it in Draft 2020-12 terms for the engines.

Real schemas say ``draft-04`` or ``draft-07`` and use that draft's words: ``id``,
``definitions``, ``dependencies``, boolean ``exclusiveMinimum``, array-form ``items`` with
``additionalItems``, and (up to draft 7) ``$ref`` that hides its siblings. The engines read
2020-12, so each of those is rewritten to the 2020-12 keyword that means the same; the server's
validator reads the original with the validator class of the same draft, so mask and verdict
agree. A schema without ``$schema`` is read as 2020-12 (the API's documented dialect).
"""

from __future__ import annotations

from typing import Any

from jsonschema import validators

from proctor.constraints.json_schema.keywords import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_SINGLES, pointer
from proctor.constraints.json_schema.walk import RefIndex

DRAFT4, DRAFT6, DRAFT7, DRAFT2019, DRAFT2020 = "draft-04", "draft-06", "draft-07", "2019-09", "2020-12"
DRAFT2020_URI = "https://json-schema.org/draft/2020-12/schema"  # what a restated schema declares
_MARKERS = ((DRAFT4, "draft-04"), (DRAFT6, "draft-06"), (DRAFT7, "draft-07"), (DRAFT2019, "2019-09"),
            (DRAFT2020, "2020-12"))
LEGACY = frozenset({DRAFT4, DRAFT6, DRAFT7})
COUNTS = frozenset({"minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
                    "minContains", "maxContains"})  # $ref hides its siblings; items may be an array


def draft_of(schema: object) -> str:
    """The draft a schema declares with ``$schema`` (2020-12 when absent or not recognised)."""
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(declared, str):
        for draft, marker in _MARKERS:
            if marker in declared:
                return draft
    return DRAFT2020


def validator_class(schema: object) -> Any:
    """The jsonschema validator class for the schema's own draft."""
    from jsonschema import Draft202012Validator

    return validators.validator_for(schema, default=Draft202012Validator) if isinstance(schema, dict) \
        else Draft202012Validator


def normalize(schema: object) -> object:
    """A copy of ``schema`` in 2020-12 terms, meaning the same under its own draft.

    ``dependencies`` keeps its draft 4-7 meaning in every draft: 2019-09 split it into
    ``dependentRequired``/``dependentSchemas`` without giving the old word another meaning, and
    schemas without ``$schema`` still use it as their authors intended; the server's validator
    asserts it too (``validation``), as the Test Suite's optional compatibility tests expect.
    """
    return _normalize(schema, draft_of(schema), "#", RefIndex.of(schema))


def _normalize(node: object, draft: str, path: str, refs: RefIndex) -> object:
    """One schema node and its subschemas (schema positions, and ref targets kept elsewhere)."""
    if not isinstance(node, dict):
        return node
    if draft in LEGACY and isinstance(node.get("$ref"), str):
        # Up to draft 7 a $ref's siblings are ignored; keep only what a pointer may reach into.
        node = {k: v for k, v in node.items() if k in ("$ref", "definitions", "$defs")}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _normalize(sub, draft, pointer(path, key, name), refs) for name, sub in value.items()}
        elif key in SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_normalize(sub, draft, pointer(path, key, i), refs) for i, sub in enumerate(value)]
        elif key == "id" and draft == DRAFT4 and isinstance(value, str):
            out["$id"] = value
        elif key == "dependencies" and isinstance(value, dict):
            _split_dependencies(value, out, draft, pointer(path, key), refs)
        elif key == "items" and isinstance(value, list) and draft != DRAFT2020:
            out["prefixItems"] = [_normalize(sub, draft, pointer(path, key, i), refs) for i, sub in enumerate(value)]
            if "additionalItems" in node:
                out["items"] = _normalize(node["additionalItems"], draft, pointer(path, "additionalItems"), refs)
        elif key == "additionalItems" and draft != DRAFT2020:
            continue  # meaningful only beside array-form items (handled there)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            if value and isinstance(node.get(bound), int | float):
                out[key] = node[bound]
        elif key in ("minimum", "maximum") and node.get("exclusive" + key.capitalize()) is True:
            continue  # became the exclusive bound
        elif key in SCHEMA_SINGLES:
            out[key] = _normalize(value, draft, pointer(path, key), refs)
        elif key in COUNTS and isinstance(value, float) and value.is_integer():
            out[key] = int(value)  # 2.0 counts as 2 in every draft; engines want an integer
        else:  # data (const, enum, required...) and unknown keywords: as written, but for ref targets
            out[key] = refs.descend(value, pointer(path, key), lambda sub, at: _normalize(sub, draft, at, refs))
    return out


def _split_dependencies(value: dict[str, Any], out: dict[str, Any], draft: str, path: str, refs: RefIndex) -> None:
    """``dependencies`` (draft 4-7): name lists → dependentRequired, schemas → dependentSchemas."""
    required = {k: v for k, v in value.items() if isinstance(v, list)}
    schemas = {k: _normalize(v, draft, pointer(path, k), refs) for k, v in value.items() if not isinstance(v, list)}
    if required:
        out["dependentRequired"] = required
    if schemas:
        out["dependentSchemas"] = schemas
