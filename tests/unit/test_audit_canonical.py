"""Our fast RFC 8785 serialisation equals the reference implementation (``rfc8785``) on any JSON."""

from __future__ import annotations

import math

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from proctor.audit.chain import canonical, clean, es6_number

finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | finite | st.text()
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(documents)
def test_canonical_equals_the_reference(document: object) -> None:
    assert canonical(document) == rfc8785.dumps(document)


@settings(max_examples=2000, deadline=None)
@given(finite)
def test_numbers_are_formatted_like_ecmascript(value: float) -> None:
    assert es6_number(value) == rfc8785.dumps(value).decode()


def test_values_json_cannot_hold_exactly_are_made_safe() -> None:
    assert canonical({"x": math.inf, "seed": 2**63 - 1}) == b'{"seed":"9223372036854775807","x":null}'
    assert clean([-math.inf]) == [None]


def test_text_that_looks_like_a_marker_stays_text() -> None:
    sneaky = "\x00deadbeefdeadbeef:1.5\x00"
    assert canonical({"t": sneaky}) == rfc8785.dumps({"t": sneaky})


def test_keys_outside_the_bmp_use_the_reference_order() -> None:
    document = {"\U0001f600": 1, "\ufb01": 2, "a": 0.1}
    assert canonical(document) == rfc8785.dumps(document)
