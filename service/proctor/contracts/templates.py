"""Versioned contract templates: what to ask the model, and which parts of a schema the caller fills in.

Layout (the shipped set is ``proctor/templates``, package data), beside the schema registry's::

    <directory>/<name path>/<version>.toml        e.g.  contract/nda/1.toml  ->  "contract/nda@1"

Names and versions follow the schema registry's rules (``registry.NAME_SEGMENT``, ``registry.VERSION``), and
so does immutability: a changed template is a new file, so the ``name@version`` in an audit record always
means the same prompts. A template names the registered schema it drafts (``schema = "contract/nda@1"``,
pinned) and where in that schema the caller's parts go (JSON pointers):

* ``[parties]`` — either ``path`` (an array of party objects; ``name``, ``role``, ``jurisdiction`` name their
  properties, the roles come from the role property's ``enum``) or ``slots`` (role -> pointer of one party
  object each, e.g. ``provider``/``client``);
* ``[clauses]`` — ``path`` of the clause array, ``id``/``title`` properties, ``catalogue`` (id -> title:
  the title used when a caller requires a clause by id alone);
* ``[facts.<name>]`` — ``path`` and ``description`` of each value a caller may fix (dates, amounts, law);
* ``[languages.<code>]`` — ``system`` and ``user`` prompts (``str.format`` fields: ``{parties}``,
  ``{facts}``, ``{clauses}``, ``{title}``), optional ``[[languages.<code>.examples]]`` (``user``,
  ``assistant``) rendered as earlier chat turns;
* ``max_new_tokens``, ``max_attempts``, ``repetition`` (``[ngram_size, repeats]``): generation defaults.

Every template is checked when it loads (its schema exists, every pointer resolves to the right kind of
subschema, every example validates against the schema), so a bad file stops the server at startup with
an error naming it, never a request later.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proctor.constraints.registry import NAME_SEGMENT, VERSION, RegisteredSchema, SchemaRegistry, version_key
from proctor.contracts.pointers import PointerError, resolve_local

LANGUAGES = ("en", "zh")
# The repetition stop a template runs with unless it says otherwise: a unit of up to 16 tokens four times
# in a row (three caught "000" in amounts and "..." in prose).
DEFAULT_REPETITION = (16, 4)
PROMPT_FIELDS = frozenset({"parties", "facts", "clauses", "title"})
TOP_KEYS = frozenset({"description", "schema", "title", "parties", "clauses", "facts", "languages", "max_new_tokens",
                      "max_attempts", "repetition"})


def default_template_directory() -> Path:
    """The templates shipped with the package (``proctor/templates``), a plain path like the schemas'."""
    return Path(__file__).resolve().parent.parent / "templates"


class TemplateError(ValueError):
    """A template file is unusable (a startup error naming the file, never a request error)."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class UnknownTemplate(KeyError):
    def __init__(self, ref: str, message: str) -> None:
        super().__init__(ref)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class PartySpec:
    """Where parties go: an array (``path`` + property names) or one pointer per role (``slots``)."""

    path: str = ""
    name: str = "name"
    role: str = "role"
    jurisdiction: str = "jurisdiction"
    slots: tuple[tuple[str, str], ...] = ()
    roles: tuple[str, ...] = ()  # the roles a party may take (the schema's enum, or the slot names)
    min_count: int = 0
    max_count: int = 0


@dataclass(frozen=True)
class ClauseSpec:
    path: str
    id: str = "id"
    title: str = "title"
    catalogue: tuple[tuple[str, str], ...] = ()
    max_count: int = 0  # the clause array's maxItems (0: none)

    def title_of(self, clause_id: str) -> str:
        return dict(self.catalogue).get(clause_id, "")


@dataclass(frozen=True)
class FactSpec:
    name: str
    path: str
    description: str
    schema: dict[str, Any] = field(compare=False, repr=False)  # the base subschema a value must satisfy


@dataclass(frozen=True)
class Prompts:
    system: str
    user: str
    examples: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ContractTemplate:
    name: str
    version: str
    description: str
    title: str
    schema: RegisteredSchema
    parties: PartySpec
    clauses: ClauseSpec
    facts: tuple[FactSpec, ...]
    languages: tuple[tuple[str, Prompts], ...]
    max_new_tokens: int = 700
    max_attempts: int = 3
    repetition: tuple[int, int] = DEFAULT_REPETITION

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def prompts(self, language: str) -> Prompts | None:
        return dict(self.languages).get(language)

    def fact(self, name: str) -> FactSpec | None:
        return next((f for f in self.facts if f.name == name), None)


class TemplateRegistry:
    """The templates of one directory, by name and version (immutable, shared between threads)."""

    def __init__(self, templates: list[ContractTemplate]) -> None:
        self._by_name: dict[str, dict[str, ContractTemplate]] = {}
        for entry in templates:
            versions = self._by_name.setdefault(entry.name, {})
            if entry.version in versions:
                raise ValueError(f"duplicate template {entry.ref}")
            versions[entry.version] = entry

    @classmethod
    def load(cls, schemas: SchemaRegistry, directory: Path | None = None) -> TemplateRegistry:
        root = default_template_directory() if directory is None else Path(directory)
        if not root.is_dir():
            raise TemplateError(root, "the template directory does not exist")
        files = sorted(p for p in root.rglob("*.toml") if p.is_file())
        return cls([load_template(root, path, schemas) for path in files])

    def resolve(self, ref: str) -> ContractTemplate:
        """``"name@version"`` or the latest version of ``"name"``; UnknownTemplate naming what exists."""
        name, sep, version = ref.partition("@")
        versions = self._by_name.get(name)
        if versions is None:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise UnknownTemplate(ref, f"unknown template {ref!r}; the templates are: {known}")
        if not sep:
            return versions[max(versions, key=version_key)]
        if version not in versions:
            known = ", ".join(sorted(versions, key=version_key))
            raise UnknownTemplate(ref, f"unknown template {ref!r}: {name!r} has the versions {known}")
        return versions[version]

    def list(self) -> list[ContractTemplate]:
        return [self._by_name[n][v] for n in sorted(self._by_name) for v in sorted(self._by_name[n], key=version_key)]

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())


def load_template(root: Path, path: Path, schemas: SchemaRegistry) -> ContractTemplate:
    relative = path.relative_to(root)
    segments = relative.parent.parts
    if not segments or not all(NAME_SEGMENT.fullmatch(s) for s in segments):
        raise TemplateError(path, "a template lives at <name>/<version>.toml, with lower-case name segments")
    if not VERSION.fullmatch(path.stem):
        raise TemplateError(path, f"version {path.stem!r} is not dotted numbers (1, 2, 1.1)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TemplateError(path, f"unreadable: {exc}") from exc
    try:
        return _build(data, "/".join(segments), path.stem, schemas)
    except (KeyError, TypeError, ValueError, PointerError) as exc:
        reason = exc.reason if isinstance(exc, TemplateError) else str(exc)
        raise TemplateError(path, reason) from exc


def _build(data: dict[str, Any], name: str, version: str, schemas: SchemaRegistry) -> ContractTemplate:
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} (allowed: {sorted(TOP_KEYS)})")
    ref = data["schema"]
    if "@" not in ref:
        raise ValueError(f"schema {ref!r} must be pinned as name@version (a template version means one schema)")
    schema = schemas.resolve(ref)
    root = schema.schema
    parties = _parties(data["parties"], root)
    clauses = _clauses(data["clauses"], root)
    facts = tuple(_fact(key, value, root) for key, value in data.get("facts", {}).items())
    languages = tuple((code, _prompts(code, value)) for code, value in data["languages"].items())
    if not languages:
        raise ValueError("at least one language is needed")
    for code, _ in languages:
        if code not in LANGUAGES:
            raise ValueError(f"language {code!r} is not one of {LANGUAGES}")
    template = ContractTemplate(
        name=name, version=version, description=_text(data, "description"), title=_text(data, "title"),
        schema=schema, parties=parties, clauses=clauses, facts=facts, languages=languages,
        max_new_tokens=int(data.get("max_new_tokens", 700)), max_attempts=int(data.get("max_attempts", 3)),
        repetition=tuple(data.get("repetition", DEFAULT_REPETITION)))
    _check_examples(template)
    return template


def _text(data: dict[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key} must be a non-empty string")
    return value


def _parties(data: dict[str, Any], root: dict[str, Any]) -> PartySpec:
    if "slots" in data:
        slots = tuple((str(role), str(pointer)) for role, pointer in data["slots"].items())
        for _, pointer in slots:
            party = resolve_local(root, pointer)
            if party.get("type") != "object":
                raise ValueError(f"parties.slots: {pointer} is not an object schema")
            _property(party, data.get("name", "name"), f"parties.slots {pointer}")
        return PartySpec(slots=slots, name=data.get("name", "name"), jurisdiction=data.get("jurisdiction", ""),
                         role="", roles=tuple(role for role, _ in slots), min_count=len(slots), max_count=len(slots))
    array = resolve_local(root, data["path"])
    if array.get("type") != "array":
        raise ValueError(f"parties.path {data['path']} is not an array schema")
    item = resolve_local(root, "", array.get("items", {}))
    spec = PartySpec(path=data["path"], name=data.get("name", "name"), role=data.get("role", "role"),
                     jurisdiction=data.get("jurisdiction", "jurisdiction"),
                     min_count=int(array.get("minItems", 0)), max_count=int(array.get("maxItems", 0)))
    _property(item, spec.name, "parties.name")
    role = _property(item, spec.role, "parties.role")
    if not isinstance(role.get("enum"), list):
        raise ValueError("parties.role must name a property with an enum (the roles a party may take)")
    return PartySpec(**{**spec.__dict__, "roles": tuple(role["enum"])})


def _clauses(data: dict[str, Any], root: dict[str, Any]) -> ClauseSpec:
    array = resolve_local(root, data["path"])
    if array.get("type") != "array":
        raise ValueError(f"clauses.path {data['path']} is not an array schema")
    item = resolve_local(root, "", array.get("items", {}))
    spec = ClauseSpec(path=data["path"], id=data.get("id", "id"), title=data.get("title", "title"),
                      catalogue=tuple((str(k), str(v)) for k, v in data.get("catalogue", {}).items()),
                      max_count=int(array.get("maxItems", 0)))
    _property(item, spec.id, "clauses.id")
    _property(item, spec.title, "clauses.title")
    return spec


def _fact(name: str, data: dict[str, Any], root: dict[str, Any]) -> FactSpec:
    return FactSpec(name=name, path=data["path"], description=str(data.get("description", "")),
                    schema=resolve_local(root, data["path"]))


def _prompts(code: str, data: dict[str, Any]) -> Prompts:
    system, user = _text(data, "system"), _text(data, "user")
    for text in (system, user):
        _check_fields(text, f"languages.{code}")
    examples = tuple((_text(e, "user"), _text(e, "assistant")) for e in data.get("examples", ()))
    return Prompts(system=system, user=user, examples=examples)


def _check_fields(text: str, where: str) -> None:
    import string

    for _, field_name, _, _ in string.Formatter().parse(text):
        if field_name is not None and field_name not in PROMPT_FIELDS:
            raise ValueError(f"{where}: unknown prompt field {{{field_name}}} (known: {sorted(PROMPT_FIELDS)})")


def _property(item: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    properties = item.get("properties", {})
    if key not in properties:
        raise ValueError(f"{where}: the item schema has no property {key!r}")
    return dict(properties[key])


def _check_examples(template: ContractTemplate) -> None:
    """Few-shot answers are contracts too: each must validate, or the template teaches invalid output."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(template.schema.schema)
    for code, prompts in template.languages:
        for number, (_, answer) in enumerate(prompts.examples, 1):
            errors = sorted(e.message for e in validator.iter_errors(json.loads(answer)))
            if errors:
                raise ValueError(f"languages.{code}.examples[{number}] does not validate: {errors[0]}")
