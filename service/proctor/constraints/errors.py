"""The one error a constraint that cannot be compiled raises, in a module of its own so that what raises it without
compiling anything (the JSON Schema guard, constraints/json_schema/, read by the HTTP door) imports no torch."""

from __future__ import annotations


class ConstraintError(ValueError):
    """The constraint cannot be compiled; ``reason`` names what (keyword and where, limit, syntax)."""

    def __init__(self, reason: str, backend: str | None = None) -> None:
        self.reason = reason
        self.backend = backend
        super().__init__(f"{backend}: {reason}" if backend else reason)
