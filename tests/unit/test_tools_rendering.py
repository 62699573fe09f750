"""Tools reach the model through its chat template when the template takes them, else as a system message
(engine/preprocess.py); either way the rendering is a pure function of the request, so a replay renders the same."""

from __future__ import annotations

import json
from typing import Any

from proctor.domain import ChatMessage, GenerationRequest
from proctor.engine.preprocess import render_prompt

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
TOOLS_TEMPLATE = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
                  "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]")


def _request(system: bool) -> GenerationRequest:
    turns = (ChatMessage("system", "Be brief."),) if system else ()
    return GenerationRequest("tools", messages=(*turns, ChatMessage("user", "Weather in Paris?")),
                             tools_json=json.dumps(TOOLS))


def test_a_template_without_tools_gets_them_in_the_system_message(tokenizer: Any) -> None:
    assert "tools" not in tokenizer.chat_template
    text, _ = render_prompt(tokenizer, _request(system=True))
    system = text.split("<|im_start|>user")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\nYou can call these functions.")
    assert '"name": "get_weather"' in system and "<tool_call>" in system
    alone, _ = render_prompt(tokenizer, _request(system=False))
    assert alone.startswith("<|im_start|>system\nYou can call these functions.")  # not the template's default


def test_a_template_that_takes_tools_renders_them_itself(tokenizer: Any) -> None:
    original = tokenizer.chat_template
    tokenizer.chat_template = TOOLS_TEMPLATE
    try:
        text, _ = render_prompt(tokenizer, _request(system=True))
    finally:
        tokenizer.chat_template = original
    assert text == "<tools>get_weather;</tools>[system]Be brief.[user]Weather in Paris?[assistant]"
