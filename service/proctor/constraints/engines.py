"""The constraint engines Proctor serves: the one table of their names, adapters and what each implements.

Everything that names an engine derives from ``ENGINES``: the wire's ``CONSTRAINT_BACKEND_<NAME>``
(api/convert.py), the compile workers' warm-up, ``create_backend``, AUTO's order (constraints/auto.py, whose
rows may only name engines listed here) and each engine's soundness policy (constraints/json_schema/support.py).
An adapter module is imported only when its engine is first built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

XGRAMMAR, LLGUIDANCE, OUTLINES = "xgrammar", "llguidance", "outlines"
AUTO = "auto"  # not an engine: the policy that picks one (constraints/auto.py)
# Rows of the policy tables: a constraint's kind, and for grammars its syntax (auto.policy_key).
JSON, REGEX, CHOICE, LARK, EBNF = "json_schema", "regex", "choice", "grammar:lark", "grammar:ebnf"


@dataclass(frozen=True, slots=True)
class EngineEntry:
    name: str
    adapter: str  # "module:Class" of the adapter (constraints/backends/), imported on first use
    kinds: frozenset[str]  # what the adapter implements at all, before any soundness guard

    def adapter_class(self) -> Any:
        module, _, cls = self.adapter.partition(":")
        return getattr(importlib.import_module(module), cls)


ENGINES: dict[str, EngineEntry] = {entry.name: entry for entry in (
    EngineEntry(XGRAMMAR, "proctor.constraints.backends.xgrammar_backend:XGrammarBackend",
                frozenset({JSON, REGEX, CHOICE, EBNF})),
    EngineEntry(LLGUIDANCE, "proctor.constraints.backends.llguidance_backend:LLGuidanceBackend",
                frozenset({JSON, REGEX, CHOICE, LARK, EBNF})),
    EngineEntry(OUTLINES, "proctor.constraints.backends.outlines_backend:OutlinesBackend",
                frozenset({JSON, REGEX, CHOICE})),
)}
BACKEND_NAMES: tuple[str, ...] = tuple(ENGINES)
