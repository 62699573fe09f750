"""Forbidden phrases, stop strings and plugins through gRPC with the real model.

Outputs are searched for forbidden phrases with the tests' own oracle (``helpers.oracles.contains_phrase``),
not with the server's ``matches_text``."""

from __future__ import annotations

import pytest
from helpers.oracles import contains_phrase, is_valid_json

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model


def test_the_only_alternative_without_the_phrase_wins(client: ProctorClient) -> None:
    options = ["Apple pie", "an APPLE tart", "fresh aPPle juice", "cherry cake"]
    response = client.generate("My favourite dessert is", choice=options, forbidden=["apple"], max_new_tokens=16)
    assert response.text == "cherry cake"
    regex = client.generate("My favourite dessert is", regex=r"(Apple|APPLE|ApPlE) (pie|tart)|plum crumble",
                            forbidden=["apple"], max_new_tokens=16)
    assert regex.text == "plum crumble"


def test_a_constraint_that_can_only_produce_the_phrase_ends_in_a_dead_end(client: ProctorClient) -> None:
    response = client.generate("Name a fruit:", choice=["Apple"], forbidden=["APPLE"], max_new_tokens=8)
    assert response.finish_reason == pb.FINISH_REASON_FORBIDDEN_PHRASE
    assert "APPLE" in response.finish_detail
    assert not contains_phrase("apple", response.text)


def test_chinese_phrases_are_forbidden(client: ProctorClient) -> None:
    choice = client.generate("我最喜欢的水果是", choice=["我喜欢苹果", "我喜欢香蕉"], forbidden=["苹果"],
                             max_new_tokens=16)
    assert choice.text == "我喜欢香蕉"
    prompt = [("user", "请用中文介绍一下苹果这种水果。")]
    plain = client.generate(messages=prompt, max_new_tokens=60, temperature=0)
    assert contains_phrase("苹果", plain.text) or contains_phrase("水果", plain.text), \
        f"the prompt should invite the words: {plain.text!r}"
    free = client.generate(messages=prompt, forbidden=["苹果", "水果"], max_new_tokens=60, temperature=0,
                           token_details=True)
    assert free.text and not contains_phrase("苹果", free.text) and not contains_phrase("水果", free.text)
    assert "forbidden" in {token.removed_by for token in free.tokens}


def test_free_text_never_contains_a_forbidden_word_in_any_case(client: ProctorClient) -> None:
    prompt = [("user", "List five fruits, one per line: apple, banana, cherry, ...")]
    plain = client.generate(messages=prompt, max_new_tokens=48, temperature=0)
    banned = ["apple", "banana", "cherry"]
    assert any(contains_phrase(word, plain.text) for word in banned), "the prompt should invite the words"
    response = client.generate(messages=prompt, max_new_tokens=48, temperature=0, forbidden=banned,
                               token_details=True)
    assert not any(contains_phrase(word, response.text) for word in banned), response.text
    assert "forbidden" in {token.removed_by for token in response.tokens}


def test_a_stop_string_inside_a_forced_output_ends_before_it(client: ProctorClient) -> None:
    chunks = list(client.stream_generate("Say it:", regex=r"abc END xyz", stop=["END"], max_new_tokens=16))
    text = "".join(chunk.text for chunk in chunks)
    assert text == "abc "
    assert chunks[-1].finish_reason == pb.FINISH_REASON_STOP_STRING
    # Nothing of END was ever sent (and later withdrawn): every chunk is part of the final text.
    assert all("E" not in chunk.text for chunk in chunks)


def test_plugins_run_and_are_reported(client: ProctorClient) -> None:
    response = client.generate(messages=[("user", "Draft a mutual NDA between Acme and Blue Harbor.")],
                               schema_ref="contract/nda@1", max_new_tokens=200, temperature=0,
                               stopping_criteria=[("json_value_complete", {"path": "$.title"})])
    assert response.finish_reason == pb.FINISH_REASON_STOP_CRITERION
    assert response.text.startswith('{"title":"') and '"parties"' not in response.text
    assert not response.schema_validation.valid  # a cut document is never reported valid
    assert not is_valid_json(response.text, {})  # nor is it JSON at all
    assert [(p.name, p.version, p.kind) for p in response.plugins] == [
        ("json_value_complete", "1.0", "stopping_criterion")]
    with pytest.raises(ProctorError) as caught:
        client.generate("Hi", logits_processors=["no_such_processor"], max_new_tokens=4)
    assert caught.value.code.name == "INVALID_ARGUMENT"
    assert [field for field, _ in caught.value.field_violations] == ["logits_processors[0].name"]


def test_bad_forbidden_lists_are_invalid_argument(client: ProctorClient) -> None:
    with pytest.raises(ProctorError) as caught:
        client.generate("Hi", forbidden=["ok", "   ", "x" * 1000], max_new_tokens=4)
    assert caught.value.code.name == "INVALID_ARGUMENT"
    assert [field for field, _ in caught.value.field_violations] == ["forbidden.phrases[1]", "forbidden.phrases[2]"]
