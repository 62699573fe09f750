"""How OpenAI-style bodies ask for a thought (openai_http/reasoning.py): each spelling into one ``reasoning``, and
two keys that bound the thought differently refused, naming the second."""

from __future__ import annotations

from typing import Any

import pytest

from proctor.openai_http.draft import Draft
from proctor.openai_http.errors import BodyError
from proctor.openai_http.reasoning import read_reasoning


def read(body: dict[str, Any]) -> tuple[Draft, dict[str, str]]:
    draft, params = Draft(), {}
    read_reasoning(body, draft, params)
    return draft, params


@pytest.mark.parametrize(("body", "reasoning", "param"), [
    ({"thinking_token_budget": 16}, {"max_tokens": 16}, "thinking_token_budget"),
    ({"reasoning_effort": "low"}, {"max_tokens": 512}, "reasoning_effort"),
    ({"reasoning_effort": "none"}, {"enabled": False}, None),
    ({"reasoning": {"effort": "high", "max_tokens": 5, "exclude": True}}, {"max_tokens": 5, "exclude": True},
     "reasoning.max_tokens"),  # within the object, an explicit budget stands for the effort
    ({"chat_template_kwargs": {"enable_thinking": False}}, {"enabled": False}, None),
    ({"thinking_token_budget": 512, "reasoning_effort": "low"}, {"max_tokens": 512}, "thinking_token_budget"),
])
def test_each_spelling_sets_the_request_s_reasoning(body: dict[str, Any], reasoning: dict[str, Any],
                                                    param: str | None) -> None:
    draft, params = read(body)
    assert draft.values["reasoning"] == reasoning
    assert params.get("reasoning.max_tokens") == param
    assert "chat_template_kwargs_json" not in draft.values  # enable_thinking is read, not passed through


def test_other_template_kwargs_pass_through_as_json() -> None:
    draft, _ = read({"chat_template_kwargs": {"enable_thinking": True, "tone": "brisk"}})
    assert draft.values["chat_template_kwargs_json"] == '{"tone":"brisk"}'
    assert draft.values["reasoning"] == {"enabled": True}


@pytest.mark.parametrize(("body", "param"), [
    ({"thinking_token_budget": 16, "reasoning_effort": "low"}, "reasoning_effort"),
    ({"reasoning": {"max_tokens": 8}, "thinking_token_budget": 9}, "thinking_token_budget"),
    ({"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"}, "reasoning_effort"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": {"budget": 3}}, "reasoning.budget"),
    ({"thinking_token_budget": -1}, "thinking_token_budget"),
    ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
])
def test_bad_or_contradicting_keys_are_refused_naming_one(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BodyError) as refused:
        read(body)
    assert refused.value.param == param
