"""Named, versioned JSON schemas that requests can use by reference (``schema_ref``).

Layout of a schema directory (the shipped one is ``proctor/schemas``, package data)::

    <directory>/<name path>/<version>.json        e.g.  contract/nda/1.json  ->  "contract/nda@1"

* The name is the file's folder path relative to the directory, segments joined with ``/``. Each segment is
  lower-case letters, digits, ``-`` and ``_``, starting with a letter or digit (``contract/service-agreement``):
  names travel in requests and audit records, so they stay plain and portable.
* The version is the file stem: dotted non-negative integers without leading zeros (``1``, ``2``, ``1.1``).
  Versions order numerically (``10`` after ``9``); "latest" is the highest. A version is immutable once
  published: a changed schema is a new file, so a recorded ``name@version`` always means the same schema.
* Each file is a JSON object with exactly two keys: ``description`` (a non-empty string shown by
  ListSchemas) and ``schema`` (a JSON Schema object, Draft 2020-12; a ``$schema`` key, if any, must name
  that draft). Unknown keys are rejected so a typo (``"shema"``) is not silently ignored.
* Only ``*.json`` files count; anything else in the tree (a README, ``__pycache__``) is ignored. A ``.json``
  file directly in the directory has no name and is an error.

Every file is read and its schema checked when the registry loads (``check_json_schema``: Draft 2020-12,
local ``$ref`` only), so a bad file stops the server at startup with an error naming the file instead of
failing requests later.
The registry is immutable after loading and safe to share between threads.
"""

from __future__ import annotations

import builtins
import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from proctor.constraints.json_schema import InvalidSchemaError, check_json_schema
from proctor.constraints.spec import ConstraintSpec

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
NAME_SEGMENT = re.compile(r"[a-z0-9][a-z0-9_-]*")
VERSION = re.compile(r"(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*")
FILE_KEYS = frozenset({"description", "schema"})
MAX_LISTED_NAMES = 20


def default_schema_directory() -> Path:
    """The schemas shipped with the package (``proctor/schemas``).

    A plain path next to this package rather than ``importlib.resources``: the registry walks a directory
    tree, which ``Traversable`` cannot hand out as a real path for all loaders, and proctor is always
    installed as files (never zipped).
    """
    return Path(__file__).resolve().parent.parent / "schemas"


class SchemaRegistryError(ValueError):
    """A schema file is unusable; ``path`` names it (a startup error, never a request error)."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"schema file {path}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        # args hold the rendered message, not the constructor's arguments: rebuild from the fields.
        return (type(self), (self.path, self.reason))


class UnknownSchema(KeyError):
    """``resolve`` found no such name or version; the message lists the close names (or the versions)."""

    def __init__(self, ref: str, message: str) -> None:
        self.ref = ref
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        # KeyError's own __str__ shows repr(message), quotes and all; the message is meant for people.
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.ref, self.message))


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """One registered schema version.

    ``schema_json`` is compact JSON in the file's key order (the same text ``ConstraintSpec`` compiles,
    since engines emit properties in schema order), so a schema used by reference and the same schema
    sent inline share one compiled constraint.
    Treat ``schema`` as read-only: it is shared by every request that resolves to it.
    """

    name: str
    version: str
    description: str
    schema: dict[str, object] = field(compare=False, hash=False, repr=False)
    schema_json: str = field(repr=False)

    @property
    def ref(self) -> str:
        """``name@version``, the fully pinned reference (what responses and audit records carry)."""
        return f"{self.name}@{self.version}"


def version_key(version: str) -> tuple[int, ...]:
    """Numeric ordering of a dotted version: ``"10"`` sorts after ``"9"``, ``"1.10"`` after ``"1.9"``."""
    return tuple(int(part) for part in version.split("."))


class SchemaRegistry:
    """The schemas of one directory, by name and version; build it with ``SchemaRegistry.load``."""

    def __init__(self, schemas: Iterable[RegisteredSchema] = ()) -> None:
        self._by_name: dict[str, dict[str, RegisteredSchema]] = {}
        for entry in schemas:
            versions = self._by_name.setdefault(entry.name, {})
            if entry.version in versions:
                raise ValueError(f"duplicate schema {entry.ref}")
            versions[entry.version] = entry

    @classmethod
    def load(cls, directory: Path | None = None) -> SchemaRegistry:
        """Read and check every ``<name path>/<version>.json`` under ``directory`` (default: the shipped set).

        Raises SchemaRegistryError naming the first bad file (or the directory, when it does not exist).
        """
        root = default_schema_directory() if directory is None else Path(directory)
        if not root.is_dir():
            raise SchemaRegistryError(root, "the schema directory does not exist")
        files = sorted(p for p in root.rglob("*.json") if p.is_file() and "__pycache__" not in p.parts)
        return cls(_load_file(root, path) for path in files)

    def resolve(self, ref: str) -> RegisteredSchema:
        """Find ``"name@version"``, or the latest version of ``"name"``; UnknownSchema otherwise."""
        name, sep, version = ref.partition("@")
        versions = self._by_name.get(name)
        if versions is None:
            raise UnknownSchema(ref, self._unknown_name_message(ref, name))
        if not sep:
            return versions[max(versions, key=version_key)]
        entry = versions.get(version)
        if entry is None:
            known = ", ".join(sorted(versions, key=version_key))
            raise UnknownSchema(ref, f"unknown schema {ref!r}: {name!r} has the versions {known}")
        return entry

    # builtins.list: inside this class body the name ``list`` is the method below (type checkers read it so).
    def list(self) -> builtins.list[RegisteredSchema]:
        """Every registered version, by name, then by numeric version."""
        return [
            self._by_name[name][version]
            for name in sorted(self._by_name)
            for version in sorted(self._by_name[name], key=version_key)
        ]

    def names(self) -> builtins.list[str]:
        """The registered names, sorted."""
        return sorted(self._by_name)

    def __len__(self) -> int:
        return sum(len(versions) for versions in self._by_name.values())

    def _unknown_name_message(self, ref: str, name: str) -> str:
        names = self.names()
        if not names:
            return f"unknown schema {ref!r}: no schemas are registered"
        message = f"unknown schema {ref!r}"
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        if close:
            message += f"; did you mean {' or '.join(close)}?"
        shown = ", ".join(names[:MAX_LISTED_NAMES])
        more = f" and {len(names) - MAX_LISTED_NAMES} more" if len(names) > MAX_LISTED_NAMES else ""
        return f"{message} (registered: {shown}{more}; see ListSchemas)"


def _load_file(root: Path, path: Path) -> RegisteredSchema:
    """Parse and check one schema file; every problem is a SchemaRegistryError naming ``path``."""
    relative = path.relative_to(root)
    segments, version = relative.parts[:-1], path.stem
    if not segments:
        raise SchemaRegistryError(path, "a schema file must sit in a folder named after the schema")
    for segment in segments:
        if not NAME_SEGMENT.fullmatch(segment):
            raise SchemaRegistryError(
                path, f"name segment {segment!r} must be lower-case letters, digits, '-' or '_' (e.g. 'nda')"
            )
    if not VERSION.fullmatch(version):
        raise SchemaRegistryError(path, f"version {version!r} must be dotted integers without leading zeros")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaRegistryError(path, f"cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise SchemaRegistryError(path, f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SchemaRegistryError(path, 'expected an object {"description": ..., "schema": {...}}')
    if set(data) != FILE_KEYS:
        missing, extra = sorted(FILE_KEYS - set(data)), sorted(set(data) - FILE_KEYS)
        raise SchemaRegistryError(path, f"expected exactly the keys description and schema (missing {missing}, "
                                        f"unexpected {extra})")
    description, schema = data["description"], data["schema"]
    if not isinstance(description, str) or not description.strip():
        raise SchemaRegistryError(path, "description must be a non-empty string")
    if not isinstance(schema, dict):
        raise SchemaRegistryError(path, "schema must be a JSON Schema object")
    if schema.get("$schema", DRAFT_2020_12) != DRAFT_2020_12:
        raise SchemaRegistryError(path, f"$schema must be {DRAFT_2020_12} (or absent), got {schema['$schema']!r}")
    try:
        check_json_schema(schema)
    except InvalidSchemaError as exc:
        raise SchemaRegistryError(path, str(exc)) from exc
    name = "/".join(segments)
    return RegisteredSchema(name, version, description.strip(), schema, ConstraintSpec.json_schema(schema).text)
