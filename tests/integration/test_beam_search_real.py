"""Beam search over gRPC with the real model: the returned beams, the audit record, exact replay, a stream
that arrives whole, and what beams do not combine with refused by field (generate() equality: the unit
tests, on the dense tiny model)."""

from __future__ import annotations

import json

import grpc
import pytest
from helpers.oracles import assert_valid_json

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import audit_pb2, audit_pb2_grpc

pytestmark = pytest.mark.real_model
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "country": {"type": "string", "maxLength": 20}},
          "required": ["city", "country"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "The capital of France as JSON with its country."}]


def test_beams_come_back_best_first_audited_and_replayable(client: ProctorClient, server) -> None:  # type: ignore[no-untyped-def]
    response = client.generate(messages=MESSAGES, json_schema=SCHEMA, max_new_tokens=40, num_beams=4,
                               num_return_sequences=3, early_stopping="never", timeout_s=300)
    sequences = list(response.sequences)
    assert len(sequences) == 3 and response.schema_validation.valid
    assert [s.score for s in sequences] == sorted((s.score for s in sequences), reverse=True)
    assert all(assert_valid_json(s.text, SCHEMA)["city"] for s in sequences)  # every beam is valid for the schema
    assert len({tuple(s.token_ids) for s in sequences}) == 3
    assert sequences[0].text == response.text
    channel = grpc.insecure_channel(server.address)
    try:
        stub = audit_pb2_grpc.AuditStub(channel)
        record = json.loads(stub.GetRecord(audit_pb2.GetRecordRequest(audit_id=response.audit_id)).record_json)
        assert [s["token_ids"] for s in record["sequences"]] == [list(s.token_ids) for s in sequences]
        for stored in record["sequences"]:  # every returned beam audited token by token, not only the best
            assert [t["id"] for t in stored["tokens"]] == stored["token_ids"]
            assert all(t["logprob"] <= 0 and len(t["top"]) == 5 for t in stored["tokens"])
        assert record["request"]["sampling"]["num_beams"] == 4 and record["request"]["num_return_sequences"] == 3
        replay = stub.Replay(audit_pb2.ReplayRequest(audit_id=response.audit_id), timeout=300)
        assert replay.exact_match, replay.message
    finally:
        channel.close()
    chunks = list(client.stream_generate(messages=MESSAGES, json_schema=SCHEMA, max_new_tokens=40, num_beams=4,
                                         early_stopping="never", timeout_s=300))
    assert "".join(c.text for c in chunks) == response.text and chunks[-1].sequences[0].text == response.text


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_beams": 2, "temperature": 0.8}, "sampling.temperature"),
    ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences"),
    ({"num_return_sequences": 2}, "num_return_sequences"),
    ({"num_beams": 2, "stop": ["x"]}, "stopping"),
])
def test_what_beams_do_not_combine_with_is_invalid_argument(client: ProctorClient, kwargs: dict[str, object],
                                                            field: str) -> None:
    with pytest.raises(ProctorError) as error:
        client.generate("Hello", max_new_tokens=4, **kwargs)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in [f for f, _ in error.value.field_violations]


def test_n_sampled_completions_each_audited_and_reproducible(client: ProctorClient, server) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"messages": MESSAGES, "max_new_tokens": 24, "temperature": 0.9, "seed": 5, "num_return_sequences": 3}
    response = client.generate(**kwargs, timeout_s=300)
    sequences = list(response.sequences)
    assert len(sequences) == 3 and sequences[0].text == response.text and sequences[0].audit_id == response.audit_id
    assert len({s.audit_id for s in sequences}) == 3 and len({tuple(s.token_ids) for s in sequences}) > 1
    assert not response.tokens  # the caller did not ask for token details
    again = client.generate(**kwargs, timeout_s=300)
    assert [s.token_ids for s in again.sequences] == [s.token_ids for s in sequences]  # seeds derived, not random
    channel = grpc.insecure_channel(server.address)
    try:
        stub = audit_pb2_grpc.AuditStub(channel)
        for index, sequence in enumerate(sequences):
            record = json.loads(stub.GetRecord(audit_pb2.GetRecordRequest(audit_id=sequence.audit_id)).record_json)
            assert record["sample"]["index"] == index and record["sample"]["of"] == 3
            assert [t["id"] for t in record["tokens"]] == list(sequence.token_ids)
            assert sum(t["final_logprob"] for t in record["tokens"]) == pytest.approx(sequence.score, abs=1e-3)
        replay = stub.Replay(audit_pb2.ReplayRequest(audit_id=sequences[2].audit_id), timeout=300)
        assert replay.exact_match, replay.message
    finally:
        channel.close()
    chunks = list(client.stream_generate(**kwargs, timeout_s=300))
    assert "".join(c.text for c in chunks) == response.text and len(chunks[-1].sequences) == 3
