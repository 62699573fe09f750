"""The AUTO engine policy (proctor.constraints.auto): valid, capability-respecting, sound-first orders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.constraints.auto import ORDER, backend_order, policy_key
from proctor.constraints.engines import BACKEND_NAMES, ENGINES
from proctor.constraints.spec import ConstraintKind, ConstraintSpec, GrammarSyntax

SUPPORTS = {name: entry.kinds for name, entry in ENGINES.items()}

ROOT = Path(__file__).resolve().parents[2]

SPECS = {
    "json_schema": ConstraintSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}),
    "json_schema_flexible": ConstraintSpec.json_schema({"type": "string"}, flexible_whitespace=True),
    "json_schema_boolean": ConstraintSpec.json_schema(True),
    "regex": ConstraintSpec.regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    "choice": ConstraintSpec.choice(["yes", "no"]),
    "lark": ConstraintSpec.grammar('start: "a"+', GrammarSyntax.LARK),
    "ebnf": ConstraintSpec.grammar('root ::= "a"+', GrammarSyntax.EBNF),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_kind_gets_known_engines_without_repeats(name: str) -> None:
    order = backend_order(SPECS[name])
    assert isinstance(order, tuple) and order
    assert set(order) <= set(BACKEND_NAMES)
    assert len(set(order)) == len(order)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_only_engines_that_implement_the_kind_are_tried(name: str) -> None:
    spec = SPECS[name]
    assert all(policy_key(spec) in SUPPORTS[engine] for engine in backend_order(spec))


def test_the_table_covers_every_kind_and_syntax_and_nothing_else() -> None:
    keys = {kind.value for kind in ConstraintKind if kind is not ConstraintKind.GRAMMAR}
    keys |= {f"grammar:{syntax.value}" for syntax in GrammarSyntax}
    assert set(ORDER) == keys
    assert set(SUPPORTS) == set(BACKEND_NAMES)
    for key, order in ORDER.items():  # no engine that implements a kind is left out of its order...
        left_out = {"outlines"} if key == "json_schema" else set()  # ...but outlines for JSON (measured)
        assert set(order) == {engine for engine, kinds in SUPPORTS.items() if key in kinds} - left_out, key


def test_lark_goes_to_llguidance_only() -> None:
    assert backend_order(SPECS["lark"]) == ("llguidance",)


def test_ebnf_goes_to_xgrammar_first_then_llguidance() -> None:
    assert backend_order(SPECS["ebnf"]) == ("xgrammar", "llguidance")


def test_outlines_never_gets_a_grammar() -> None:
    assert "outlines" not in backend_order(SPECS["lark"]) + backend_order(SPECS["ebnf"])


def test_json_schema_tries_the_refusing_engine_first_then_the_validated_fallback() -> None:
    """llguidance refuses what it cannot enforce; outlines (under-constrained on MaskBench, the slowest
    compile) is not in AUTO: what the exact engines refuse goes to the validated fallback on llguidance."""
    from proctor.constraints.auto import FALLBACK, policy_key

    for name in ("json_schema", "json_schema_flexible", "json_schema_boolean"):
        order = backend_order(SPECS[name])
        assert order == ("llguidance", "xgrammar")
        assert FALLBACK[policy_key(SPECS[name])] == "llguidance"


def test_regex_and_choice_start_with_llguidance() -> None:
    """Measured: as sound as xgrammar on the set, without xgrammar's multi-second compile tails."""
    for name in ("regex", "choice"):
        assert backend_order(SPECS[name])[0] == "llguidance"


def test_outlines_comes_after_the_sounder_engines_for_regex_and_choice() -> None:
    """outlines-core over-constrains optional tails after a final state (measured): never first."""
    for name in ("regex", "choice"):
        assert backend_order(SPECS[name])[-1] == "outlines"


def test_the_order_depends_on_the_kind_only() -> None:
    a = ConstraintSpec.json_schema({"type": "string"})
    b = ConstraintSpec.json_schema({"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/x"}], "$defs": {"x": {}}})
    assert backend_order(a) == backend_order(b)
    assert backend_order(ConstraintSpec.regex("a")) == backend_order(ConstraintSpec.regex("(b|c)*"))


def test_the_policy_module_imports_no_engine() -> None:
    """A pure function: deciding the order must not load an engine (or torch) into the caller."""
    code = ("import sys\nimport proctor.constraints.auto\n"
            "print(','.join(sorted(m for m in ('torch', 'xgrammar', 'llguidance', 'outlines_core') "
            "if m in sys.modules)))\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "service"), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
