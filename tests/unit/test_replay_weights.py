"""A replay runs in the weights mode and sampler revision its record names (or is refused, saying what to use)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from proctor.api.audit_servicer import AuditServicer
from proctor.config import Settings


def servicer(weights: str) -> AuditServicer:
    model = {"model_id": "m", "weights_sha256": "w", "tokenizer_sha256": "t", "weights": weights}
    generation = SimpleNamespace(audit=SimpleNamespace(model=model, policy=SimpleNamespace(key=None)))
    return AuditServicer(Settings(), store=None, generation=generation, checkpoint_file=None)  # type: ignore[arg-type]


def record(sampling: dict[str, Any] | None = None, **model: Any) -> dict[str, Any]:
    return {"kind": "request", "request": {"prompt": "Hi", "sampling": sampling or {"temperature": None}},
            "output": {"policy": "plain"}, "model": {"weights_sha256": "w", "tokenizer_sha256": "t", **model}}


def test_a_record_of_another_mode_is_refused_naming_the_flag() -> None:
    problem = servicer("q8")._replay_problem(record(weights="fp16"))
    assert "--weights fp16" in problem and "--weights q8" in problem


def test_a_record_of_the_same_mode_replays() -> None:
    assert servicer("q8")._replay_problem(record(weights="q8")) == ""


def test_a_record_from_before_weight_modes_counts_as_dense() -> None:
    assert servicer("dense")._replay_problem(record()) == ""
    assert "--weights dense" in servicer("q8")._replay_problem(record())


def test_a_record_of_an_earlier_revision_of_the_mode_is_refused() -> None:
    current = servicer("q8")
    current._generation.audit.model["weights_revision"] = 2
    assert current._replay_problem(record(weights="q8", weights_revision=2)) == ""
    problem = current._replay_problem(record(weights="q8"))  # no revision recorded: the first
    assert "revision 1 of --weights q8" in problem and "revision 2" in problem


def test_a_sampled_record_of_another_sampler_revision_is_refused_and_a_greedy_one_replays() -> None:
    current = servicer("q8")
    current._generation.audit.model["sampler_revision"] = 2
    sampled = {"temperature": 0.8, "seed": "7"}
    assert current._replay_problem(record(sampled, weights="q8", sampler_revision=2)) == ""
    problem = current._replay_problem(record(sampled, weights="q8"))  # no revision recorded: the first
    assert "revision 1 of the sampler" in problem and "revision 2" in problem
    assert current._replay_problem(record(weights="q8")) == ""  # greedy: never reached the sampler
    first_tokens = {"temperature": None, "first_tokens_temperature": 0.5}
    assert "revision 1 of the sampler" in current._replay_problem(record(first_tokens, weights="q8"))
    fallback = record(weights="q8") | {"attempts": [{"temperature": 0.0}, {"temperature": 0.7}]}
    assert "revision 1 of the sampler" in current._replay_problem(fallback)


def test_a_record_of_other_weights_or_another_tokenizer_is_refused() -> None:
    current = servicer("q8")
    other_weights = record(weights="q8") | {"model": {"weights_sha256": "other", "tokenizer_sha256": "t"}}
    assert "different model (weights_sha256 other)" in current._replay_problem(other_weights)
    other_tokenizer = record(weights="q8") | {"model": {"weights_sha256": "w", "tokenizer_sha256": "other"}}
    assert "different model (tokenizer_sha256 other)" in current._replay_problem(other_tokenizer)


def test_a_long_prompt_prefilled_on_another_chunk_grid_is_refused() -> None:
    current = servicer("q8")
    current._generation.audit.model["prefill_chunk_tokens"] = 128

    def chunked(size: int | None, tokens: int | None) -> dict[str, Any]:
        body = record(weights="q8") | {"prompt": {"policy": "full", "text": "…", "tokens": tokens}}
        if size is not None:
            body["model"]["prefill_chunk_tokens"] = size
        return body

    assert current._replay_problem(chunked(128, 900)) == ""  # the same grid
    assert current._replay_problem(chunked(64, 60)) == ""  # short enough that neither server chunks it
    assert current._replay_problem(chunked(None, 900)) == ""  # a record from before the field
    problem = current._replay_problem(chunked(64, 100))  # chunked then, whole here
    assert "prefilled in chunks of 64 tokens" in problem and "--prefill-chunk-tokens 64" in problem
    problem = current._replay_problem(chunked(0, 300))  # whole then, chunked here
    assert "(300 tokens) was prefilled whole" in problem and "is 128" in problem
    assert "prefilled in chunks of 64" in current._replay_problem(chunked(64, None))  # length unknown: refused


def test_batch_invariant_rows_replay_only_where_rows_are_and_batch_dependent_ones_only_where_they_are_not() -> None:
    gpu = servicer("dense")
    gpu._generation.audit.model.update(batch_invariant=False, device="cuda:0")
    problem = gpu._replay_problem(record(weights="dense", batch_invariant=True, device="cpu"))
    assert "were batch-invariant" in problem and "cuda:0" in problem and "--batch-invariant on" in problem
    cpu = servicer("dense")
    cpu._generation.audit.model.update(batch_invariant=True, device="cpu")
    problem = cpu._replay_problem(record(weights="dense", batch_invariant=False, device="cuda:0"))
    assert "were not batch-invariant" in problem and "--batch-invariant off" in problem
    assert cpu._replay_problem(record(weights="dense", batch_invariant=True, device="cpu")) == ""
    assert cpu._replay_problem(record(weights="dense")) == ""  # a record from before the field is not refused


def test_a_record_the_closing_rule_shaped_is_refused_under_another_revision() -> None:
    current = servicer("q8")
    current._generation.audit.model["closing_revision"] = 2
    closing = {"stopping": {"close_at_budget": True}, "constraint": {"kind": "json_schema"}}
    closed = record(weights="q8") | {"finish": {"reason": "closed_at_budget"}, "usage": {"closing_tokens": 3}}
    closed["request"] |= closing
    problem = current._replay_problem(closed)  # no revision recorded: the first
    assert "revision 1 of the budget's closing rule" in problem and "revision 2" in problem
    assert current._replay_problem(closed | {"model": {**closed["model"], "closing_revision": 2}}) == ""
    untouched = record(weights="q8") | {"finish": {"reason": "eos"}, "usage": {"closing_tokens": 0}}
    untouched["request"] |= closing
    assert current._replay_problem(untouched) == ""  # the rule never fired: a later revision never fires sooner
    tools = record(weights="q8") | {"finish": {"reason": "eos"}}
    tools["request"] |= {"stopping": {"close_at_budget": True}, "constraint": {"kind": "grammar"}}
    assert "closing rule" in current._replay_problem(tools)  # revision 1 never closed a tool call
    off = record(weights="q8") | {"finish": {"reason": "closed_at_budget"}}
    off["request"] |= {"stopping": {"close_at_budget": False}, "constraint": {"kind": "grammar"}}
    assert current._replay_problem(off) == ""
