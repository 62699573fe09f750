"""The AUTO engine policy: which engines to try, in order, for a constraint (provisional order).

Measurements and justification follow once bench/constraints_soundness.py and bench/maskbench.py
have run.
"""

from __future__ import annotations

from proctor.constraints.spec import ConstraintKind, ConstraintSpec, GrammarSyntax

ORDER: dict[str, tuple[str, ...]] = {
    "json_schema": ("llguidance", "xgrammar", "outlines"),
    "regex": ("llguidance", "xgrammar", "outlines"),
    "choice": ("llguidance", "xgrammar", "outlines"),
    "grammar:lark": ("llguidance",),
    "grammar:ebnf": ("xgrammar", "llguidance"),
}


def policy_key(spec: ConstraintSpec) -> str:
    if spec.kind is ConstraintKind.GRAMMAR:
        return f"grammar:{(spec.syntax or GrammarSyntax.LARK).value}"
    return spec.kind.value


def backend_order(spec: ConstraintSpec) -> tuple[str, ...]:
    """Engines to try for ``spec``, best first; the caller falls back to the next on refusal."""
    return ORDER[policy_key(spec)]
