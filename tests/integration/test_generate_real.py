"""Generation on the real default model over real gRPC, checked against Hugging Face ``generate``.

Greedy output must equal ``model.generate(do_sample=False)`` token for token (plain prompts, CJK, the chat
template, stop strings, min_new_tokens); seeded sampling must be reproducible; the stream must carry exactly
the unary text and tokens; stop strings must never leak while streaming; logprobs and model info must be sane.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proctor_client import ProctorClient, build_request
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model

ENGLISH = "The capital of France is"
CHINESE = "请介绍一下北京。"
STORY = "Once upon a time, in a small village,"
CHAT = [("user", "What is 2+2?")]
REPLACEMENT = "\ufffd"
SAMPLED = {"temperature": 0.8, "top_p": 0.9}


@pytest.fixture(scope="module")
def dense_client(model_dir: Path) -> Iterator[ProctorClient]:
    """A server on ``--weights dense``: the mode whose arithmetic is the model's own, so greedy output can
    be held to transformers' token for token (the session server runs the default, quantized mode)."""
    from proctor.app import BackgroundServer
    from proctor.config import Settings

    background = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "weights": "dense", "audit": False}))
    try:
        background.start(timeout_s=300)
        with ProctorClient(background.address, timeout_s=120.0) as proctor:
            yield proctor
    finally:
        background.stop()


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> tuple[Any, Any]:
    """The same model directory loaded by plain transformers in fp32 (the reference implementation)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    return model, tokenizer


def reference_ids(reference: tuple[Any, Any], *, prompt: str | None = None,
                  messages: list[tuple[str, str]] | None = None, **generate_kwargs: Any) -> list[int]:
    """The new token ids of greedy ``model.generate`` (EOS included when it stopped there)."""
    import torch

    model, tokenizer = reference
    if messages is not None:
        turns = [{"role": role, "content": content} for role, content in messages]
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        encoded = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    else:
        encoded = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**encoded, do_sample=False, pad_token_id=tokenizer.eos_token_id, **generate_kwargs)
    return out[0, encoded["input_ids"].shape[1]:].tolist()


def decode(reference: tuple[Any, Any], ids: list[int]) -> str:
    return reference[1].decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def mid_text_stop(text: str) -> str:
    """A two-word stop string from the middle of ``text`` (so there is text before it and it spans tokens)."""
    words = [(m.start(), m.group()) for m in re.finditer(r"[A-Za-z]{3,}", text)]
    assert len(words) >= 4, f"greedy output too short to pick a stop string from: {text!r}"
    start, _ = words[len(words) // 2]
    end = words[len(words) // 2 + 1][0] + len(words[len(words) // 2 + 1][1])
    stop = text[start:end]
    assert text.find(stop) > 0
    return stop


# --- greedy == transformers generate --------------------------------------------------------------

@pytest.mark.parametrize(("prompt", "messages"), [(ENGLISH, None), (CHINESE, None), (None, CHAT)],
                         ids=["english", "chinese", "chat"])
def test_greedy_matches_transformers_generate(dense_client: ProctorClient, reference: tuple[Any, Any],
                                              prompt: str | None, messages: list[tuple[str, str]] | None) -> None:
    max_new = 20
    response = dense_client.generate(prompt, messages=messages, temperature=0, max_new_tokens=max_new)
    expected = reference_ids(reference, prompt=prompt, messages=messages, max_new_tokens=max_new)

    assert list(response.token_ids) == expected
    # An incomplete character at the very end (cut by max_new_tokens) is dropped, never shown as U+FFFD.
    assert response.text == decode(reference, expected).rstrip(REPLACEMENT)
    assert REPLACEMENT not in response.text
    assert response.usage.completion_tokens == len(expected)
    if response.finish_reason == pb.FINISH_REASON_EOS:
        assert response.token_ids[-1] == reference[1].eos_token_id
    else:
        assert response.finish_reason == pb.FINISH_REASON_LENGTH
        assert len(expected) == max_new


def test_chat_prompt_counts_the_templated_tokens(client: ProctorClient, reference: tuple[Any, Any]) -> None:
    tokenizer = reference[1]
    text = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in CHAT], tokenize=False,
                                         add_generation_prompt=True)
    response = client.generate(messages=CHAT, temperature=0, max_new_tokens=1)
    assert response.usage.prompt_tokens == len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_greedy_with_stop_string_matches_transformers(dense_client: ProctorClient, reference: tuple[Any, Any]) -> None:
    full = reference_ids(reference, prompt=STORY, max_new_tokens=24)
    full_text = decode(reference, full)
    stop = mid_text_stop(full_text)

    response = dense_client.generate(STORY, temperature=0, max_new_tokens=24, stop=[stop])
    expected = reference_ids(reference, prompt=STORY, max_new_tokens=24, stop_strings=[stop],
                             tokenizer=reference[1])

    assert response.finish_reason == pb.FINISH_REASON_STOP_STRING
    assert list(response.token_ids) == expected
    assert stop not in response.text
    assert response.text == decode(reference, expected).split(stop)[0]
    assert response.text == full_text[: full_text.index(stop)]
    assert stop in response.finish_detail


def test_greedy_with_min_new_tokens_matches_transformers(dense_client: ProctorClient,
                                                         reference: tuple[Any, Any]) -> None:
    # The chat answer ends with EOS after ~12 tokens; min_new_tokens keeps it going.
    plain = dense_client.generate(messages=CHAT, temperature=0, max_new_tokens=20)
    assert plain.finish_reason == pb.FINISH_REASON_EOS, "precondition: the chat answer ends with EOS"
    min_new = len(plain.token_ids) + 3

    response = dense_client.generate(messages=CHAT, temperature=0, max_new_tokens=20, min_new_tokens=min_new)
    expected = reference_ids(reference, messages=CHAT, max_new_tokens=20, min_new_tokens=min_new)

    assert list(response.token_ids) == expected
    assert len(response.token_ids) >= min_new
    eos = reference[1].eos_token_id
    assert eos not in list(response.token_ids)[:min_new - 1]


@pytest.mark.parametrize("penalty", [{"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2}],
                         ids=["repetition_penalty", "no_repeat_ngram_size"])
def test_greedy_with_penalties_matches_transformers(dense_client: ProctorClient, reference: tuple[Any, Any],
                                                    penalty: dict[str, Any]) -> None:
    # penalties.py documents that these two look at prompt + output "so greedy output equals generate()".
    response = dense_client.generate(STORY, temperature=0, max_new_tokens=16, **penalty)
    expected = reference_ids(reference, prompt=STORY, max_new_tokens=16, **penalty)
    assert list(response.token_ids) == expected


# --- seeded sampling --------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible(client: ProctorClient) -> None:
    first = client.generate(STORY, seed=1234, max_new_tokens=12, **SAMPLED)
    second = client.generate(STORY, seed=1234, max_new_tokens=12, **SAMPLED)
    assert list(first.token_ids) == list(second.token_ids)
    assert first.text == second.text
    assert first.seed == second.seed == 1234


def test_different_seeds_differ(client: ProctorClient) -> None:
    outputs = {tuple(client.generate(STORY, seed=seed, max_new_tokens=12, **SAMPLED).token_ids)
               for seed in (1234, 4321, 99)}
    assert len(outputs) > 1, "three seeds gave the same sampled output"


def test_server_picked_seed_is_reported_and_reproduces(client: ProctorClient) -> None:
    first = client.generate(STORY, max_new_tokens=12, **SAMPLED)
    assert first.seed != 0
    again = client.generate(STORY, seed=first.seed, max_new_tokens=12, **SAMPLED)
    assert list(again.token_ids) == list(first.token_ids)
    assert again.text == first.text


# --- streaming ---------------------------------------------------------------------------------------

def _check_stream_against_unary(chunks: list[pb.GenerateChunk], unary: pb.GenerateResponse) -> None:
    assert chunks, "the stream produced no chunk"
    assert "".join(c.text for c in chunks) == unary.text
    assert [t for c in chunks for t in c.token_ids] == list(unary.token_ids)
    last = chunks[-1]
    assert last.finish_reason == unary.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert all(c.finish_reason == pb.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])
    assert last.usage.completion_tokens == len(unary.token_ids) == unary.usage.completion_tokens
    assert last.usage.prompt_tokens == unary.usage.prompt_tokens > 0


@pytest.mark.parametrize("prompt", [STORY, CHINESE], ids=["english", "chinese"])
def test_stream_equals_unary_for_seeded_request(client: ProctorClient, prompt: str) -> None:
    request = build_request(prompt, seed=7, max_new_tokens=16, **SAMPLED)
    unary = client.generate(request)
    chunks = list(client.stream_generate(request))
    _check_stream_against_unary(chunks, unary)
    assert chunks[-1].seed == unary.seed == 7


def test_chinese_stream_never_shows_replacement_characters(client: ProctorClient,
                                                           reference: tuple[Any, Any]) -> None:
    chunks = list(client.stream_generate(CHINESE, temperature=0, max_new_tokens=16))
    ids = [t for c in chunks for t in c.token_ids]
    # A character cut by the token limit is dropped at the end, by design (IncrementalDetokenizer.flush).
    full = decode(reference, ids).rstrip(REPLACEMENT)
    assert REPLACEMENT not in full, "precondition: the greedy Chinese output decodes cleanly"
    assert any(ord(ch) > 0x2E80 for ch in full), f"expected CJK output, got {full!r}"
    for chunk in chunks:
        assert REPLACEMENT not in chunk.text, f"chunk {chunk.text!r} shows a partial UTF-8 character"
    assert "".join(c.text for c in chunks) == full


def test_stop_string_never_leaks_while_streaming(client: ProctorClient) -> None:
    free = client.generate(STORY, temperature=0, max_new_tokens=24)
    stop = mid_text_stop(free.text)
    expected = free.text[: free.text.index(stop)]

    unary = client.generate(STORY, temperature=0, max_new_tokens=24, stop=[stop])
    chunks = list(client.stream_generate(STORY, temperature=0, max_new_tokens=24, stop=[stop]))

    assert unary.text == expected
    assert unary.finish_reason == pb.FINISH_REASON_STOP_STRING
    _check_stream_against_unary(chunks, unary)
    # Every prefix of the stream is a prefix of the final text: nothing shown is ever withdrawn.
    shown = ""
    for chunk in chunks:
        shown += chunk.text
        assert expected.startswith(shown), f"streamed {shown!r}, which the final text {expected!r} withdraws"
        assert stop not in chunk.text


# --- logprobs ----------------------------------------------------------------------------------------

def test_top_logprobs_are_sorted_and_bound_the_chosen_token(client: ProctorClient) -> None:
    response = client.generate(STORY, seed=3, max_new_tokens=8, top_logprobs=3, **SAMPLED)
    assert len(response.tokens) == len(response.token_ids) > 0
    for detail, token_id in zip(response.tokens, response.token_ids, strict=True):
        assert detail.token_id == token_id
        assert len(detail.top_logprobs) == 3
        values = [alt.logprob for alt in detail.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert all(v <= 0.0 for v in values)
        assert detail.logprob <= values[0] + 1e-5
        assert len({alt.token_id for alt in detail.top_logprobs}) == 3


def test_greedy_chosen_token_is_the_best_alternative(client: ProctorClient) -> None:
    response = client.generate(ENGLISH, temperature=0, max_new_tokens=6, top_logprobs=3)
    for detail in response.tokens:
        assert detail.top_logprobs[0].token_id == detail.token_id
        assert detail.logprob == pytest.approx(detail.top_logprobs[0].logprob, abs=1e-5)
        # Plain greedy without penalties: the final distribution is the raw one.
        assert detail.final_logprob == pytest.approx(detail.logprob, abs=1e-4)


def test_token_details_without_top_logprobs(client: ProctorClient) -> None:
    response = client.generate(ENGLISH, temperature=0, max_new_tokens=6, token_details=True)
    assert len(response.tokens) == len(response.token_ids) > 0
    for detail, token_id in zip(response.tokens, response.token_ids, strict=True):
        assert detail.token_id == token_id
        assert len(detail.top_logprobs) == 0
        assert detail.logprob <= 0.0
    plain = client.generate(ENGLISH, temperature=0, max_new_tokens=6)
    assert len(plain.tokens) == 0


# --- model info --------------------------------------------------------------------------------------

def test_model_info_describes_the_default_model(client: ProctorClient) -> None:
    import torch

    info = client.model_info()
    assert re.fullmatch(r"[0-9a-f]{64}", info.weights_sha256)
    assert re.fullmatch(r"[0-9a-f]{64}", info.tokenizer_sha256)
    assert info.vocab_size == 49152
    assert 2 in info.eos_token_ids
    assert info.context_length_tokens == 8192
    cuda = torch.cuda.is_available()
    assert info.device.startswith("cuda") if cuda else info.device == "cpu"
    assert info.dtype == ("bfloat16" if cuda and torch.cuda.is_bf16_supported() else
                          "float16" if cuda else "float32")
    assert info.model_id == "SmolLM2-135M-Instruct"
    assert info.runner.startswith("slot forward: llama, batched"), info.runner  # the default model's fast path
    assert info.max_new_tokens_limit >= info.default_max_new_tokens > 0
    assert info.server_version
