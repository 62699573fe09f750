"""From a request's constraint to a compiled constraint ready for per-request matchers.

Validation lives here too, because what is valid depends on the engines: a schema that parses
but uses a keyword no engine enforces is refused with the keyword and where it is.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.config import Settings
from proctor.constraints.backend import CompiledConstraint
from proctor.constraints.compiler import CompileResult, ConstraintCompiler
from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema import (
    POLICIES,
    InvalidSchemaError,
    JsonOutputRule,
    check_json_schema,
    format_uses,
    prepare_schema,
    remembered_keywords,
)
from proctor.constraints.spec import ConstraintKind, ConstraintSpec, GrammarSyntax
from proctor.constraints.tool_calls import ToolCallsRule, tool_calls_framing
from proctor.domain import ConstraintRequest, ConstraintSummary, FormatUse, RequestValidationError

if TYPE_CHECKING:
    from proctor.constraints.output_rule import OutputRule
    from proctor.constraints.registry import SchemaRegistry



def json_nesting_depth(text: str) -> int:
    """Deepest bracket nesting of a JSON text, found without parsing (the parser itself recurses)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth -= 1
    return deepest


@dataclass(frozen=True, slots=True)
class PreparedConstraint:
    compiled: CompiledConstraint
    summary: ConstraintSummary
    schema: dict[str, Any] | bool | None  # the JSON schema to validate the output against, if any
    schema_canonical: str = ""  # its canonical JSON: the validator cache's key, computed once here
    # What ending an output costs, read from the compiled form (constraints/output_rule.py): the engine's budget
    # rule asks it; None for a kind that cannot say (regex, choice, grammar).
    output_rule: OutputRule | None = None

    @property
    def exact(self) -> bool:
        """False on the validated fallback: outputs are validated and retried within a budget."""
        return self.summary.exact


class ConstraintService:
    def __init__(self, compiler: ConstraintCompiler, registry: SchemaRegistry | None = None, *,
                 max_schema_depth: int = Settings.max_schema_depth,
                 max_choice_options: int = Settings.max_choice_options) -> None:
        self.compiler = compiler
        self.registry = registry
        self.max_schema_depth = max_schema_depth
        self.max_choice_options = max_choice_options  # the server's setting (size_limits.py checks it first)

    def to_spec(self, request: ConstraintRequest) -> tuple[ConstraintSpec, str]:
        """Canonical spec and the resolved schema reference ("" when none); errors name the field.

        The size limit (max_constraint_bytes, in UTF-8 bytes) is checked here for every kind, before
        anything parses or walks the text; the API checked the same limit on the message already."""
        field = request.field
        size, limit = len(request.text.encode()), self.compiler.limits.max_spec_bytes
        if size > limit:
            what = "schema" if request.kind == "json_schema" else request.kind
            raise RequestValidationError.single(
                field, f"the {what} is {size} bytes; the limit (max_constraint_bytes) is {limit}")
        if request.kind == "schema_ref":
            if self.registry is None:
                raise RequestValidationError.single(field, "this server has no schema registry")
            try:
                entry = self.registry.resolve(request.text)
            except KeyError as exc:
                raise RequestValidationError.single(field, str(exc.args[0] if exc.args else exc)) from None
            spec = ConstraintSpec.json_schema(entry.schema, request.flexible_whitespace)
            return spec, f"{entry.name}@{entry.version}"
        if request.kind == "json_schema":
            # The depth limit on the text too, before anything parses or walks it (both would recurse).
            depth = json_nesting_depth(request.text)
            if depth > self.max_schema_depth:
                raise RequestValidationError.single(
                    field, f"the schema nests {depth} levels deep; the limit (max_schema_depth) is "
                           f"{self.max_schema_depth}")
            try:  # a schema the door read as an object is not parsed again
                schema = request.parsed[0] if request.parsed else json.loads(request.text)
            except json.JSONDecodeError as exc:
                raise RequestValidationError.single(field, f"not valid JSON: {exc}") from None
            if not isinstance(schema, dict | bool):
                raise RequestValidationError.single(field, "a JSON Schema is an object (or a boolean)")
            try:
                check_json_schema(schema)
            except InvalidSchemaError as exc:
                raise RequestValidationError.single(field, f"not a valid JSON Schema: {exc}") from None
            return ConstraintSpec.json_schema(schema, request.flexible_whitespace), ""
        if request.kind == "regex":
            if not request.text:
                raise RequestValidationError.single(field, "the regex is empty")
            try:
                re.compile(request.text)
            except re.error as exc:  # engines read some broken patterns leniently (`a**`, a lone `\`)
                raise RequestValidationError.single(field, f"the regex does not compile: {exc}") from None
            return ConstraintSpec.regex(request.text), ""
        if request.kind == "choice":
            if not request.options:
                raise RequestValidationError.single(field, "at least one option is needed")
            if len(request.options) > self.max_choice_options:
                raise RequestValidationError.single(field, f"at most {self.max_choice_options} options")
            if any(not option for option in request.options):
                raise RequestValidationError.single(field, "options must not be empty strings")
            return ConstraintSpec.choice(request.options), ""
        if request.kind == "grammar":
            if not request.text:
                raise RequestValidationError.single(field, "the grammar is empty")
            return ConstraintSpec.grammar(request.text, GrammarSyntax(request.grammar_syntax)), ""
        raise RequestValidationError.single("constraint", f"unknown constraint kind {request.kind!r}")

    def prepare(self, request: ConstraintRequest) -> PreparedConstraint:
        spec, ref = self.to_spec(request)
        try:
            result = self.compiler.compile(spec, request.backend, exact_only=request.exact_only)
        except ConstraintError as exc:
            raise RequestValidationError.single(request.field, f"cannot be compiled: {exc}") from None
        schema = spec.schema if spec.kind is ConstraintKind.JSON_SCHEMA else None
        if schema is not None and not isinstance(schema, dict | bool):  # to_spec refused anything else
            raise RequestValidationError.single(request.field, "a JSON Schema is an object (or a boolean)")
        canonical = spec.canonical_text()
        summary = ConstraintSummary(kind=spec.kind.value, backend=result.backend, spec_sha256=spec.sha256(canonical),
                                    schema_ref=ref, cache_hit=result.cache_hit, compile_ms=result.compile_ms,
                                    exact=result.exact, relaxed=result.relaxed,
                                    formats=format_handling(spec, result) if schema is not None else (),
                                    remembered=_remembered(spec.text) if schema is not None and result.exact else ())
        return PreparedConstraint(result.compiled, summary, schema, canonical if schema is not None else "",
                                  output_rule(result.compiled.spec))


def output_rule(compiled: ConstraintSpec) -> OutputRule | None:
    """What ending an output of ``compiled`` costs (the engine's budget rule asks it): a JSON schema's, read from
    the schema the matcher enforces (relaxed on the fallback); a tool-call grammar's, recognised by its very text
    (constraints/tool_calls.py); None for any other kind."""
    schema = compiled.schema
    if compiled.kind is ConstraintKind.JSON_SCHEMA and isinstance(schema, dict | bool):
        return JsonOutputRule(schema)
    if compiled.kind is ConstraintKind.GRAMMAR and compiled.syntax is GrammarSyntax.LARK:
        framing = tool_calls_framing(compiled.text)
        return ToolCallsRule.of(framing) if framing is not None else None
    return None


def format_handling(spec: ConstraintSpec, result: CompileResult) -> tuple[FormatUse, ...]:
    """How each ``format`` was held: unknown → annotation; one the engine checks exactly and that was
    not relaxed → enforced; else (approximated or dropped by the fallback) → validated."""
    uses = _format_uses(spec.text)
    exact_formats = POLICIES[result.backend].formats if result.backend in POLICIES else frozenset()

    def handling(path: str, name: str, known: bool, spelled: bool) -> str:
        if not known:
            return "annotation"
        if f"format at {path}" in result.relaxed or f"pattern at {path}" in result.relaxed:
            return "validated"
        return "enforced" if name in exact_formats or spelled else "validated"

    return tuple(FormatUse(path, name, handling(path, name, known, spelled)) for path, name, known, spelled in uses)


@functools.lru_cache(maxsize=256)
def _remembered(schema_text: str) -> tuple[str, ...]:
    """The keywords the key memory serves exactly (prepared once per distinct schema, not per request)."""
    try:
        return remembered_keywords(json.loads(schema_text))
    except (ConstraintError, RecursionError, ValueError):
        return ()


@functools.lru_cache(maxsize=256)
def _format_uses(schema_text: str) -> tuple[tuple[str, str, bool, bool], ...]:
    """The formats of a schema (prepared once per distinct schema, not per request)."""
    try:
        return tuple(format_uses(prepare_schema(json.loads(schema_text))))
    except (ConstraintError, RecursionError):
        return ()
