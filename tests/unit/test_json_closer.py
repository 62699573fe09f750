"""The closer (json_schema/closer.py): from any point of a JSON output, the shortest texts that end it validly.

Checked on hand-made states for each part it finishes, and on MaskBench: every valid instance the matcher
accepts, cut at eight points; an ending the matcher accepts to an accepting state must give a valid document, and
nearly every cut must have one."""

from __future__ import annotations

import json

import pytest
from test_constraint_backends_suite import maskbench_sample

from proctor.constraints.json_schema import JsonOutputRule
from proctor.constraints.json_schema.closer import JsonCloser
from proctor.constraints.json_schema.growth import growth_texts
from proctor.constraints.json_schema.validation import validate_json_output
from proctor.constraints.output_rule import OutputRule

OBJECT = {"type": "object", "required": ["name", "tags", "kind"], "properties": {
    "name": {"type": "string", "minLength": 3}, "note": {"type": "string"},
    "tags": {"type": "array", "minItems": 2, "items": {"enum": ["red", "green"]}},
    "kind": {"enum": ["service", "supply"]}, "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d$"},
    "count": {"type": "integer", "minimum": 10}}}


@pytest.mark.parametrize(("written", "ending"), [
    ("", '{"name":"aaa","tags":["red","red"],"kind":"supply"}'),
    ('{"name":"a', 'aa","tags":["red","red"],"kind":"supply"}'),  # minLength, then the missing members
    ('{"name":"abcd\\', 'n","tags":["red","red"],"kind":"supply"}'),  # an escape begun is finished
    ('{"name":"abc","note', '":"","tags":["red","red"],"kind":"supply"}'),  # a key begun: its shortest value
    ('{"name":"abc","tags":["gr', 'een","red"],"kind":"supply"}'),  # an enum member begun, then minItems
    ('{"name":"abc","tags":["red","green"],"kind":"se', 'rvice"}'),
    ('{"name":"abc","tags":["red","red"],"kind":"supply","code":"X', 'A-0"}'),  # a pattern's shortest completion
    ('{"name":"abc","tags":["red","red"],"kind":"supply","count":1', '0}'),  # a number below its minimum
    ('{"name":"abc","tags":["red","red"],"kind":"supply","count":-', None),  # no digit brings it to 10
    ('{"name":"abc","tags":["red","red"],"kind":"supply"}', ""),
])
def test_each_part_is_finished_by_its_shortest_text(written: str, ending: str | None) -> None:
    closer = JsonCloser(OBJECT)
    closer.push(written)
    endings = closer.endings()
    if ending is None:
        assert endings == []
        return
    assert endings[0] == ending
    assert validate_json_output(written + ending, OBJECT, truncated=False).valid


def test_text_pushed_a_character_or_a_token_at_a_time_reads_the_same() -> None:
    text = '{"name":"a \\"quoted\\" name","tags":["red"'
    whole, pieces = JsonCloser(OBJECT), JsonCloser(OBJECT)
    whole.push(text)
    for char in text:
        pieces.push(char)
    assert whole.endings() == pieces.endings() == [',"red"],"kind":"supply"}']


def test_the_output_rule_the_engine_sees_reads_as_the_closer_does() -> None:
    """engine/closing.py sees a schema only through ``OutputRule`` (constraints/output_rule.py): a fresh reader per
    row, at the empty output, and the growth texts; each answers what the closer answers."""
    rule: OutputRule = JsonOutputRule(OBJECT)
    row, other = rule.reader(), rule.reader()
    assert row.endings() == JsonCloser(OBJECT).endings() == ['{"name":"aaa","tags":["red","red"],"kind":"supply"}']
    row.push('{"name":"abc","tags":["red","green"],"kind":"se')
    assert row.endings() == ['rvice"}'] and not row.done
    assert other.endings() == JsonCloser(OBJECT).endings()  # each row's reader keeps its own place
    row.push('rvice"}')
    assert row.done and row.endings() == [""]
    assert rule.growth_texts() == growth_texts(OBJECT)


def test_a_number_too_large_for_a_float_is_read_without_error() -> None:
    closer = JsonCloser({"type": "number", "multipleOf": 0.5})
    closer.push("1" + "0" * 400)
    assert closer.endings() == []  # no multiple of 0.5 the closer can tell: it offers nothing, it does not raise


def test_local_refs_and_branches_are_followed() -> None:
    schema = {"$defs": {"party": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}},
              "anyOf": [{"$ref": "#/$defs/party"}, {"type": "array", "items": {"$ref": "#/$defs/party"},
                                                       "minItems": 1}]}
    closer = JsonCloser(schema)
    closer.push("[")
    assert closer.endings()[0] == '{"id":0}]'
    assert '"id":0' in growth_texts(schema)


def test_on_maskbench_an_accepted_ending_is_always_valid_and_nearly_every_cut_has_one(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from proctor.constraints.backends import create_backend
    from proctor.constraints.spec import ConstraintSpec
    from proctor.engine.closing import accepts

    backend = create_backend("llguidance", tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    cuts = ended = 0
    wrong: list[str] = []
    for item in maskbench_sample():
        try:
            compiled = backend.compile(ConstraintSpec.json_schema(item["schema"]))
        except Exception:  # not served: nothing to end
            continue
        valid = [t["data"] for t in item["tests"] if t["valid"]]
        ids = tokenizer.encode(json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False),
                               add_special_tokens=False) if valid else []
        if not ids or compiled.new_matcher().valid_prefix(ids) != len(ids):  # written in another member order
            continue
        for cut in range(0, len(ids), max(1, len(ids) // 8)):
            matcher = compiled.new_matcher()
            assert all(matcher.advance(t) for t in ids[:cut])
            closer = JsonCloser(item["schema"])
            written = tokenizer.decode(ids[:cut])
            closer.push(written)
            cuts += 1
            for text in closer.endings():
                if accepts(matcher, tokenizer.encode(text, add_special_tokens=False), len(tokenizer)):
                    ended += 1
                    if not validate_json_output(written + text, item["schema"], truncated=False).valid:
                        wrong.append(f"{item['name']}: {written + text}"[:300])
                    break
    assert cuts > 1000
    assert not wrong, "\n".join(wrong)
    assert ended >= 0.95 * cuts, f"{ended} of {cuts} cuts ended"


TIES = {"anyOf": [  # endings of equal length: which comes first must not follow a set's iteration order
    {"type": "object", "required": ["ab"], "properties": {"ab": {"enum": ["xy", "yx", "zz"]}}},
    {"type": "object", "required": ["ba"], "properties": {"ba": {"type": "string", "pattern": "^[a-z][0-9]$"}}},
    {"type": "array", "minItems": 1, "items": {"enum": ["qq", "pp"]}}]}
TIE_SCRIPT = """
import json, sys
from proctor.constraints.json_schema.closer import JsonCloser
schema = json.loads(sys.argv[1])
found = []
for written in ("", "{", '{"', '{"b', '{"ba":"', "[", '["'):
    closer = JsonCloser(schema)
    closer.push(written)
    found.append(closer.endings())
print(json.dumps(found))
"""


def test_the_endings_do_not_follow_the_string_hash_seed() -> None:
    """A replay runs in another process, with another hash seed: it must be offered the same endings in the same
    order, or a tie between two equally short endings could force a different one."""
    import os
    import subprocess
    import sys

    answers = set()
    for seed in ("1", "2", "3", "4"):
        run = subprocess.run([sys.executable, "-c", TIE_SCRIPT, json.dumps(TIES)], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        answers.add(run.stdout)
    assert len(answers) == 1, answers
    endings = json.loads(answers.pop())
    assert all(endings), endings
    assert all(e == sorted(e, key=lambda t: (len(t), t)) for e in endings), endings


def test_what_one_more_token_can_begin_is_read_where_the_output_stands() -> None:
    """growth.py: per schema, every value under each of its alternatives (``{`` may open the object where ``null``
    was shortest); per state, only the members still to write of the values open, a part of the schema's."""
    from proctor.constraints.json_schema.growth import growth_here

    schema = {"type": "object", "required": ["type", "data"], "additionalProperties": False, "properties": {
        "type": {"const": "data"}, "note": {"type": "string"}, "data": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}
    every = growth_texts(schema)
    assert '"data":null' in every and '"data":{"type":"data","data":null}' in every
    closer = JsonCloser(schema)
    # before anything: a token may open the object and begin any of its members
    assert set(growth_here(closer)) == {'"type":"data"', '"note":""', '"data":null',
                                        '"data":{"type":"data","data":null}'}
    closer.push('{"type":"data","data":')
    assert '"data":{"type":"data","data":null}' in growth_here(closer)  # it may open a level and begin its member
    closer.push('{"type":"da')
    here = growth_here(closer)
    assert set(here) <= set(every) and '"note":""' in here
    assert not any(text.startswith('"type"') for text in here)  # written in both objects: not begun again
    closer.push('ta","data":null}}')
    assert closer.done and growth_here(closer) == []


def test_an_integer_past_a_floats_range_is_read_and_may_end_where_it_is() -> None:
    """A weak model writes ``"population": 1000000000…`` for as long as it may: the closer reads it without
    error (the rule stays on), and the integer is complete as it stands."""
    closer = JsonCloser({"type": "object", "properties": {"population": {"type": "integer"}},
                         "required": ["population"]})
    closer.push('{"population":1' + "0" * 400)
    assert closer.endings() == ["}"]
