"""Valid within the budget (issue 45): a JSON-schema output running short of tokens is ended with its shortest valid
ending, in the engine (tiny random-weight model, real tokenizer, llguidance in-process).

A random-weight model rambles inside strings and arrays until the token limit, so every request here reaches its
budget: each output must come back valid (``CLOSED_AT_BUDGET``, or ended by itself), never cut off invalid.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers.engine import Collector, with_constraints

from proctor.constraints.json_schema.validation import validate_json_output
from proctor.domain import (
    ConstraintRequest,
    FinishReason,
    GenerationRequest,
    RepetitionParams,
    RequestValidationError,
    SamplingParams,
    StoppingParams,
)

SCHEMAS: dict[str, dict] = {
    "string": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "min_items": {"type": "object", "required": ["tags"], "properties": {
        "tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 3}}},
    "nested": {"type": "object", "required": ["party", "terms"], "properties": {
        "party": {"type": "object", "required": ["name", "address"], "properties": {
            "name": {"type": "string"}, "address": {"type": "object", "required": ["city"],
                                                    "properties": {"city": {"type": "string", "minLength": 1}}}}},
        "terms": {"type": "array", "items": {"type": "string"}}}},
    "enum": {"type": "object", "properties": {"note": {"type": "string"},
                                              "status": {"enum": ["active", "inactive", "pending"]}},
             "required": ["note", "status"]},
    "ref": {"$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 10},
                                                                "label": {"type": "string"}},
                               "required": ["id", "label"]}},
            "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
                                             "owner": {"$ref": "#/$defs/item"}}, "required": ["items", "owner"]},
    "pattern": {"type": "object", "properties": {"text": {"type": "string"},
                                                 "code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                "required": ["text", "code"]},
}


@pytest.fixture
def engine(make_engine, tiny_loaded, default_model_dir: Path):  # type: ignore[no-untyped-def]
    return with_constraints(make_engine(start=False), tiny_loaded, default_model_dir)


def request(schema: dict, budget: int, *, seed: int = 3, close: bool = True, flexible: bool = False,
            repetition: RepetitionParams | None = None, request_id: str = "r") -> GenerationRequest:
    return GenerationRequest(
        request_id, prompt="Fill in the record as JSON:", sampling=SamplingParams(temperature=1.0, seed=seed),
        stopping=StoppingParams(max_new_tokens=budget, close_at_budget=close, repetition=repetition),
        constraint=ConstraintRequest("json_schema", text=json.dumps(schema), flexible_whitespace=flexible))


def run(engine, generation: GenerationRequest):  # type: ignore[no-untyped-def]
    sink = Collector()
    engine.submit(engine.prepare(generation), sink)
    return sink.wait(120)


def minimum_of(engine, schema: dict) -> int:  # type: ignore[no-untyped-def]
    prepared = engine.prepare(request(schema, 512))
    assert prepared.closing is not None
    return prepared.closing.minimum


def roomy(engine, schema: dict, extra: int) -> int:  # type: ignore[no-untyped-def]
    """A budget with ``extra`` free tokens before the rule can close (below it, the shortest output is forced
    from the first token)."""
    facts = engine.prepare(request(schema, 512)).closing
    return facts.minimum + facts.margin + extra


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_at_every_budget_from_the_minimum_up_the_output_is_valid(engine, name: str) -> None:  # type: ignore[no-untyped-def]
    schema = SCHEMAS[name]
    minimum = minimum_of(engine, schema)
    assert minimum > 0, "the schema's shortest valid output is known"
    closed = 0
    for budget in sorted({minimum, minimum + 1, minimum + 4, 2 * minimum + 3, 64}):
        for seed in (1, 2):
            events = run(engine, request(schema, budget, seed=seed))
            final = events[-1]
            text = "".join(event.text for event in events)
            assert final.finish_reason is not FinishReason.LENGTH, (budget, seed, text)
            assert validate_json_output(text, schema, truncated=False).valid, (budget, seed, text)
            assert final.schema_check is not None and final.schema_check.valid
            assert final.usage is not None and final.usage.completion_tokens <= budget
            if final.finish_reason is FinishReason.CLOSED_AT_BUDGET:
                closed += 1
                assert 0 < final.usage.closing_tokens <= final.usage.completion_tokens
                assert "closed at the budget" in final.finish_detail
    assert closed, "the budget rule closed some of them (a random model never ends a JSON by itself)"


def test_below_the_shortest_valid_output_the_request_is_refused_naming_the_field_and_the_minimum(engine) -> None:  # type: ignore[no-untyped-def]
    schema = SCHEMAS["nested"]
    minimum = minimum_of(engine, schema)
    with pytest.raises(RequestValidationError) as raised:
        engine.prepare(request(schema, minimum - 1))
    (violation,) = raised.value.violations
    assert violation.field == "stopping.max_new_tokens"
    assert f"at least {minimum}" in violation.description and '{"party":{"name":"","address"' in violation.description
    engine.prepare(request(schema, minimum))  # the minimum itself is served
    engine.prepare(request(schema, minimum - 1, close=False))  # and without the rule nothing is refused


def test_the_rule_comes_with_a_constraint_that_has_an_output_rule_only(engine) -> None:  # type: ignore[no-untyped-def]
    """The engine asks the prepared constraint for its output rule (constraints/output_rule.py): a JSON schema has
    one, and its facts are read through it; a regex has none and runs without the rule, never refused for it."""
    prepared = engine.prepare(request(SCHEMAS["enum"], 512))
    assert prepared.constraint.output_rule is not None and prepared.closing.rule is prepared.constraint.output_rule
    regex = dataclasses.replace(request(SCHEMAS["enum"], 1), constraint=ConstraintRequest("regex", text="[a-z]{40}"))
    unruled = engine.prepare(regex)
    assert unruled.constraint.output_rule is None and unruled.closing is None


def test_without_the_rule_the_same_requests_are_cut_off_invalid(engine) -> None:  # type: ignore[no-untyped-def]
    """What the rule changes: the same seeds at the same budgets end at the token limit with broken JSON."""
    schema = SCHEMAS["nested"]
    budget = roomy(engine, schema, 4)
    for seed in (1, 2):
        events = run(engine, request(schema, budget, seed=seed, close=False))
        assert events[-1].finish_reason is FinishReason.LENGTH
        assert events[-1].schema_check is not None and not events[-1].schema_check.valid
        closed = run(engine, request(schema, budget, seed=seed))
        assert closed[-1].finish_reason is FinishReason.CLOSED_AT_BUDGET
        # the free tokens before the closing are the unconstrained run's own: the rule only ends it
        free = closed[-1].usage.completion_tokens - closed[-1].usage.closing_tokens
        assert [t for e in closed for t in e.token_ids][:free] == [t for e in events for t in e.token_ids][:free]


def test_a_closed_output_is_reproduced_exactly_from_its_request_and_seed(engine) -> None:  # type: ignore[no-untyped-def]
    schema = SCHEMAS["ref"]
    budget = roomy(engine, schema, 6)
    first = run(engine, request(schema, budget, seed=5))
    again = run(engine, request(schema, budget, seed=5, request_id="again"))
    assert first[-1].finish_reason is FinishReason.CLOSED_AT_BUDGET
    assert [t for e in again for t in e.token_ids] == [t for e in first for t in e.token_ids]
    assert [d.logprob for e in again for d in e.details] == [d.logprob for e in first for d in e.details]
    assert again[-1].usage.closing_tokens == first[-1].usage.closing_tokens


def test_the_ending_is_verified_several_tokens_to_a_forward(engine) -> None:  # type: ignore[no-untyped-def]
    schema = SCHEMAS["nested"]
    final = run(engine, request(schema, roomy(engine, schema, 6), seed=1))[-1]
    assert final.finish_reason is FinishReason.CLOSED_AT_BUDGET and final.usage.closing_tokens > 3
    assert final.usage.accepted_tokens >= final.usage.closing_tokens - 1  # drafted and kept whole
    assert final.usage.decode_steps < final.usage.completion_tokens


def test_a_looping_output_is_closed_instead_of_ended_invalid(engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array", "minItems": 1,
                                                                                     "items": {"type": "string"}}},
              "required": ["text", "tags"], "additionalProperties": False}
    (a,) = tokenizer.encode("a", add_special_tokens=False)
    looping = dataclasses.replace(request(schema, 200, seed=1, repetition=RepetitionParams(ngram_size=1, repeats=8)),
                                  logit_bias=((a, 100.0),))  # "aaaa…" inside the first string
    events = run(engine, looping)
    final, text = events[-1], "".join(event.text for event in events)
    assert final.finish_reason is FinishReason.CLOSED_AT_BUDGET, final.finish_detail
    assert "the output looped" in final.finish_detail
    assert text.startswith('{"text":"') and text.endswith('aaaaaaaa","tags":[""]}'), text  # 8 times, then closed
    assert final.schema_check is not None and final.schema_check.valid
    plain = run(engine, dataclasses.replace(looping, stopping=dataclasses.replace(looping.stopping,
                                                                                   close_at_budget=False)))[-1]
    assert plain.finish_reason is FinishReason.REPETITION and not plain.schema_check.valid


def test_flexible_whitespace_outputs_close_too(engine) -> None:  # type: ignore[no-untyped-def]
    schema = SCHEMAS["enum"]
    minimum = minimum_of(engine, schema)
    for seed in (1, 2, 3):
        events = run(engine, request(schema, minimum + 5, seed=seed, flexible=True))
        text = "".join(event.text for event in events)
        assert events[-1].finish_reason is not FinishReason.LENGTH, text
        assert validate_json_output(text, schema, truncated=False).valid, text


def test_a_contract_draft_at_a_tight_budget_is_valid_and_holds_every_required_clause(engine) -> None:  # type: ignore[no-untyped-def]
    from test_contracts import NDA, nda_request

    from proctor.contracts.attempt_plans import check_contract, first_plan, generation_request, render_messages
    from proctor.contracts.specialise import specialise

    contract = nda_request()
    specialised = specialise(NDA, contract)
    messages = render_messages(NDA, contract, specialised)
    plan = first_plan(NDA, contract, seed=1, limit=4096)
    minimum = engine.prepare(generation_request(contract, NDA, specialised, plan, messages, None)).closing.minimum
    for extra in (0, 7, 40):
        tight = dataclasses.replace(plan, max_new_tokens=minimum + extra, temperature=1.0)
        events = run(engine, generation_request(contract, NDA, specialised, tight, messages, None))
        check = check_contract("".join(event.text for event in events), NDA, specialised)
        assert events[-1].finish_reason is FinishReason.CLOSED_AT_BUDGET, events[-1].finish_detail
        assert check.valid, check.errors
        assert [c.id for c in check.clauses if c.present] == [c.id for c in specialised.clauses] == ["4.2", "7"]


def test_a_closer_that_fails_leaves_its_row_without_the_rule_and_the_others_served(engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from proctor.constraints.json_schema.closer import JsonCloser

    schema = SCHEMAS["nested"]
    broken_schema = {**schema, "title": "broken"}  # the injected fault hits this schema's rows only
    budget = roomy(engine, schema, 8)
    real = JsonCloser.endings

    def failing(self: JsonCloser) -> list[str]:
        if self._root.get("title") == "broken" and self.done is False and self._stack:
            raise RuntimeError("injected")
        return real(self)

    monkeypatch.setattr(JsonCloser, "endings", failing)
    sink, other = Collector(), Collector()
    engine.submit(engine.prepare(request(broken_schema, budget, seed=1, request_id="broken")), sink)
    engine.submit(engine.prepare(request(schema, budget, seed=2, request_id="other")), other)
    assert sink.wait(120)[-1].finish_reason is FinishReason.LENGTH  # cut off as without the rule, not failed
    assert other.wait(120)[-1].finish_reason is FinishReason.CLOSED_AT_BUDGET


def test_a_number_that_would_go_on_ends_where_it_is_a_valid_value(engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    (one,) = tokenizer.encode("1", add_special_tokens=False)
    digits = dataclasses.replace(request({"type": "number"}, 40, seed=1), logit_bias=((one, 100.0),))  # "1111…"
    events = run(engine, digits)
    final, text = events[-1], "".join(event.text for event in events)
    assert final.finish_reason is FinishReason.CLOSED_AT_BUDGET and final.usage.closing_tokens == 0, text
    assert "complete value" in final.finish_detail and set(text) == {"1"} and len(events) <= 40
    assert final.schema_check is not None and final.schema_check.valid
    cut = run(engine, dataclasses.replace(digits, stopping=dataclasses.replace(digits.stopping, close_at_budget=False)))
    assert cut[-1].finish_reason is FinishReason.LENGTH and not cut[-1].schema_check.valid


def test_real_schemas_at_budgets_from_their_minimum_to_512_are_valid_or_refused(engine) -> None:  # type: ignore[no-untyped-def]
    """MaskBench's sample (the ones served exactly whose objects are all closed: with open ones a model may write
    an additional key twice, which no engine's mask tracks and the server's check refuses): at each budget the
    output is valid, or the budget was refused up front for being below the minimum; never cut off."""
    from test_constraint_backends_suite import maskbench_sample

    from proctor.constraints.json_schema.walk import reachable

    def closed(schema: object) -> bool:
        objects = [site.node for site in reachable(schema) if isinstance(site.node, dict)
                   and ("properties" in site.node or site.node.get("type") == "object")]
        return bool(objects) and all(node.get("additionalProperties") is False for node in objects)

    chosen = []
    for item in maskbench_sample():
        if len(chosen) == 8 or not closed(item["schema"]):
            continue
        try:
            prepared = engine.prepare(request(item["schema"], 512))
        except RequestValidationError:  # not served, or not exactly
            continue
        if prepared.constraint.exact and prepared.closing is not None and prepared.closing.minimum:
            chosen.append((item["name"], item["schema"], prepared.closing.minimum))
    assert len(chosen) == 8
    closings = 0
    for name, schema, minimum in chosen:
        with pytest.raises(RequestValidationError):
            engine.prepare(request(schema, minimum - 1))
        for budget in (minimum, minimum + 7, 512):
            events = run(engine, request(schema, budget, seed=budget))
            final, text = events[-1], "".join(event.text for event in events)
            assert final.finish_reason is not FinishReason.LENGTH, (name, budget, text)
            assert final.schema_check is not None and final.schema_check.valid, (name, budget, text)
            closings += final.finish_reason is FinishReason.CLOSED_AT_BUDGET
    assert closings >= len(chosen)  # the rule did the work (a random model ends little by itself)


# A recursive schema held out of the rule's making: each level's object costs more to open than its shortest
# member (``data`` is shortest as null; one token, ``{"``, opens the object whose members are required).
RECURSIVE = {"type": "object", "required": ["type", "kind", "data"], "additionalProperties": False, "properties": {
    "type": {"const": "data"}, "kind": {"enum": ["alpha_beta_gamma_delta"]},
    "data": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}}


def test_a_row_nesting_deeper_in_a_recursive_schema_still_closes_within_its_budget(engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The margin is the one of where the row stands (constraints/json_schema/growth.py): at ``data`` one token can
    open a whole level, so the row stops nesting while that level and its ending still fit."""
    (brace,) = tokenizer.encode('{"', add_special_tokens=False)
    for budget in (60, 160):
        for seed in (1, 2, 3):
            nesting = dataclasses.replace(request(RECURSIVE, budget, seed=seed), logit_bias=((brace, 100.0),))
            events = run(engine, nesting)
            final, text = events[-1], "".join(event.text for event in events)
            assert final.finish_reason is FinishReason.CLOSED_AT_BUDGET, (budget, seed, text)
            assert validate_json_output(text, RECURSIVE, truncated=False).valid, text
            assert text.count('"data":{') >= budget // 60 and final.usage.completion_tokens <= budget  # it nested
