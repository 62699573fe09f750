"""build_request: explicit presence of optional fields, input exclusivity, message shapes."""

from __future__ import annotations

import pickle

import grpc
import pytest

from proctor_client import ProctorError, build_request
from proctor_client._common import RetryPolicy, coerce_request
from proctor_client.v1 import generation_pb2


def test_zero_temperature_is_present_and_none_is_absent() -> None:
    greedy = build_request("hi", temperature=0.0, top_k=0, seed=0, max_new_tokens=0, top_logprobs=0)
    assert greedy.sampling.HasField("temperature")
    assert greedy.sampling.temperature == 0.0
    assert greedy.sampling.HasField("top_k")
    assert greedy.sampling.HasField("seed")
    assert greedy.stopping.HasField("max_new_tokens")
    assert greedy.HasField("top_logprobs")

    default = build_request("hi")
    assert not default.sampling.HasField("temperature")
    assert not default.sampling.HasField("top_p")
    assert not default.sampling.HasField("seed")
    assert not default.stopping.HasField("max_new_tokens")
    assert not default.stopping.HasField("min_new_tokens")
    assert not default.HasField("top_logprobs")
    assert not default.HasField("sampling")  # nothing set, so the sub-message is not sent at all


def test_every_option_lands_in_its_field() -> None:
    request = build_request(
        "hi",
        request_id="r1",
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        no_repeat_ngram_size=3,
        seed=7,
        max_new_tokens=32,
        min_new_tokens=2,
        stop=["\n\n", "END"],
        stop_token_ids=[2, 3],
        ignore_eos=True,
        top_logprobs=5,
        token_details=True,
    )
    assert request.request_id == "r1"
    assert request.WhichOneof("input") == "prompt"
    assert request.sampling.top_k == 40
    assert request.sampling.top_p == pytest.approx(0.9)
    assert request.sampling.no_repeat_ngram_size == 3
    assert request.sampling.seed == 7
    assert request.stopping.max_new_tokens == 32
    assert request.stopping.min_new_tokens == 2
    assert list(request.stopping.stop) == ["\n\n", "END"]
    assert list(request.stopping.stop_token_ids) == [2, 3]
    assert request.stopping.ignore_eos
    assert request.top_logprobs == 5
    assert request.token_details


def test_a_bare_stop_string_is_one_stop() -> None:
    assert list(build_request("hi", stop="\n").stopping.stop) == ["\n"]


def test_empty_prompt_is_still_a_prompt() -> None:
    assert build_request("").WhichOneof("input") == "prompt"


@pytest.mark.parametrize("kwargs", [{}, {"prompt": "hi", "messages": [("user", "hi")]}])
def test_exactly_one_input(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        build_request(**kwargs)


def test_messages_from_tuples_dicts_and_protos() -> None:
    request = build_request(
        messages=[
            ("system", "be brief"),
            {"role": "user", "content": "hi"},
            generation_pb2.ChatMessage(role="assistant", content="hello"),
        ]
    )
    assert request.WhichOneof("input") == "messages"
    assert [(m.role, m.content) for m in request.messages.messages] == [
        ("system", "be brief"),
        ("user", "hi"),
        ("assistant", "hello"),
    ]


@pytest.mark.parametrize(
    "messages",
    [[], "user: hi", [{"role": "user"}], [("user",)], [("user", 3)], [["user", "hi"]]],
)
def test_malformed_messages_are_rejected(messages: object) -> None:
    with pytest.raises(ValueError):
        build_request(messages=messages)  # type: ignore[arg-type]


def test_prebuilt_request_takes_no_kwargs() -> None:
    request = build_request("hi")
    assert coerce_request(request, {}) is request
    with pytest.raises(TypeError):
        coerce_request(request, {"temperature": 0.0})
    assert coerce_request("hi", {"seed": 1}).sampling.seed == 1


def test_retry_policy_only_retries_unavailable_within_budget() -> None:
    policy = RetryPolicy(retries=2, backoff_s=0.1)
    first = policy.delay(grpc.StatusCode.UNAVAILABLE, 0, None)
    assert first is not None and 0.05 <= first <= 0.1
    second = policy.delay(grpc.StatusCode.UNAVAILABLE, 1, None)
    assert second is not None and 0.1 <= second <= 0.2
    assert policy.delay(grpc.StatusCode.UNAVAILABLE, 2, None) is None  # retries used up
    assert policy.delay(grpc.StatusCode.INVALID_ARGUMENT, 0, None) is None
    assert policy.delay(grpc.StatusCode.DEADLINE_EXCEEDED, 0, None) is None
    assert policy.delay(grpc.StatusCode.UNAVAILABLE, 0, 0.01) is None  # would outlive the deadline
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


def test_proctor_error_renders_and_pickles() -> None:
    error = ProctorError(grpc.StatusCode.INVALID_ARGUMENT, "bad", [("sampling.top_p", "must be in (0, 1]")])
    assert str(error) == "INVALID_ARGUMENT: bad (sampling.top_p: must be in (0, 1])"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.message, copy.field_violations) == (error.code, error.message, error.field_violations)


def test_forbidden_biases_and_plugins() -> None:
    request = build_request("Hi", forbidden="apple", forbidden_whole_word=True, logit_bias={7: -100},
                            allowed_token_ids=[1, 2], repetition=(4, 3),
                            logits_processors=["plain", ("phrase_bias", {"phrases": ["a"], "bias": 2})],
                            stopping_criteria=[("json_value_complete", {"path": "$.a"})])
    assert list(request.forbidden.phrases) == ["apple"]  # a bare string is one phrase
    assert request.forbidden.whole_word and not request.forbidden.HasField("case_insensitive")
    assert dict(request.logit_bias) == {7: -100.0}
    assert list(request.allowed_token_ids) == [1, 2]
    assert (request.stopping.repetition.ngram_size, request.stopping.repetition.repeats) == (4, 3)
    assert [p.name for p in request.logits_processors] == ["plain", "phrase_bias"]
    assert not request.logits_processors[0].HasField("params")
    assert dict(request.logits_processors[1].params)["bias"] == 2
    assert request.stopping_criteria[0].params["path"] == "$.a"
