"""run_pipeline: the fixed processor order, greedy vs seeded sampling, and the two logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from proctor.decoding.penalties import PenaltyState
from proctor.decoding.pipeline import run_pipeline
from proctor.decoding.warpers import warp_values
from proctor.domain import SamplingParams

VOCAB = 200


@dataclass
class Row:
    """A minimal DecodeRow (an input to the pipeline, not a stand-in for it)."""

    step_sampling: SamplingParams
    penalties: PenaltyState | None = None
    generator: torch.Generator | None = None
    top_logprobs: int = 0
    banned: tuple[int, ...] = ()
    matcher: object | None = None
    forbidden: object | None = None
    allowed_mask: torch.Tensor | None = None
    last_step: bool = False
    processors: tuple[tuple[str, object], ...] = ()
    end_ids: tuple[int, ...] = (0,)

    @property
    def sampling_values(self) -> torch.Tensor | None:
        return warp_values(self.step_sampling)

    def banned_token_ids(self) -> tuple[int, ...]:
        return self.banned

    def end_token_ids(self) -> tuple[int, ...]:
        return self.end_ids


def greedy_row(**kw: object) -> Row:
    return Row(SamplingParams(), **kw)  # type: ignore[arg-type]


def sampling_row(seed: int, temperature: float = 1.0, *, banned: tuple[int, ...] = (), top_logprobs: int = 0,
                 **sampling: object) -> Row:
    params = SamplingParams(temperature=temperature, seed=seed, **sampling)  # type: ignore[arg-type]
    return Row(params, generator=torch.Generator().manual_seed(seed), top_logprobs=top_logprobs, banned=banned)


def logits_for(batch: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_rows_pick_the_argmax() -> None:
    logits = logits_for(4)
    decisions = run_pipeline(logits.clone(), [greedy_row() for _ in range(4)])
    assert [d.token_id for d in decisions] == logits.argmax(-1).tolist()


def test_temperature_zero_is_greedy() -> None:
    logits = logits_for(2, seed=5)
    rows = [Row(SamplingParams(temperature=0.0)), Row(SamplingParams(temperature=0.0))]
    assert [d.token_id for d in run_pipeline(logits.clone(), rows)] == logits.argmax(-1).tolist()


def test_banned_ids_are_never_chosen_even_as_argmax() -> None:
    logits = logits_for(3, seed=1)
    top = logits.argmax(-1).tolist()
    logits[:, 7] = 100.0  # token 7 is everyone's argmax now
    rows = [greedy_row(banned=(7,)), sampling_row(3, temperature=0.01, banned=(7, top[1])), greedy_row()]
    decisions = run_pipeline(logits.clone(), rows)
    assert decisions[0].token_id == top[0]
    assert decisions[1].token_id not in (7, top[1])
    assert decisions[2].token_id == 7
    assert decisions[0].final_logprob > decisions[0].raw_logprob  # renormalised without the banned token


def test_banned_ids_never_sampled_over_many_draws() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: every token is equally likely
    banned = tuple(range(0, VOCAB, 2))
    row = sampling_row(11, banned=banned)
    for _ in range(200):
        (decision,) = run_pipeline(logits.clone(), [row])
        assert decision.token_id % 2 == 1


def _draws(seed: int, logits: torch.Tensor, steps: int = 20) -> list[int]:
    row = sampling_row(seed, temperature=1.5)
    return [run_pipeline(logits.clone(), [row])[0].token_id for _ in range(steps)]


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    logits = logits_for(1, seed=2, scale=0.5)
    assert _draws(42, logits) == _draws(42, logits)
    assert _draws(42, logits) != _draws(43, logits)


def test_a_sampling_row_does_not_depend_on_its_batch_mates() -> None:
    logits = logits_for(1, seed=4, scale=0.5)
    alone = _draws(7, logits)
    row = sampling_row(7, temperature=1.5)
    mates = [sampling_row(99, temperature=0.8, top_k=5), greedy_row(), sampling_row(100, top_p=0.5)]
    together = []
    for step in range(20):
        batch = torch.cat([logits_for(1, seed=100 + step), logits, logits_for(2, seed=200 + step)])
        rows = [mates[0], row, mates[1], mates[2]]
        together.append(run_pipeline(batch, rows)[1].token_id)
    assert together == alone


def test_raw_and_final_logprobs_for_a_sampling_row() -> None:
    logits = logits_for(1, seed=6)
    row = sampling_row(1, temperature=0.5, top_k=10)
    (decision,) = run_pipeline(logits.clone(), [row])
    raw = torch.log_softmax(logits[0], -1)
    scaled = logits[0] / 0.5
    kth = scaled.topk(10).values[-1]
    final = torch.log_softmax(scaled.masked_fill(scaled < kth, float("-inf")), -1)
    assert decision.token_id in logits[0].topk(10).indices.tolist()
    assert decision.raw_logprob == pytest.approx(float(raw[decision.token_id]), abs=1e-5)
    assert decision.final_logprob == pytest.approx(float(final[decision.token_id]), abs=1e-5)
    assert decision.final_logprob > decision.raw_logprob


def test_greedy_final_logprob_ignores_temperature_but_includes_penalties() -> None:
    logits = logits_for(1, seed=8)
    plain = run_pipeline(logits.clone(), [greedy_row()])[0]
    assert plain.final_logprob == pytest.approx(plain.raw_logprob, abs=1e-6)

    params = SamplingParams(repetition_penalty=3.0)
    top = int(logits.argmax())
    penalties = PenaltyState(params, [top], VOCAB)
    penalised = logits.clone()
    penalties.apply(penalised[0])
    (decision,) = run_pipeline(logits.clone(), [Row(params, penalties=penalties)])
    assert decision.token_id == int(penalised.argmax())
    raw = torch.log_softmax(logits[0], -1)
    final = torch.log_softmax(penalised[0], -1)
    assert decision.raw_logprob == pytest.approx(float(raw[decision.token_id]), abs=1e-5)
    assert decision.final_logprob == pytest.approx(float(final[decision.token_id]), abs=1e-5)


def test_top_alternatives_come_from_the_raw_distribution_sorted_and_counted() -> None:
    logits = logits_for(3, seed=9)
    rows = [greedy_row(top_logprobs=5), greedy_row(top_logprobs=0), sampling_row(2, temperature=0.3, top_logprobs=20,
                                                                               banned=(int(logits[2].argmax()),))]
    decisions = run_pipeline(logits.clone(), rows)
    assert len(decisions[0].alternatives) == 5
    assert decisions[1].alternatives == ()
    assert len(decisions[2].alternatives) == 20
    raw = torch.log_softmax(logits, -1)
    for index in (0, 2):
        ids = [i for i, _ in decisions[index].alternatives]
        values = [v for _, v in decisions[index].alternatives]
        assert values == sorted(values, reverse=True)
        assert ids == raw[index].topk(len(ids)).indices.tolist()
        for token, value in decisions[index].alternatives:
            assert value == pytest.approx(float(raw[index, token]), abs=1e-6)
    # The banned argmax is still listed first: alternatives describe the model, not the masks.
    assert decisions[2].alternatives[0][0] == int(logits[2].argmax())


def test_a_row_with_every_token_banned_is_a_dead_end_and_the_others_proceed() -> None:
    logits = torch.randn(2, 16, generator=torch.Generator().manual_seed(0))
    dead = greedy_row(banned=tuple(range(16)))
    alive = greedy_row()
    decisions = run_pipeline(logits.clone(), [dead, alive])
    assert decisions[0].token_id == -1 and decisions[0].dead_end
    assert decisions[1].token_id == int(logits[1].argmax())


class AllowedSet:
    """A constraint matcher that allows a fixed set of tokens (an input to the pipeline)."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = allowed

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        from proctor.constraints.backend import bitmask_words

        words = [0] * bitmask_words(VOCAB)
        for token in self.allowed:
            words[token // 32] |= 1 << (token % 32)
        bitmask[row] = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def test_greedy_constrained_steps_take_one_kernel_pass_with_the_general_paths_decisions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The constraint-only greedy step (no masks built, no copy) decides exactly what the general path does."""
    from proctor.decoding import logits_ops, pipeline
    from proctor.executor import fused_decode

    problem = fused_decode.load_problem()
    if problem is not None:
        from helpers.requirements import missing

        missing(f"the kernel library: {problem}")
    logits = logits_for(5, seed=3)
    top = logits.argmax(-1).tolist()
    rows = [greedy_row(matcher=AllowedSet([top[0], 7, 150]), top_logprobs=3),  # the top choice allowed
            greedy_row(matcher=AllowedSet([3, 64, 199])),  # the top choice masked
            greedy_row(matcher=AllowedSet([])),  # nothing allowed: a dead end
            greedy_row(top_logprobs=2),  # no constraint in a constrained batch
            greedy_row(matcher=AllowedSet([31, 32, 33]))]
    times: list[list[str]] = []
    fast = run_pipeline(logits.clone(), rows, lambda _seconds, removed: times.append(removed))
    assert pipeline._greedy_under_constraints(logits.clone(), rows, top, logits_ops.row_logsumexp(logits),
                                              None) is not None  # the fast path ran
    monkeypatch.setattr(pipeline, "_greedy_under_constraints", lambda *args: None)
    general = run_pipeline(logits.clone(), rows, lambda _seconds, removed: times.append(removed))
    assert fast == general
    last = "" if top[4] in (31, 32, 33) else "constraint"
    assert times[0] == times[1] == ["", "constraint", "constraint", "", last]  # what removed each top choice
    assert fast[2].token_id == -1 and fast[0].token_id == top[0] and fast[1].token_id in (3, 64, 199)
    assert fast[0].allowed_count == 3 and fast[3].allowed_count == -1 and fast[3].token_id == top[3]


class CountingAllowedSet(AllowedSet):
    fills = 0

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        CountingAllowedSet.fills += 1
        super().fill_bitmask(bitmask, row)


@pytest.mark.parametrize("kind", ["greedy", "mixed"])
def test_constraints_filled_ahead_of_the_logits_give_the_same_decisions_with_no_second_fill(kind: str) -> None:
    """The bitmasks the engine fills while the forward runs (masks.constraints_ahead) stand in for the pipeline's own
    fill: the same decisions on the constraint-only greedy path and on the general one (a sampled row, a forbidden
    token), and every matcher filled once, ahead."""
    from proctor.decoding.masks import constraints_ahead

    def rows() -> list[Row]:
        constrained = [greedy_row(matcher=CountingAllowedSet([5, 7, 150]), top_logprobs=2),
                       greedy_row(matcher=CountingAllowedSet([3, 64, 199])), greedy_row()]
        if kind == "mixed":
            constrained += [Row(SamplingParams(temperature=1.0, seed=4), generator=torch.Generator().manual_seed(4),
                                 matcher=CountingAllowedSet([9, 10, 11])), sampling_row(5, banned=(1, 2))]
        return constrained

    logits = logits_for(5 if kind == "mixed" else 3, seed=8)
    expected = run_pipeline(logits.clone(), rows())
    ahead_rows = rows()
    CountingAllowedSet.fills = 0
    ahead = constraints_ahead(ahead_rows, VOCAB)
    assert ahead is not None and CountingAllowedSet.fills == (3 if kind == "mixed" else 2)
    seen: list[float] = []
    assert run_pipeline(logits.clone(), ahead_rows, lambda seconds, _removed: seen.append(seconds), ahead) == expected
    assert CountingAllowedSet.fills == (3 if kind == "mixed" else 2)  # nothing filled again
    assert seen and seen[0] >= ahead.seconds  # the mask time reported counts the part filled ahead
    assert constraints_ahead([greedy_row()], VOCAB) is None


def test_a_draw_follows_the_row_s_distribution_and_only_its_tokens_left() -> None:
    """decoding/sampler.py's draw: over many seeded draws each token's share is its probability, and a token
    at -inf is never drawn."""
    from proctor.decoding.sampler import draw

    logits = torch.full((VOCAB,), float("-inf"))
    logits[[3, 50, 120, 199]] = torch.tensor([0.0, 1.0, 2.0, -1.0])
    expected = logits.softmax(-1)
    generator = torch.Generator().manual_seed(0)
    draws = 20_000
    counts = torch.bincount(torch.tensor([draw(logits, generator) for _ in range(draws)]), minlength=VOCAB)
    assert set(counts.nonzero().flatten().tolist()) == {3, 50, 120, 199}
    assert torch.allclose(counts.double() / draws, expected.double(), atol=0.015)
