"""A thinking model's section as OpenAI-style bodies ask for it (issue 56), read into ``reasoning`` and
``chat_template_kwargs_json`` (domain/reasoning.py says what they mean).

The spellings clients send, each a 400 naming its key when its value is wrong:

- ``chat_template_kwargs`` (vLLM, SGLang): variables for the chat template. ``enable_thinking`` among them is read
  as ``reasoning.enabled`` (and handed back to the template when it reads it), so a client that always sends it
  is not refused by a model without a thought; any other name the template cannot take is refused later, naming
  ``chat_template_kwargs.<name>``.
- ``thinking_token_budget`` (vLLM): the thought's own tokens at most.
- ``reasoning_effort`` (OpenAI): a name from the documented table (``EFFORT_TOKENS``); ``none`` turns it off.
- ``reasoning`` (OpenRouter's and the Responses API's object): ``effort``, ``max_tokens``, ``exclude``, ``enabled``.

Two keys that bound the thought differently are refused, naming the second.
"""

from __future__ import annotations

import json
from typing import Any

from proctor.domain.reasoning import EFFORT_TOKENS
from proctor.openai_http.draft import Draft
from proctor.openai_http.errors import BodyError
from proctor.openai_http.json_form import INT32

KEYS = frozenset({"chat_template_kwargs", "thinking_token_budget", "reasoning_effort", "reasoning"})
EFFORTS = (*EFFORT_TOKENS, "none")
OBJECT_KEYS = ("effort", "max_tokens", "exclude", "enabled")


def read_reasoning(body: dict[str, Any], draft: Draft, params: dict[str, str]) -> None:
    """Set ``reasoning`` and ``chat_template_kwargs_json`` on ``draft`` from ``body``; ``params`` learns which key
    set ``reasoning.max_tokens`` (a later violation names it)."""
    asked: dict[str, Any] = {}
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise BodyError("chat_template_kwargs must be an object of the chat template's variables",
                            "chat_template_kwargs")
        kwargs = dict(kwargs)
        enable = kwargs.pop("enable_thinking", None)
        if enable is not None:
            _set(asked, "enabled", _boolean(enable, "chat_template_kwargs.enable_thinking"),
                 "chat_template_kwargs.enable_thinking")
        if kwargs:
            draft.values["chat_template_kwargs_json"] = json.dumps(kwargs, sort_keys=True, separators=(",", ":"))
    _reasoning_object(body.get("reasoning"), asked)
    budget = body.get("thinking_token_budget")
    if budget is not None:
        _set(asked, "max_tokens", _tokens(budget, "thinking_token_budget"), "thinking_token_budget")
    effort = body.get("reasoning_effort")
    if effort is not None:
        _set(asked, *_effort(effort, "reasoning_effort"), "reasoning_effort")
    if asked:
        draft.values["reasoning"] = {key: value for key, (value, _) in asked.items()}
        if "max_tokens" in asked:
            params["reasoning.max_tokens"] = asked["max_tokens"][1]


def _reasoning_object(raw: object, asked: dict[str, Any]) -> None:
    """The ``reasoning`` object's keys into ``asked``; within it an explicit ``max_tokens`` stands for ``effort``."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise BodyError("reasoning must be an object: {effort, max_tokens, exclude, enabled}", "reasoning")
    for key in raw:
        if key not in (*OBJECT_KEYS, "summary", "generate_summary"):  # the Responses API's summary: not offered
            raise BodyError(f"reasoning.{key} is not a known key ({', '.join(OBJECT_KEYS)})", f"reasoning.{key}")
    if raw.get("max_tokens") is not None:
        _set(asked, "max_tokens", _tokens(raw["max_tokens"], "reasoning.max_tokens"), "reasoning.max_tokens")
    if raw.get("effort") is not None:
        name, value = _effort(raw["effort"], "reasoning.effort")
        if name == "enabled" or raw.get("max_tokens") is None:
            _set(asked, name, value, "reasoning.effort")
    for key in ("exclude", "enabled"):
        if raw.get(key) is not None:
            _set(asked, key, _boolean(raw[key], f"reasoning.{key}"), f"reasoning.{key}")


def _effort(effort: object, key: str) -> tuple[str, Any]:
    """What an effort name sets: ``("enabled", False)`` for ``none``, else ``("max_tokens", its budget)``."""
    if effort not in EFFORTS:
        raise BodyError(f"{key} must be one of {', '.join(EFFORTS)}", key)
    return ("enabled", False) if effort == "none" else ("max_tokens", EFFORT_TOKENS[str(effort)])


def _set(asked: dict[str, Any], name: str, value: Any, key: str) -> None:
    """``asked[name]`` from ``key``; refused when an earlier key set it to something else."""
    earlier = asked.get(name)
    if earlier is not None and earlier[0] != value:
        raise BodyError(f"{key} and {earlier[1]} say different things about the thought; send one", key)
    asked.setdefault(name, (value, key))


def _boolean(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise BodyError(f"{key} must be a boolean", key)
    return value


def _tokens(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < INT32[1]:
        raise BodyError(f"{key} must be a whole number of tokens, 0 or more", key)
    return value
