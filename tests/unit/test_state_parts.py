"""A request's state in parts, each alone (engine/row_decoding.py, engine/output_processor.py,
engine/row_budget.py): built from a request the engine prepared (the real tokenizer), run without the engine.

What must hold: the row's sampling settings are tensors made once and the step's view switches between them; the
output's text is the detokenizer's, a stop string is cut and held text released at the end, the final event carries
the ending's facts; the budget closes a JSON output with an ending its matcher accepts, and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.engine import Collector, with_constraints

from proctor.decoding.pipeline import RowDecision, run_pipeline
from proctor.decoding.warpers import warp_values
from proctor.domain import (
    ConstraintRequest,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    StoppingParams,
)
from proctor.domain.events import Timings, Usage
from proctor.domain.output_budget import OutputBudget
from proctor.engine.closing import ClosingRule
from proctor.engine.output_processor import Ending, OutputProcessor
from proctor.engine.row_budget import RowBudget
from proctor.engine.row_decoding import RowDecoding


def request(n: int = 8, **fields: Any) -> GenerationRequest:
    stopping = fields.pop("stopping", StoppingParams(max_new_tokens=n, ignore_eos=True))
    return GenerationRequest(request_id="r", prompt="Once upon a time", stopping=stopping, **fields)


def row_of(engine: Any, generation: GenerationRequest) -> RowDecoding:
    loaded = engine.loaded
    return RowDecoding(engine.prepare(generation), eos_token_ids=frozenset(loaded.eos_token_ids),
                       vocab_size=loaded.vocab_size, device=loaded.device, seed=7)


def decision(token_id: int) -> RowDecision:
    return RowDecision(token_id, -0.5, -0.25, ((token_id, -0.5),), allowed_count=-1)


# --- the row's decoding state ------------------------------------------------------------------


def test_a_rows_sampling_settings_are_made_once_and_its_view_switches_between_them(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False)
    sampling = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, seed=7, forced_tokens=((1, 42),))
    row = row_of(engine, request(sampling=sampling))
    made = row.sampling_values
    assert made is not None and torch.equal(made, warp_values(sampling))
    assert row.step_sampling is sampling and row.controlled
    row.append(decision(5))
    row.plan_step()  # position 1 is forced: a greedy step with every other token removed
    assert row.step_sampling.greedy and row.sampling_values is None and row.forced_now == 42
    assert [name for name, _ in row.processors] == ["forced_tokens"]
    [chosen] = run_pipeline(torch.randn(1, engine.loaded.vocab_size), [row])
    assert chosen.token_id == 42
    row.append(chosen)
    row.plan_step()
    assert row.step_sampling is sampling and row.sampling_values is made  # the tensor made at the start, again


def test_a_rows_token_rules_and_budget_end_it(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False)
    row = row_of(engine, request(3, stopping=StoppingParams(max_new_tokens=3, stop_token_ids=(9,))))
    assert row.append(decision(5)) == (None, "")
    assert row.append(decision(9))[0] is FinishReason.STOP_TOKEN
    assert row.generated == [5, 9] and row.last_step  # one token left of three


# --- the output --------------------------------------------------------------------------------


def output_of(engine: Any, generation: GenerationRequest, sink: Collector) -> OutputProcessor:
    return OutputProcessor(engine.prepare(generation), tokenizer=engine.loaded.tokenizer, seed=7, sink=sink)


def ending(reason: FinishReason, generated: int) -> Ending:
    return Ending(reason, "why", Usage(4, generated), Timings(1.0, 2.0, 3.0))


def test_the_output_is_the_detokenizers_text_and_ends_with_the_endings_facts(make_engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False)
    sink = Collector()
    output = output_of(engine, request(token_details=True), sink)
    ids = tokenizer(" The caf\u00e9 opened at nine \u2014 early.", add_special_tokens=False)["input_ids"]
    for index, token in enumerate(ids):
        last = index == len(ids) - 1
        output.follow(token, decision(token), None, ending(FinishReason.LENGTH, len(ids)) if last else None)
    assert sink.text == tokenizer.decode(ids) and output.text == sink.text
    assert [event.token_ids for event in sink.events] == [(token,) for token in ids]
    assert sink.events[0].details[0].token_id == ids[0]
    final = sink.final
    assert final.finish_reason is FinishReason.LENGTH and final.finish_detail == "why" and final.seed == 7
    assert final.usage == Usage(4, len(ids)) and final.timings == Timings(1.0, 2.0, 3.0)


def test_a_stop_string_is_cut_and_held_text_is_released_at_the_end(make_engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(start=False)
    stopping = StoppingParams(max_new_tokens=20, stop=("END",))
    ids = tokenizer(" alpha EN", add_special_tokens=False)["input_ids"]
    sink = Collector()
    output = output_of(engine, request(stopping=stopping), sink)
    released = "".join(output.scan(output.piece(token)).release for token in ids)
    assert released == " alpha "  # "EN" may begin the stop string: held back
    output.close(None, ending(FinishReason.LENGTH, len(ids)))  # no stop string came: the held text goes out
    assert sink.text == "EN" and sink.final.finished
    cut = Collector()
    output = output_of(engine, request(stopping=stopping), cut)
    released, matched = "", None
    for token in tokenizer(" beta ENDING", add_special_tokens=False)["input_ids"]:
        scan = output.scan(output.piece(token))
        released, matched = released + scan.release, scan.matched
        if matched:
            break
    assert released == " beta " and matched == "END"
    output.close(None, ending(FinishReason.CANCELLED, 0))  # a cancelled output releases nothing held
    assert cut.text == ""


# --- the budget --------------------------------------------------------------------------------


def test_a_budget_without_a_rule_only_counts(make_engine) -> None:  # type: ignore[no-untyped-def]
    budget = RowBudget(OutputBudget(5, 1))
    assert budget.opening() == () and budget.closing_draft(0, 4) == [] and budget.forced(3) == 0
    assert budget.after("x", 5, FinishReason.LENGTH, "d") == (FinishReason.LENGTH, "d", ())
    with pytest.raises(ValueError, match="matcher"):
        RowBudget(OutputBudget(5), rule=object())  # type: ignore[arg-type]


def test_a_tight_budget_closes_the_json_with_an_ending_its_matcher_accepts(make_engine, tiny_loaded,  # type: ignore[no-untyped-def]
                                                                          default_model_dir: Path) -> None:
    engine = with_constraints(make_engine(start=False), tiny_loaded, default_model_dir)
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    constraint = ConstraintRequest("json_schema", text=json.dumps(schema))
    facts = engine.prepare(request(512, constraint=constraint,
                                   stopping=StoppingParams(max_new_tokens=512, close_at_budget=True))).closing
    assert facts is not None
    prepared = engine.prepare(request(constraint=constraint, stopping=StoppingParams(
        max_new_tokens=facts.minimum, close_at_budget=True)))
    assert prepared.constraint is not None and prepared.closing is not None
    matcher = prepared.constraint.compiled.new_matcher()
    tokenizer = engine.loaded.tokenizer
    rule = ClosingRule(prepared.closing, matcher, tokenizer, tiny_loaded.vocab_size)
    budget = RowBudget(prepared.output_budget, rule, matcher)
    ending_ids = budget.opening()  # too tight for a free token: the shortest output from the first one
    assert ending_ids and len(ending_ids) <= facts.minimum
    assert budget.closing_draft(0, 100) == list(ending_ids[:-1]) and budget.closing_draft(1, 2) == list(ending_ids[1:3])
    verdicts = []
    for index, token in enumerate(ending_ids):
        assert matcher.advance(token)
        reason = FinishReason.LENGTH if index + 1 == prepared.output_budget.max_new_tokens else None
        verdicts.append(budget.after(tokenizer.decode([token]), index + 1, reason, ""))
    assert all(verdict == (None, "", ()) for verdict in verdicts[:-1])
    assert verdicts[-1][0] is FinishReason.CLOSED_AT_BUDGET and "closed at the budget" in verdicts[-1][1]
    assert json.loads(tokenizer.decode(list(ending_ids)))["name"] is not None
    assert budget.forced(len(ending_ids)) == len(ending_ids)
