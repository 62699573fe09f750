"""Our fast RFC 8785 serialisation equals the reference implementation (``rfc8785``) on any JSON, and
the row hashes of both record formats are pinned (records written before still verify)."""

from __future__ import annotations

import enum
import hashlib
import math

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from proctor.audit import FORMAT_V2, FORMAT_V3
from proctor.audit.canonical import canonical, clean, es6_number
from proctor.audit.chain import row_hash, row_hash_v1, row_head
from proctor.audit.stored_body import compress, record_json

finite = st.floats(allow_nan=False, allow_infinity=False)
# The floats whose orjson text differs from JCS (integral, 1e-6 <= |x| < 1e-5, 1e16 <= |x| < 1e21, -0.0)
# and their neighbours, beside any finite float.
tricky = (st.integers(-(2**53), 2**53).map(float) | st.floats(1e-6, 1e-5) | st.floats(-1e-5, -1e-6)
          | st.floats(9e15, 1e21) | st.floats(-1e21, -9e15) | st.sampled_from([-0.0, 0.0, 1e-7, 1e21, 5e-324, 1e-5]))
# Text that looks like numbers, escapes and structure, so matches inside strings are exercised.
alphabet = st.sampled_from(list('0123456789.e+-,:[]{}"\\ \n\x00\x1f\x7fé\u2028\ufb01\U0001f600x'))
texts = st.text() | st.text(alphabet, max_size=12)
scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | finite | tricky | texts
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(texts, inner, max_size=4), max_leaves=30)


@settings(max_examples=1500, deadline=None)
@given(documents)
def test_canonical_equals_the_reference(document: object) -> None:
    assert canonical(document) == rfc8785.dumps(document)


@settings(max_examples=2000, deadline=None)
@given(finite | tricky)
def test_numbers_are_formatted_like_ecmascript(value: float) -> None:
    assert es6_number(value) == rfc8785.dumps(value).decode()
    assert canonical([value, {"v": value}]) == rfc8785.dumps([value, {"v": value}])


def test_values_json_cannot_hold_exactly_are_made_safe() -> None:
    assert canonical({"x": math.inf, "seed": 2**63 - 1}) == b'{"seed":"9223372036854775807","x":null}'
    assert canonical({"n": math.nan, "big": -(2**53)}) == b'{"big":"-9007199254740992","n":null}'
    assert clean([-math.inf]) == [None]


def test_what_the_fast_path_leaves_out_takes_the_reference() -> None:
    class Colour(enum.StrEnum):
        RED = "red"

    class Name(str):
        pass

    assert canonical({1: (2.0, Name("x"))}) == b'{"1":[2,"x"]}'  # a non-str key, a tuple, a str subclass
    assert canonical({"c": Colour.RED}) == b'{"c":"red"}'
    document = {"\U0001f600": 1, "\ufb01": 2, "a": 0.1}  # UTF-16 order differs from code-point order
    assert canonical(document) == rfc8785.dumps(document) == '{"a":0.1,"😀":1,"ﬁ":2}'.encode()


def test_text_that_looks_like_a_number_to_rewrite_stays_text() -> None:
    for text in ('1.0,', '[2e-6]', 'x\\":1.0}', '\\\\"', ':-0.0,', '😀', 'e+16,'):
        document = {"t": text, "u": [text, 1.0, 2e-6, -0.0, 1e16], text: 3.0}
        assert canonical(document) == rfc8785.dumps(document), text


@settings(max_examples=500, deadline=None)
@given(texts, texts, texts, texts, texts, st.integers(0, 2**53 - 1), st.integers(0, 2**53 - 1))
def test_the_v2_and_v3_heads_are_the_canonical_json_of_their_fields(prev: str, kind: str, audit_id: str, caller: str,
                                                                    request_id: str, seq: int, time_ms: int) -> None:
    for form in (FORMAT_V2, FORMAT_V3):
        fields = [form, seq, prev, kind, audit_id, time_ms, caller, request_id, "length"]
        head = row_head(seq, prev, kind, audit_id, time_ms, caller, request_id, "length", form)
        assert head == rfc8785.dumps(fields) + b"\n"


def test_the_row_hashes_are_pinned() -> None:
    """Fixed inputs and their hashes: v1 as the proctor.audit/1 writer computed them (values taken
    from that code), v2 as documented in docs/audit-format.md."""
    assert row_hash_v1(7, "ab" * 32, b'{"x":1}') == "b8a690e7dd7842e264068b263fb85a8b1f6f2b9a549ce72c6c272be34d5ba61f"
    v1_body = canonical({"format": "proctor.audit/1", "kind": "request", "audit_id": "id-1",
                         "caller": {"identity": "alice"}})
    assert row_hash_v1(1, "0" * 64, v1_body) == "8688d9d07590a391efeccfeeafa48ef301be47397f08c8160370ce75da57274f"
    columns = (3, "ab" * 32, "request", "id-3", 1_764_000_000_003, 'alice "x"\n', "req-3", "length")
    head = (b'["proctor.audit/2",3,"' + b"ab" * 32 + b'","request","id-3",1764000000003,"alice \\"x\\"\\n",'
            b'"req-3","length"]\n')
    assert row_head(*columns, FORMAT_V2) == head
    assert row_hash(*columns, b'{"x":1}') == hashlib.sha256(head + b'{"x":1}').hexdigest() == (
        "94c49cae92995c6facddf381045fdc423c970d88957fc7ee338aaabcac3091cf")
    stored = compress(b'{"x":1}')  # a zstd frame: the v3 head, over the stored bytes
    assert stored[:4] == b"\x28\xb5\x2f\xfd" and record_json(stored) == b'{"x":1}'
    v3_head = head.replace(b"proctor.audit/2", b"proctor.audit/3")
    assert row_head(*columns, FORMAT_V3) == row_head(*columns) == v3_head
    assert row_hash(*columns, stored) == hashlib.sha256(v3_head + stored).hexdigest()
