"""Generation controls through the engine (tiny random-weight model, real tokenizer): every expectation
is recomputed from the model's own forward pass, not read back from the engine."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.engine import Collector, with_constraints

from proctor.domain import (
    ConstraintRequest,
    FinishReason,
    GenerationRequest,
    PhraseInclusion,
    SamplingParams,
    StoppingParams,
)
from proctor.engine.sequence import SequenceState

PROMPT = "Once upon a time, in a small village by the sea, there lived"
BANANA, ZEBRA, YES, SEVEN, LETTER_A = 21285, 29106, 9805, 39, 81  # " banana", " zebra", " yes", "7", "a"
_ids = itertools.count()


def request(n: int = 8, *, sampling: SamplingParams | None = None, **fields: object) -> GenerationRequest:
    stopping = fields.pop("stopping", StoppingParams(max_new_tokens=n, ignore_eos=True))
    return GenerationRequest(f"c{next(_ids)}", prompt=PROMPT, sampling=sampling or SamplingParams(),
                             stopping=stopping, token_details=True, **fields)  # type: ignore[arg-type]


def reference_draw(logits: torch.Tensor, generator: torch.Generator) -> int:
    """The sampler's draw as documented (decoding/sampler.py, revision 2), written out apart from it: the
    first token, in token order, whose cumulative probability exceeds one float64 uniform of the generator."""
    cumulative = np.cumsum(np.exp((logits - logits.max()).double().numpy()))
    uniform = float(torch.rand((), generator=generator, dtype=torch.float64))
    return int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))


def run(engine, req: GenerationRequest) -> Collector:  # type: ignore[no-untyped-def]
    sink = Collector()
    engine.submit(engine.prepare(req), sink)
    sink.wait(120)
    return sink


def step_logits(model, tokenizer, tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The model's logits before each generated token: row k predicts tokens[k] (one forward pass)."""
    prompt = tokenizer(PROMPT)["input_ids"]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    return logits[len(prompt) - 1: len(prompt) - 1 + len(tokens)]


@pytest.fixture
def engine(make_engine):  # type: ignore[no-untyped-def]
    return make_engine()


@pytest.fixture
def constrained(make_engine, tiny_loaded, default_model_dir: Path):  # type: ignore[no-untyped-def]
    return with_constraints(make_engine(start=False), tiny_loaded, default_model_dir)


# --- confidence -----------------------------------------------------------------------------


def test_confidence_is_computed_from_the_model_s_distribution(engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    sink = run(engine, request(8, confidence=True))
    tokens = sink.token_ids
    probs = step_logits(tiny_model, tokenizer, tokens).softmax(-1)
    top2 = probs.topk(2, dim=-1).values
    gaps, chosen = top2[:, 0] - top2[:, 1], probs[torch.arange(len(tokens)), tokens]
    confidence = sink.final.confidence
    assert confidence is not None and confidence.tokens == len(tokens) == 8
    assert confidence.mean_top2_gap == pytest.approx(float(gaps.mean()), abs=1e-5)
    assert confidence.min_top2_gap == pytest.approx(float(gaps.min()), abs=1e-5)
    # Greedy without masks: the final distribution is the raw one.
    assert confidence.mean_token_probability == pytest.approx(float(chosen.mean()), abs=1e-5)
    assert confidence.min_token_probability == pytest.approx(float(chosen.min()), abs=1e-5)
    # The two alternatives it needs are not reported as the caller's top_logprobs.
    assert all(d.top_logprobs == () for e in sink.events for d in e.details)
    assert run(engine, request(3)).final.confidence is None


def test_confidence_uses_the_final_distribution_of_a_sampled_request(engine) -> None:  # type: ignore[no-untyped-def]
    sink = run(engine, request(8, sampling=SamplingParams(temperature=0.5, seed=4), confidence=True))
    details = [d for e in sink.events for d in e.details]
    final = [float(torch.tensor(d.final_logprob).exp()) for d in details]
    raw = [float(torch.tensor(d.logprob).exp()) for d in details]
    confidence = sink.final.confidence
    assert confidence is not None
    assert confidence.mean_token_probability == pytest.approx(sum(final) / len(final), abs=1e-6)
    assert confidence.min_token_probability == pytest.approx(min(final), abs=1e-6)
    assert confidence.mean_token_probability != pytest.approx(sum(raw) / len(raw), abs=1e-3)


# --- typical_p, greedy_first_tokens, forced_tokens --------------------------------------------


def test_typical_p_applies_to_sampled_rows(engine) -> None:  # type: ignore[no-untyped-def]
    def tokens(seed: int, **sampling: object) -> list[int]:
        return run(engine, request(10, sampling=SamplingParams(temperature=1.0, seed=seed, **sampling))).token_ids  # type: ignore[arg-type]

    assert tokens(1) != tokens(2)  # plain sampling depends on the seed
    # A tiny mass keeps only the most typical token at each step: the seed no longer matters.
    assert tokens(1, typical_p=1e-9) == tokens(2, typical_p=1e-9)


def test_greedy_prefix_forced_tokens_and_then_the_request_s_own_draws(engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    seed, n, prefix, forced = 1234, 10, 3, {5: BANANA}
    sampling = SamplingParams(temperature=1.0, seed=seed, greedy_first_tokens=prefix,
                              forced_tokens=tuple(forced.items()))
    sink = run(engine, request(n, sampling=sampling))
    tokens = sink.token_ids
    assert len(tokens) == n
    logits = step_logits(tiny_model, tokenizer, tokens)
    generator = torch.Generator().manual_seed(seed)  # drawn from only on the sampled steps
    for step in range(n):
        if step < prefix:
            assert tokens[step] == int(logits[step].argmax()), step
        elif step in forced:
            assert tokens[step] == forced[step]
        else:
            assert tokens[step] == reference_draw(logits[step], generator), step
    details = [d for e in sink.events for d in e.details]
    assert details[5].final_logprob == 0.0 and details[5].removed_by == "forced_tokens"
    assert run(engine, request(n, sampling=sampling)).token_ids == tokens  # seeded: reproducible


def test_a_mixed_schedule_samples_its_first_tokens_at_their_own_temperature(engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    seed, n, prefix = 77, 8, 3
    sampling = SamplingParams(temperature=1.0, seed=seed, greedy_first_tokens=prefix, first_tokens_temperature=0.3)
    tokens = run(engine, request(n, sampling=sampling)).token_ids
    logits = step_logits(tiny_model, tokenizer, tokens)
    generator = torch.Generator().manual_seed(seed)  # drawn from on every step: the prefix is sampled too
    for step in range(n):
        scaled = logits[step] / (0.3 if step < prefix else 1.0)
        assert tokens[step] == reference_draw(scaled - scaled.max(), generator), step


def test_forced_tokens_in_a_greedy_request(engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    forced = {0: ZEBRA, 3: BANANA}
    tokens = run(engine, request(6, sampling=SamplingParams(forced_tokens=tuple(forced.items())))).token_ids
    logits = step_logits(tiny_model, tokenizer, tokens)
    assert [tokens[p] for p in forced] == list(forced.values())
    assert all(tokens[k] == int(logits[k].argmax()) for k in range(6) if k not in forced)


def test_a_forced_token_the_constraint_forbids_is_a_dead_end(constrained) -> None:  # type: ignore[no-untyped-def]
    digits = ConstraintRequest("regex", text="[0-9]{1,4}")
    sink = run(constrained, request(4, sampling=SamplingParams(forced_tokens=((1, LETTER_A),)), constraint=digits))
    assert sink.final.finish_reason is FinishReason.DEAD_END
    assert "sampling.forced_tokens[1]" in sink.final.finish_detail
    assert LETTER_A not in sink.token_ids and len(sink.token_ids) == 1
    allowed = run(constrained, request(4, sampling=SamplingParams(forced_tokens=((0, SEVEN),)), constraint=digits))
    assert allowed.token_ids[0] == SEVEN and allowed.text.isdigit()


# --- must_include -----------------------------------------------------------------------------


def test_the_end_waits_for_a_must_include_phrase(engine) -> None:  # type: ignore[no-untyped-def]
    # " yes" is a stop token the model is pushed to choose at every step.
    stopping = {"max_new_tokens": 10, "ignore_eos": True, "stop_token_ids": (YES,)}
    eager = run(engine, request(logit_bias=((YES, 100.0),), stopping=StoppingParams(**stopping)))  # type: ignore[arg-type]
    assert eager.token_ids == [YES] and eager.final.finish_reason is FinishReason.STOP_TOKEN
    sink = run(engine, request(logit_bias=((YES, 100.0),), sampling=SamplingParams(forced_tokens=((3, BANANA),)),
                               stopping=StoppingParams(**stopping, must_include=(" banana",))))  # type: ignore[arg-type]
    assert sink.token_ids[3] == BANANA and YES not in sink.token_ids[:3]
    assert sink.token_ids[4:] == [YES] and sink.final.finish_reason is FinishReason.STOP_TOKEN
    assert sink.final.must_include == (PhraseInclusion(" banana", True),)


def test_a_missing_phrase_holds_off_eos_until_the_length_limit(engine, tokenizer) -> None:  # type: ignore[no-untyped-def]
    eos = tokenizer.eos_token_id
    sink = run(engine, request(logit_bias=((eos, 100.0),),
                               stopping=StoppingParams(max_new_tokens=6, must_include=("zq#", " zebra"))))
    assert eos not in sink.token_ids and len(sink.token_ids) == 6
    assert sink.final.finish_reason is FinishReason.LENGTH
    assert sink.final.must_include == (PhraseInclusion("zq#", False), PhraseInclusion(" zebra", False))
    eager = run(engine, request(logit_bias=((eos, 100.0),), stopping=StoppingParams(max_new_tokens=6)))
    assert eager.token_ids == [eos]


def test_a_constraint_that_must_end_ends_and_the_phrase_is_reported_missing(constrained) -> None:  # type: ignore[no-untyped-def]
    sink = run(constrained, request(8, constraint=ConstraintRequest("regex", text="[0-9]"),
                                    stopping=StoppingParams(max_new_tokens=8, must_include=("banana",))))
    assert sink.final.finish_reason is FinishReason.CONSTRAINT_COMPLETE and sink.text.isdigit()
    assert sink.final.must_include == (PhraseInclusion("banana", False),)


# --- nothing changes for a request that uses none of them ------------------------------------


def _state(engine, req: GenerationRequest) -> SequenceState:  # type: ignore[no-untyped-def]
    loaded = engine.loaded
    return SequenceState(engine.prepare(req), tokenizer=loaded.tokenizer, eos_token_ids=frozenset(loaded.eos_token_ids),
                         vocab_size=loaded.vocab_size, device=loaded.device, seed=0, sink=lambda event: None)


def test_a_request_without_controls_keeps_a_fixed_row(engine) -> None:  # type: ignore[no-untyped-def]
    plain = _state(engine, request(4, confidence=True))  # confidence needs no per-step change
    assert plain.row.processors == () and plain.row.step_sampling is plain.request.sampling
    assert not plain.row.controlled and plain.row.top_logprobs == 2
    controlled = _state(engine, request(4, sampling=SamplingParams(temperature=1.0, greedy_first_tokens=1),
                                        stopping=StoppingParams(max_new_tokens=4, must_include=("x",))))
    assert controlled.row.step_sampling.greedy and [name for name, _ in controlled.row.processors] == ["must_include"]


def test_a_sampled_request_draws_from_a_cpu_generator_whatever_the_device(engine) -> None:  # type: ignore[no-untyped-def]
    """The draw (decoding/sampler.py) takes its uniform on the CPU and moves it to the logits' device: a CUDA
    generator failed every sampled request on a GPU (bench/gpu.sh found it). The same seed, the same stream."""
    loaded = engine.loaded
    state = SequenceState(engine.prepare(request(4, sampling=SamplingParams(temperature=0.7, seed=9))),
                          tokenizer=loaded.tokenizer, eos_token_ids=frozenset(loaded.eos_token_ids),
                          vocab_size=loaded.vocab_size, device=torch.device("cuda"), seed=9, sink=lambda event: None)
    assert state.row.generator is not None and state.row.generator.device.type == "cpu"
    assert torch.rand((), generator=state.row.generator) == torch.rand((), generator=torch.Generator().manual_seed(9))
