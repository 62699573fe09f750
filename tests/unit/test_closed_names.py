"""Each closed set of names has one table, and everything that spells the set agrees with it.

The sets: the constraint engines (constraints/engines.py), the context-overflow policies and beam search's
early stopping (domain/request.py). The proto enums are the wire's side; the client's names are derived from
them, the server's conversion tables too (api/convert.py).
"""

from __future__ import annotations

from typing import get_args

import pytest
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from proctor.api import convert
from proctor.constraints.auto import FALLBACK, ORDER
from proctor.constraints.backends.llguidance_backend import NAME as LLGUIDANCE_NAME
from proctor.constraints.backends.xgrammar_backend import NAME as XGRAMMAR_NAME
from proctor.constraints.engines import AUTO, BACKEND_NAMES, ENGINES
from proctor.constraints.json_schema.support import POLICIES
from proctor.domain.request import ContextOverflow, EarlyStopping, Speculation
from proctor_client import request as client
from proctor_client.v1 import generation_pb2 as pb


def test_every_engine_has_an_adapter_a_policy_and_a_wire_name() -> None:
    assert set(POLICIES) == set(ENGINES) == set(BACKEND_NAMES)
    assert {XGRAMMAR_NAME, LLGUIDANCE_NAME} <= set(ENGINES)
    for entry in ENGINES.values():
        assert entry.adapter_class().__name__ == entry.adapter.partition(":")[2]
    assert set(client.CONSTRAINT_BACKENDS) == {AUTO, *BACKEND_NAMES}
    assert {name for name in convert.BACKEND_FROM_PROTO.values()} == {AUTO, *BACKEND_NAMES}


def test_auto_names_only_engines_that_implement_the_row() -> None:
    for row, names in ORDER.items():
        assert names and all(row in ENGINES[name].kinds for name in names), row
    assert all(row in ENGINES[name].kinds for row, name in FALLBACK.items())


@pytest.mark.parametrize(("enum", "prefix", "members", "client_names", "table"), [
    (pb.ContextOverflow, "CONTEXT_OVERFLOW_", ContextOverflow, client.CONTEXT_OVERFLOWS,
     convert.CONTEXT_OVERFLOW_FROM_PROTO),
    (pb.BeamEarlyStopping, "BEAM_EARLY_STOPPING_", EarlyStopping, client.EARLY_STOPPINGS,
     convert.EARLY_STOPPING_FROM_PROTO),
])
def test_a_policy_set_is_the_same_on_the_wire_the_server_and_the_client(
        enum: EnumTypeWrapper, prefix: str, members: type[ContextOverflow] | type[EarlyStopping],
        client_names: tuple[str, ...], table: dict[int, str]) -> None:
    wire = {name.removeprefix(prefix) for name, number in enum.items() if number != 0}
    assert wire == {member.name for member in members}
    assert set(client_names) == {member.name.lower() for member in members}
    assert set(table) == set(enum.values())  # every number, UNSPECIFIED included
    assert set(table.values()) == set(members)


def test_the_client_literals_spell_what_the_proto_defines() -> None:
    pairs = [(client.GrammarSyntaxName, client.GRAMMAR_SYNTAXES), (client.ConstraintBackendName,
             client.CONSTRAINT_BACKENDS), (client.JsonWhitespaceName, client.JSON_WHITESPACES),
             (client.EarlyStoppingName, client.EARLY_STOPPINGS), (client.ContextOverflowName, client.CONTEXT_OVERFLOWS),
             (client.SpeculationName, client.SPECULATIONS)]
    for literal, names in pairs:
        assert get_args(literal) == names


def test_speculation_is_the_same_on_the_wire_the_server_and_the_client() -> None:
    wire = {name.removeprefix("SPECULATION_") for name, number in pb.Speculation.items() if number != 0}
    assert wire == {member.name for member in Speculation if member is not Speculation.DEFAULT}
    assert set(client.SPECULATIONS) == {name.lower() for name in wire}
    assert set(convert.SPECULATION_FROM_PROTO) == set(pb.Speculation.values())
    assert set(convert.SPECULATION_FROM_PROTO.values()) == set(Speculation)


def test_records_keep_the_values_they_always_held() -> None:
    """The audit trail stores these values: renaming one would make old records unreadable at replay."""
    assert [m.value for m in EarlyStopping] == ["false", "true", "never"]
    assert [m.value for m in ContextOverflow] == ["refuse", "drop_oldest_turns", "keep_start_and_end"]
