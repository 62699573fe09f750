"""Generation controls on the real server over real gRPC: the response fields, the last stream chunk,
and INVALID_ARGUMENT naming the field for a bad forced token."""

from __future__ import annotations

import math

import grpc
import pytest

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"


def test_confidence_forced_tokens_and_must_include_come_back(client: ProctorClient) -> None:
    plain = client.generate(PROMPT, max_new_tokens=6, token_details=True, ignore_eos=True)
    forced = plain.token_ids[0]  # a token the model itself produces first, forced at position 2 as well
    response = client.generate(PROMPT, max_new_tokens=6, token_details=True, ignore_eos=True, confidence=True,
                               forced_tokens={2: forced}, must_include=["Paris", "zq#"])
    assert response.token_ids[2] == forced and response.tokens[2].final_logprob == 0.0
    confidence = response.confidence
    assert confidence.tokens == 5  # the forced token is left out
    chosen = [math.exp(t.final_logprob) for i, t in enumerate(response.tokens) if i != 2]
    assert confidence.mean_token_probability == pytest.approx(sum(chosen) / 5, abs=1e-5)
    assert 0.0 <= confidence.min_top2_gap <= confidence.mean_top2_gap <= 1.0
    assert [(p.phrase, p.included) for p in response.must_include] == [("Paris", "Paris" in response.text),
                                                                      ("zq#", False)]
    assert response.finish_reason == pb.FINISH_REASON_LENGTH  # "zq#" never appeared: the end was held off
    assert not plain.HasField("confidence") and not plain.must_include


def test_the_last_chunk_carries_the_confidence(client: ProctorClient) -> None:
    chunks = list(client.stream_generate(PROMPT, max_new_tokens=4, confidence=True, temperature=0.8, seed=3,
                                         typical_p=0.9, greedy_first_tokens=2, ignore_eos=True))
    assert chunks[-1].HasField("confidence") and chunks[-1].confidence.tokens == 4
    assert not any(chunk.HasField("confidence") for chunk in chunks[:-1])


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"forced_tokens": {4: 1}, "max_new_tokens": 4}, "sampling.forced_tokens[4]"),
    ({"forced_tokens": {0: 10**7}, "max_new_tokens": 4}, "sampling.forced_tokens[0]"),
    ({"typical_p": 0.0}, "sampling.typical_p"),
    ({"must_include": [""]}, "stopping.must_include[0]"),
])
def test_bad_controls_are_invalid_argument_naming_the_field(client: ProctorClient, kwargs: dict[str, object],
                                                            field: str) -> None:
    with pytest.raises(ProctorError) as caught:
        client.generate(PROMPT, **kwargs)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in [name for name, _ in caught.value.field_violations]


def test_the_end_waits_for_every_must_include_phrase_and_the_record_says_so(client: ProctorClient, server) -> None:  # type: ignore[no-untyped-def]
    import json

    from proctor_client.v1 import audit_pb2, audit_pb2_grpc

    messages = [{"role": "user", "content": "Reply with one word: yes or no?"}]
    plain = client.generate(messages=messages, max_new_tokens=48)
    assert plain.finish_reason == pb.FINISH_REASON_EOS and "Paris" not in plain.text  # the model ends on its own
    held = client.generate(messages=messages, max_new_tokens=48, must_include=["Paris"], confidence=True)
    included = "Paris" in held.text
    assert [(p.phrase, p.included) for p in held.must_include] == [("Paris", included)]
    # The end came only once the phrase was there; otherwise the output ran to its limit.
    assert held.finish_reason == (pb.FINISH_REASON_EOS if included else pb.FINISH_REASON_LENGTH)
    assert len(held.token_ids) > len(plain.token_ids)
    channel = grpc.insecure_channel(server.address)
    try:
        record = json.loads(audit_pb2_grpc.AuditStub(channel).GetRecord(
            audit_pb2.GetRecordRequest(audit_id=held.audit_id)).record_json)
    finally:
        channel.close()
    assert record["must_include"] == [{"phrase": "Paris", "included": included}]
    assert record["confidence"]["tokens"] == held.confidence.tokens == len(held.token_ids)
    assert record["request"]["stopping"]["must_include"] == ["Paris"] and record["request"]["confidence"] is True


def test_an_overlong_chat_is_shortened_by_its_policy_and_reported(client: ProctorClient, server) -> None:  # type: ignore[no-untyped-def]
    import json

    from proctor_client.v1 import audit_pb2, audit_pb2_grpc

    context = client.model_info().context_length_tokens
    filler = "lorem ipsum dolor sit amet " * 120  # about 600 tokens a turn
    messages = [{"role": "system", "content": "Answer briefly."}]
    messages += [{"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n}: {filler}"} for n in range(16)]
    messages.append({"role": "user", "content": "What is the capital of France?"})
    # The whole output budget (4,096, the server's cap) must fit: half the context is left for the input, so
    # each call prefills ~4k tokens; the choice ends the output at once.
    budget, answer = 4096, {"choice": ["Paris", "Lyon"]}
    with pytest.raises(ProctorError) as refused:
        client.generate(messages=messages, max_new_tokens=8)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    response = client.generate(messages=messages, max_new_tokens=budget, context_overflow="drop_oldest_turns",
                               **answer)
    truncation = response.prompt_truncation
    assert truncation.policy == pb.CONTEXT_OVERFLOW_DROP_OLDEST_TURNS and truncation.dropped_messages > 0
    assert truncation.original_prompt_tokens >= context >= truncation.prompt_tokens + budget  # the output kept its room
    assert response.usage.prompt_tokens == truncation.prompt_tokens and response.text in answer["choice"]
    channel = grpc.insecure_channel(server.address)
    try:
        stub = audit_pb2_grpc.AuditStub(channel)
        record = json.loads(stub.GetRecord(audit_pb2.GetRecordRequest(audit_id=response.audit_id)).record_json)
        assert record["prompt_truncation"]["dropped_messages"] == truncation.dropped_messages
        assert record["request"]["context_overflow"] == "drop_oldest_turns"
        assert "turn 0:" not in record["prompt"]["text"] and "capital of France" in record["prompt"]["text"]
    finally:
        channel.close()
    # keep_start_and_end, and that a replay cuts the same way: tests/unit/test_context_policy.py (each
    # call here prefills ~4k tokens).
