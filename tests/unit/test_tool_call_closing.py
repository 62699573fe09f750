"""Tool calls valid within the budget (issue 56): the JSON of each call in ``<tool_call>`` blocks is closed by the
budget rule as a JSON-schema output is, and a call the same as an earlier one ends the answer.

The grammar is the HTTP door's (openai_http/tools.py builds it with constraints/tool_calls.py); the engine is the
tiny random-weight model with the real tokenizer, which rambles inside strings until the token limit, so every
answer here reaches its budget: each must come back as complete calls that validate, never a cut one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers.engine import Collector, with_constraints

from proctor.constraints.json_schema.growth import growth_texts
from proctor.constraints.tool_calls import ToolCallsRule, tool_calls_framing, tool_calls_grammar
from proctor.domain import ConstraintRequest, FinishReason, GenerationRequest, SamplingParams, StoppingParams
from proctor.openai_http.answers import choice_finish
from proctor.openai_http.tools import ToolPlan, parse_output, tool_plan

RESULT = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["city", "population", "tags"]}  # pydantic-ai's final_result: nothing bounds the values
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ONE_WAY = {"type": "object", "properties": {"x": {"enum": ["a"]}}, "required": ["x"]}  # every call is the same


def plan(choice: Any = "required", parallel: bool = True, **parameters: dict[str, Any]) -> ToolPlan:
    tools = [{"type": "function", "function": {"name": name, "parameters": schema}}
             for name, schema in (parameters or {"final_result": RESULT}).items()]
    found = tool_plan({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel})
    assert found is not None
    return found


def grammar(tools: ToolPlan) -> str:
    return tool_calls_grammar(tools.call_schema(), auto=tools.mode == "auto", parallel=tools.parallel)


def test_the_rule_comes_with_the_grammar_the_door_writes_and_no_other() -> None:
    for auto in (False, True):
        for parallel in (False, True):
            framing = tool_calls_framing(tool_calls_grammar(plan().call_schema(), auto=auto, parallel=parallel))
            assert framing is not None and (framing.auto, framing.parallel) == (auto, parallel)
            assert framing.schema == plan().call_schema()  # llguidance's options are not part of the schema
    # the form written before issue 56 (recorded without a rule: its replays must take the decisions they took)
    old = 'start: "<tool_call>" call "</tool_call>"\nTEXT: /[^<](?s:.)*/\ncall: %json {"type": "object"}\n'
    assert tool_calls_framing(old) is None
    assert tool_calls_framing(grammar(plan()) + "extra: \"x\"\n") is None  # anything added: another grammar
    assert tool_calls_framing('start: "a"\n') is None


def test_the_reader_knows_the_framing_and_the_call_json() -> None:
    rule = ToolCallsRule.of(tool_calls_framing(grammar(plan(final_result=WEATHER))))  # type: ignore[arg-type]
    reader = rule.reader()
    block = '<tool_call>{"name":"final_result","arguments":{"city":""}}</tool_call>'
    assert reader.endings() == [block]  # the shortest valid output: one call
    reader.push("<tool_")
    assert reader.endings() == [block[len("<tool_"):]]
    reader.push('call>{"name":"final_result","arguments":{"city":"Par')
    assert reader.endings() == ['"}}</tool_call>']
    reader.push('is"}}</tool')
    assert reader.endings() == ["_call>"] and not reader.done
    reader.push("_call>")
    assert reader.endings() == [""] and not reader.done  # parallel: another block may follow
    assert max(reader.growth_texts(), key=len) == "\n" + block  # from here one token can begin a whole block
    reader.push("\n")
    assert reader.endings() == [block]  # after the newline a block is owed
    reader.push('<tool_call>{"name":"final_result","arguments":{"city":"Paris"}}</tool_call>')
    assert "repeats an earlier one" in reader.repeated


def test_in_auto_mode_text_may_end_anywhere_and_one_block_is_all() -> None:
    framing = tool_calls_framing(grammar(plan("auto", parallel=False, f=WEATHER)))
    assert framing is not None
    text, call = ToolCallsRule.of(framing).reader(), ToolCallsRule.of(framing).reader()
    assert text.endings() == []  # text or a call: the model's choice, nothing is owed yet
    text.push("Hello")
    assert text.done
    call.push('<tool_call>{"name":"f","arguments":{"city":"x"}}</tool_call>')
    assert call.done and call.endings() == [""]


def test_the_margin_inside_a_call_is_the_call_schemas_own_where_it_stands() -> None:
    """Inside a call's string one token can begin a member of the arguments not yet written, not another block."""
    framing = tool_calls_framing(grammar(plan()))
    assert framing is not None
    rule = ToolCallsRule.of(framing)
    reader = rule.reader()
    reader.push('<tool_call>{"name":"final_result","arguments":{"city":"Par')
    here = reader.growth_texts()
    assert '"tags":[]' in here and not any(text.startswith('"city"') for text in here)
    assert set(here) <= set(rule.growth_texts()) and set(growth_texts(framing.schema)) <= set(rule.growth_texts())
    assert max(map(len, here)) < max(map(len, rule.growth_texts()))  # tighter than the bound


@pytest.fixture
def engine(make_engine, tiny_loaded, default_model_dir: Path):  # type: ignore[no-untyped-def]
    return with_constraints(make_engine(start=False), tiny_loaded, default_model_dir)


def request(tools: ToolPlan, budget: int, *, seed: int = 1, close: bool = True,
            bias: tuple[tuple[int, float], ...] = ()) -> GenerationRequest:
    return GenerationRequest(
        f"r{seed}-{budget}", prompt="Call the tool:", sampling=SamplingParams(temperature=1.0, seed=seed),
        stopping=StoppingParams(max_new_tokens=budget, close_at_budget=close), logit_bias=bias,
        constraint=ConstraintRequest("grammar", text=grammar(tools)))


def run(engine, generation: GenerationRequest) -> tuple[Any, str]:  # type: ignore[no-untyped-def]
    sink = Collector()
    engine.submit(engine.prepare(generation), sink)
    sink.wait(120)
    return sink.final, sink.text


def assert_valid_calls(text: str, tools: ToolPlan, schema: dict[str, Any]) -> list[dict[str, Any]]:
    content, calls = parse_output(text, tools)
    assert content is None and calls, text
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    return calls


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_at_every_budget_from_the_minimum_up_the_calls_are_complete_and_valid(engine, tokenizer,  # type: ignore[no-untyped-def]
                                                                             choice: str) -> None:
    tools = plan(choice)
    facts = engine.prepare(request(tools, 512)).closing
    assert facts is not None and facts.rule.framing.auto == (choice == "auto")
    (open_tag,) = tokenizer.encode("<", add_special_tokens=False)
    bias = ((open_tag, 100.0),) if choice == "auto" else ()  # auto: the random model would write text
    low = facts.minimum or len(tokenizer.encode(facts.rule.blocks()[0], add_special_tokens=False))
    closed = 0
    for budget in sorted({low, low + 3, 2 * low + 5, 120}):
        for seed in (1, 2):
            final, text = run(engine, request(tools, budget, seed=seed, bias=bias))
            assert final.finish_reason is not FinishReason.LENGTH, (budget, seed, text)
            assert final.usage.completion_tokens <= budget
            assert_valid_calls(text, tools, RESULT)
            assert choice_finish(final.finish_reason, True) == "tool_calls"  # what the HTTP door answers
            closed += final.finish_reason is FinishReason.CLOSED_AT_BUDGET
    assert closed, "the rule closed some of them (a random model ends no call by itself)"


def test_without_the_rule_the_same_calls_are_cut(engine) -> None:  # type: ignore[no-untyped-def]
    tools = plan()
    final, text = run(engine, request(tools, 60, close=False))
    assert final.finish_reason is FinishReason.LENGTH and not text.endswith("</tool_call>")
    closed, closed_text = run(engine, request(tools, 60))
    assert closed.finish_reason is FinishReason.CLOSED_AT_BUDGET and closed_text.endswith("</tool_call>")
    assert closed.usage.closing_tokens > 0 and "closed at the budget" in closed.finish_detail


def test_a_repeated_identical_call_ends_the_answer(engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    tools = plan(f=ONE_WAY)
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    looping = request(tools, 200, bias=((newline, 100.0),))  # after each block: another, never the end
    final, text = run(engine, looping)
    assert final.finish_reason is FinishReason.CLOSED_AT_BUDGET, final.finish_detail
    assert "repeats an earlier one" in final.finish_detail and final.usage.closing_tokens == 0
    assert text.count("<tool_call>") == 2 and text.endswith("</tool_call>")  # the first again, then the end
    assert len(assert_valid_calls(text, tools, ONE_WAY)) == 1  # the repeat is not a second call
    plain, plain_text = run(engine, dataclasses.replace(looping, stopping=dataclasses.replace(
        looping.stopping, close_at_budget=False)))
    assert plain.finish_reason is FinishReason.LENGTH and plain_text.count("<tool_call>") > 2


def test_a_closed_call_replays_exactly_from_its_record(engine) -> None:  # type: ignore[no-untyped-def]
    """The rule follows from the recorded request alone (the grammar's text): the record's request, rebuilt as a
    replay rebuilds it, gets the rule and gives the same tokens."""
    from proctor.audit.records import request_from_dict, request_to_dict

    first = request(plan(), 60, seed=4)
    rebuilt = request_from_dict(json.loads(json.dumps(request_to_dict(first, 4))), "replay")
    assert engine.prepare(rebuilt).closing is not None
    sinks = [Collector(), Collector()]
    for generation, sink in zip((first, rebuilt), sinks, strict=True):
        engine.submit(engine.prepare(generation), sink)
    original, replay = (sink.wait(120) for sink in sinks)
    assert original[-1].finish_reason is FinishReason.CLOSED_AT_BUDGET
    assert [t for e in replay for t in e.token_ids] == [t for e in original for t in e.token_ids]
