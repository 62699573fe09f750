"""A JSON schema's output rule (constraints/output_rule.py): what the engine's budget rule asks, answered by the closer.

The engine reads an output's endings through this and never sees the closer, so how a schema is read (its
options, its shortest values, the closer's stack) stays in this package.
"""

from __future__ import annotations

from dataclasses import dataclass

from proctor.constraints.json_schema.closer import JsonCloser, growth_texts
from proctor.constraints.json_schema.options import Schema


@dataclass(frozen=True, slots=True)
class JsonOutputRule:
    """The output rule of ``schema``: the one the matcher enforces (the compiled, possibly relaxed, schema)."""

    schema: Schema | bool

    def reader(self) -> JsonCloser:
        """A closer at the empty output (one per row)."""
        return JsonCloser(self.schema)

    def growth_texts(self) -> list[str]:
        return growth_texts(self.schema)
