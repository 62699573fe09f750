"""A JSON schema's output rule (constraints/output_rule.py): what the engine's budget rule asks, answered by the closer.

The engine reads an output's endings through this and never sees the closer, so how a schema is read (its
options, its shortest values, the closer's stack, what one more token can begin: growth.py) stays in this package.
"""

from __future__ import annotations

from dataclasses import dataclass

from proctor.constraints.json_schema.closer import JsonCloser
from proctor.constraints.json_schema.growth import growth_here, growth_texts
from proctor.constraints.json_schema.options import Schema


class JsonReader:
    """One output read against a schema (constraints/output_rule.py's ``OutputReader``): the closer, and what one
    more token can begin from where it stands."""

    def __init__(self, schema: Schema | bool) -> None:
        self.closer = JsonCloser(schema)

    @property
    def done(self) -> bool:
        return self.closer.done

    @property
    def repeated(self) -> str:
        """A JSON value is one output: it never repeats a whole one (a loop inside it is the repetition rule's)."""
        return ""

    def push(self, text: str) -> None:
        self.closer.push(text)

    def endings(self) -> list[str]:
        return self.closer.endings()

    def growth_texts(self) -> list[str]:
        return growth_here(self.closer)


@dataclass(frozen=True, slots=True)
class JsonOutputRule:
    """The output rule of ``schema``: the one the matcher enforces (the compiled, possibly relaxed, schema)."""

    schema: Schema | bool

    def reader(self) -> JsonReader:
        """A reader at the empty output (one per row)."""
        return JsonReader(self.schema)

    def growth_texts(self) -> list[str]:
        return growth_texts(self.schema)
