"""What a request asks to be constrained to, in canonical form (the compile-cache key's core)."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field

# Flexible JSON whitespace: at most this many whitespace characters between two JSON tokens (a newline and an
# indentation of 15; one to three tokens), so a model cannot spend its budget on a run of spaces or newlines
# (vLLM issue 38696). Compact JSON has none; outlines' flexible pattern is one space at most already.
MAX_JSON_WHITESPACE = 16


class ConstraintKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"


class GrammarSyntax(enum.Enum):
    LARK = "lark"
    EBNF = "ebnf"  # GBNF as in llama.cpp / xgrammar



@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """A constraint in canonical form.

    ``text`` is compact JSON for JSON schemas (no spaces, the author's key order, which decides
    the order of generated properties), the regex as given, a JSON list for choices, the grammar
    text for grammars. ``sha256`` identifies the constraint independently of key order.
    ``parsed`` carries a JSON schema as the object ``text`` was written from, so nothing after the
    request's check parses the text again (empty when built from text alone; not part of equality).
    """

    kind: ConstraintKind
    text: str
    syntax: GrammarSyntax | None = None
    flexible_whitespace: bool = False
    parsed: tuple[object, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def json_schema(cls, schema: object, flexible_whitespace: bool = False) -> ConstraintSpec:
        # Compact but in the author's key order: engines emit properties in schema order, and a
        # contract should read parties → dates → clauses, not alphabetically.
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        return cls(ConstraintKind.JSON_SCHEMA, text, flexible_whitespace=flexible_whitespace, parsed=(schema,))

    @classmethod
    def regex(cls, pattern: str) -> ConstraintSpec:
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def choice(cls, options: list[str] | tuple[str, ...]) -> ConstraintSpec:
        return cls(ConstraintKind.CHOICE, json.dumps(list(options), ensure_ascii=False))

    @classmethod
    def grammar(cls, text: str, syntax: GrammarSyntax) -> ConstraintSpec:
        return cls(ConstraintKind.GRAMMAR, text, syntax=syntax)

    @property
    def options(self) -> list[str]:
        """The alternatives of a CHOICE constraint."""
        return list(json.loads(self.text)) if self.kind is ConstraintKind.CHOICE else []

    @property
    def schema(self) -> object:
        """A JSON schema's object (None for the other kinds). Treat it as read-only: it is shared."""
        if self.kind is not ConstraintKind.JSON_SCHEMA:
            return None
        return self.parsed[0] if self.parsed else json.loads(self.text)

    def canonical_text(self) -> str:
        """Key-order-independent text: a JSON schema's canonical JSON, else ``text``."""
        return canonical_json(self.schema) if self.kind is ConstraintKind.JSON_SCHEMA else self.text

    def sha256(self, canonical: str | None = None) -> str:
        """Hash of the canonical spec (recorded in responses and the audit); ``canonical``: canonical_text(),
        when the caller has it already."""
        text = canonical if canonical is not None else self.canonical_text()
        payload = json.dumps([self.kind.value, text, self.syntax.value if self.syntax else None,
                              self.flexible_whitespace], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


REGEX_META = set(r"\.^$|?*+()[]{}/")


def escape_regex_literal(text: str) -> str:
    """Escape a literal for the regex dialects all three engines accept (no ``\\ `` for spaces)."""
    return "".join("\\" + ch if ch in REGEX_META else ch for ch in text)


def choice_regex(options: list[str]) -> str:
    return "(" + "|".join(escape_regex_literal(o) for o in options) + ")"
