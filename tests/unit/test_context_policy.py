"""context_overflow: refuse (today's rule), drop the oldest chat turns, or keep the start and the end."""

from __future__ import annotations

import pytest

from proctor.api.check_request import check_request
from proctor.audit.records import request_from_dict, request_to_dict
from proctor.config import Settings
from proctor.domain import RequestValidationError
from proctor.domain.output_budget import OutputLimits
from proctor.engine.preprocess import prepare_request
from proctor_client import build_request

SYSTEM = "You are a careful assistant."
TURNS = [("user", f"Question {n}: " + "words " * 30) if n % 2 == 0 else ("assistant", f"Answer {n}: " + "more " * 30)
         for n in range(10)] + [("user", "Last question: what is two plus two?")]


def prepare(tokenizer, context: int, max_new: int, **kwargs):  # type: ignore[no-untyped-def]
    message = build_request(max_new_tokens=max_new, **kwargs)
    request = check_request(message, Settings(), time_remaining_s=None)
    return prepare_request(tokenizer, request, context_length=context, limits=OutputLimits(64, 4096))


def chat() -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}] + [{"role": r, "content": c} for r, c in TURNS]


def test_refuse_keeps_todays_rule(tokenizer) -> None:  # type: ignore[no-untyped-def]
    whole = prepare(tokenizer, 100_000, 16, messages=chat())
    n = len(whole.prompt_ids)
    capped = prepare(tokenizer, n + 10, 64, messages=chat())
    assert capped.prompt_ids == whole.prompt_ids and capped.truncation is None
    assert capped.output_budget.max_new_tokens == 10
    with pytest.raises(RequestValidationError) as error:
        prepare(tokenizer, n, 64, messages=chat())
    assert error.value.violations[0].field == "messages"


def test_drop_oldest_turns_keeps_the_system_and_last_message_and_drops_as_few_as_possible(tokenizer) -> None:  # type: ignore[no-untyped-def]
    whole = prepare(tokenizer, 100_000, 16, messages=chat())
    context = len(whole.prompt_ids) + 40  # room for 40 new tokens without dropping anything
    prepared = prepare(tokenizer, context, 150, messages=chat(), context_overflow="drop_oldest_turns")
    truncation = prepared.truncation
    assert truncation is not None and truncation.policy == "drop_oldest_turns"
    assert len(prepared.prompt_ids) + 150 <= context
    assert prepared.output_budget.max_new_tokens == 150  # the output keeps its budget
    assert SYSTEM in prepared.rendered_prompt and "Last question" in prepared.rendered_prompt
    assert "Question 0:" not in prepared.rendered_prompt
    dropped = truncation.dropped_messages
    assert truncation.original_prompt_tokens == len(whole.prompt_ids) and truncation.prompt_tokens == len(
        prepared.prompt_ids)
    fewer = [{"role": "system", "content": SYSTEM}] + [{"role": r, "content": c} for r, c in TURNS[dropped - 1:]]
    one_less = prepare(tokenizer, 100_000, 16, messages=fewer)
    assert len(one_less.prompt_ids) + 150 > context  # dropping one message fewer would not have fitted


def test_drop_oldest_turns_refuses_what_cannot_fit_and_a_plain_prompt(tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RequestValidationError) as error:
        prepare(tokenizer, 40, 30, messages=chat(), context_overflow="drop_oldest_turns")
    assert error.value.violations[0].field == "messages"
    with pytest.raises(RequestValidationError) as error:
        prepare(tokenizer, 20, 15, prompt="word " * 50, context_overflow="drop_oldest_turns")
    assert error.value.violations[0].field == "context_overflow"


def test_keep_start_and_end_cuts_the_middle(tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = "BEGIN " + " ".join(f"w{n}" for n in range(400)) + " END"
    whole = prepare(tokenizer, 100_000, 16, prompt=prompt)
    prepared = prepare(tokenizer, 200, 50, prompt=prompt, context_overflow="keep_start_and_end")
    ids = list(prepared.prompt_ids)
    assert len(ids) == 150 and prepared.output_budget.max_new_tokens == 50
    assert ids[:75] == list(whole.prompt_ids[:75]) and ids[75:] == list(whole.prompt_ids[-75:])
    assert prepared.rendered_prompt.startswith("BEGIN") and prepared.rendered_prompt.endswith("END")
    assert prepared.truncation is not None and prepared.truncation.dropped_tokens == len(whole.prompt_ids) - 150
    fits = prepare(tokenizer, 100_000, 50, prompt=prompt, context_overflow="keep_start_and_end")
    assert fits.truncation is None and fits.prompt_ids == whole.prompt_ids


def test_the_policy_is_converted_checked_and_kept_for_replay() -> None:
    message = build_request(prompt="x", context_overflow="keep_start_and_end")
    request = check_request(message, Settings(), time_remaining_s=None)
    assert request.context_overflow == "keep_start_and_end"
    assert request_from_dict(request_to_dict(request, 1), "r").context_overflow == "keep_start_and_end"
    assert check_request(build_request(prompt="x"), Settings(), time_remaining_s=None).context_overflow == "refuse"
    message = build_request(prompt="x")
    message.context_overflow = 99  # type: ignore[assignment]
    with pytest.raises(RequestValidationError) as error:
        check_request(message, Settings(), time_remaining_s=None)
    assert error.value.violations[0].field == "context_overflow"
    with pytest.raises(ValueError, match="context_overflow"):
        build_request(prompt="x", context_overflow="truncate")  # type: ignore[arg-type]
