"""Penalties and warpers against transformers' own logits processors (and a plain reference formula)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from proctor.decoding.penalties import PenaltyState
from proctor.decoding.warpers import warp
from proctor.domain import SamplingParams

VOCAB = 64


def _state(params: SamplingParams, prompt: list[int], generated: list[int]) -> PenaltyState:
    state = PenaltyState(params, prompt, VOCAB)
    for token in generated:
        state.commit(token)
    return state


def _case(seed: int, alphabet: int = VOCAB) -> tuple[torch.Tensor, list[int], list[int]]:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(VOCAB, generator=gen) * 3
    prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 20))]
    generated = [rng.randrange(alphabet) for _ in range(rng.randint(0, 20))]
    return logits, prompt, generated


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(seed: int, penalty: float) -> None:
    logits, prompt, generated = _case(seed)
    ours = logits.clone()
    _state(SamplingParams(repetition_penalty=penalty), prompt, generated).apply(ours)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + generated]), logits.clone()[None])[0]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert not torch.equal(ours, logits)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_no_repeat_ngram_matches_transformers(seed: int, size: int) -> None:
    logits, prompt, generated = _case(seed, alphabet=4)  # a small alphabet makes repeated n-grams common
    ours = logits.clone()
    _state(SamplingParams(no_repeat_ngram_size=size), prompt, generated).apply(ours)
    theirs = NoRepeatNGramLogitsProcessor(size)(torch.tensor([prompt + generated]), logits.clone()[None])[0]
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), (prompt, generated)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_no_repeat_ngram_bans_something_in_these_cases() -> None:
    """Guard: the comparison above must exercise real bans, not only no-ops."""
    banned = 0
    for seed in range(30):
        logits, prompt, generated = _case(seed, alphabet=4)
        row = logits.clone()
        _state(SamplingParams(no_repeat_ngram_size=2), prompt, generated).apply(row)
        banned += int(torch.isinf(row).sum())
    assert banned > 30


def test_no_repeat_ngram_state_is_incremental() -> None:
    state = PenaltyState(SamplingParams(no_repeat_ngram_size=2), [5, 6], VOCAB)
    row = torch.zeros(VOCAB)
    state.apply(row)
    assert not torch.isinf(row).any()  # last token 6 never seen as an n-gram prefix yet
    state.commit(5)  # history 5 6 5: the bigram (5, 6) is banned next
    row = torch.zeros(VOCAB)
    state.apply(row)
    assert torch.isinf(row).nonzero().flatten().tolist() == [6]


@pytest.mark.parametrize("seed", range(30))
def test_presence_and_frequency_follow_the_reference_formula(seed: int) -> None:
    logits, prompt, generated = _case(seed, alphabet=16)
    presence, frequency = 0.7, -0.4 if seed % 2 else 1.1
    ours = logits.clone()
    _state(SamplingParams(presence_penalty=presence, frequency_penalty=frequency), prompt, generated).apply(ours)
    expected = logits.clone()
    for token in set(generated):  # generated tokens only: the prompt does not count
        count = generated.count(token)
        expected[token] -= presence + frequency * count
    torch.testing.assert_close(ours, expected)


def test_presence_ignores_prompt_tokens() -> None:
    row = torch.zeros(VOCAB)
    _state(SamplingParams(presence_penalty=1.0), [1, 2, 3], []).apply(row)
    assert torch.equal(row, torch.zeros(VOCAB))


@pytest.mark.parametrize("seed", range(20))
def test_all_penalties_together_match_the_chained_reference(seed: int) -> None:
    logits, prompt, generated = _case(seed, alphabet=6)
    params = SamplingParams(repetition_penalty=1.4, presence_penalty=0.3, frequency_penalty=0.2,
                            no_repeat_ngram_size=2)
    ours = logits.clone()
    _state(params, prompt, generated).apply(ours)
    ids = torch.tensor([prompt + generated])
    expected = RepetitionPenaltyLogitsProcessor(1.4)(ids, logits.clone()[None])[0]
    for token in set(generated):
        expected[token] -= 0.3 + 0.2 * generated.count(token)
    expected = NoRepeatNGramLogitsProcessor(2)(ids, expected[None])[0]
    torch.testing.assert_close(ours, expected)


# --- warpers ---------------------------------------------------------------------------------

WARP_VOCAB = 1000


def _hf_warp(row: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    scores = row[None].clone()
    ids = torch.zeros((1, 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(float(temperature))(ids, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(float(top_p))(ids, scores)
    if min_p > 0.0:
        scores = MinPLogitsWarper(float(min_p))(ids, scores)
    return scores[0]


def _borderline_top_p(row: torch.Tensor, temperature: float, top_k: int, top_p: float, token: int) -> bool:
    """Whether ``token`` sits within float noise of the top-p boundary (computed in float64)."""
    scaled = (row.double() / temperature)
    if top_k > 0:
        kth = scaled.topk(top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    higher = probs[probs > probs[token]].sum()
    return abs(float(higher) - top_p) < 1e-5


SETTINGS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.0),
    (0.7, 50, 1.0, 0.0),
    (1.3, 0, 0.9, 0.0),
    (0.5, 0, 1.0, 0.1),
    (1.0, 20, 0.8, 0.05),
    (2.0, 0, 0.5, 0.0),
    (0.9, 200, 0.95, 0.2),
    (1.0, 1, 1.0, 0.0),
]


@pytest.mark.parametrize("seed", range(15))
def test_warp_matches_transformers_chain_row_by_row(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(SETTINGS), WARP_VOCAB, generator=gen) * (1 + seed % 4)
    rng = random.Random(seed)
    settings = SETTINGS[:]
    rng.shuffle(settings)
    temperature, top_k, top_p, min_p = (list(column) for column in zip(*settings, strict=True))
    ours = warp(logits.clone(), torch.tensor(temperature), torch.tensor(top_k), torch.tensor(top_p),
                torch.tensor(min_p))
    for row, (t, k, p, m) in enumerate(settings):
        theirs = _hf_warp(logits[row], t, k, p, m)
        keep_ours, keep_theirs = torch.isfinite(ours[row]), torch.isfinite(theirs)
        differ = (keep_ours != keep_theirs).nonzero().flatten().tolist()
        assert all(_borderline_top_p(logits[row], t, k, p, i) for i in differ), (settings[row], differ)
        both = keep_ours & keep_theirs
        # warp shifts each row by its maximum (overflow safety); distributions are what must agree
        torch.testing.assert_close(ours[row][both] - ours[row][both].max(), theirs[both] - theirs[both].max(),
                                   rtol=1e-5, atol=1e-5)
        assert keep_ours.sum() >= 1
        if k > 0:
            assert keep_ours.sum() <= k
        assert keep_ours[logits[row].argmax()], "the most likely token must survive"


def test_filters_really_filter() -> None:
    """Guard for the comparison above: the settings remove tokens (else it compares identities)."""
    logits = torch.randn(len(SETTINGS), WARP_VOCAB, generator=torch.Generator().manual_seed(1))
    t, k, p, m = (torch.tensor(list(c)) for c in zip(*SETTINGS, strict=True))
    kept = torch.isfinite(warp(logits, t, k, p, m)).sum(-1).tolist()
    assert kept[0] == WARP_VOCAB and kept[1] == 50 and kept[-1] == 1
    assert all(n < WARP_VOCAB for n in kept[1:])


@pytest.mark.parametrize("seed", range(10))
def test_the_argmax_survives_the_most_extreme_settings(seed: int) -> None:
    logits = torch.randn(4, WARP_VOCAB, generator=torch.Generator().manual_seed(seed)) * 10
    out = warp(logits.clone(), temperature=torch.tensor([0.01, 5.0, 1.0, 0.3]), top_k=torch.tensor([1, 0, 0, 3]),
               top_p=torch.tensor([1e-9, 1e-9, 1.0, 1e-6]), min_p=torch.tensor([0.0, 1.0, 1.0, 1.0]))
    finite = torch.isfinite(out)
    assert finite.sum(-1).tolist() == [1, 1, 1, 1]
    assert torch.equal(out.argmax(-1), logits.argmax(-1))


def test_temperature_only_scales() -> None:
    logits = torch.randn(3, WARP_VOCAB, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.5, 1.0, 2.0])
    out = warp(logits.clone(), t, torch.zeros(3, dtype=torch.long), torch.ones(3), torch.zeros(3))
    expected = (logits - logits.amax(-1, keepdim=True)) / t[:, None]
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out.softmax(-1), (logits / t[:, None]).softmax(-1))


def test_tiny_temperature_does_not_overflow() -> None:
    logits = torch.randn(2, WARP_VOCAB, generator=torch.Generator().manual_seed(5)) * 30
    out = warp(logits.clone(), torch.tensor([1e-38, 1e-45]), torch.zeros(2, dtype=torch.long), torch.ones(2),
               torch.zeros(2))
    probs = out.softmax(-1)
    assert not torch.isnan(probs).any()
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.allclose(probs.max(-1).values, torch.ones(2))


def test_masked_tokens_stay_masked() -> None:
    logits = torch.randn(2, WARP_VOCAB, generator=torch.Generator().manual_seed(3))
    logits[:, :10] = float("-inf")
    out = warp(logits.clone(), torch.tensor([1.0, 0.8]), torch.tensor([0, 500]), torch.tensor([0.99, 1.0]),
               torch.tensor([0.0, 0.0]))
    assert torch.isinf(out[:, :10]).all()
    assert not torch.isnan(out).any()


@pytest.mark.parametrize(("spread", "top_k", "top_p", "min_p"), [
    (4.0, 0, 0.95, 0.0),      # a nucleus of a few hundred tokens: found above the first floor
    (0.3, 0, 0.95, 0.0),      # nearly flat: the cut lies below every floor, so the whole row is sorted
    (1.5, 0, 0.99, 0.0),      # a cut between the floors
    (1.0, 30_000, 0.9, 0.0),  # a top-k set far larger than a nucleus
    (2.0, 0, 1.0, 0.001),     # min-p alone
])
def test_wide_rows_keep_what_transformers_keeps(spread: float, top_k: int, top_p: float, min_p: float) -> None:
    """At 152k tokens warp looks for each row's cut among its best tokens, not a sort of the whole row
    (decoding/warpers.py: FLOORS); what it keeps must still be transformers' set."""
    logits = torch.randn(2, 151_936, generator=torch.Generator().manual_seed(11)) * spread
    ours = warp(logits.clone(), torch.tensor([0.8, 1.0]), torch.tensor([top_k, top_k]), torch.tensor([top_p, top_p]),
                torch.tensor([min_p, min_p]))
    for row, temperature in enumerate((0.8, 1.0)):
        theirs = _hf_warp(logits[row], temperature, top_k, top_p, min_p)
        keep_ours, keep_theirs = torch.isfinite(ours[row]), torch.isfinite(theirs)
        differ = (keep_ours != keep_theirs).nonzero().flatten().tolist()
        assert all(_borderline_top_p(logits[row], temperature, top_k, top_p, i) for i in differ), differ
        assert 1 <= int(keep_ours.sum()) < 151_936


def test_ties_at_the_cut_keep_the_lowest_token_ids() -> None:
    logits = torch.full((1, 5000), -50.0)
    logits[0, [4000, 17, 2500, 900]] = 3.0  # four tokens tied for first: top-k 2 keeps ids 17 and 900
    kept = torch.isfinite(warp(logits, torch.tensor([1.0]), torch.tensor([2]), torch.tensor([1.0]),
                               torch.tensor([0.0])))[0].nonzero().flatten().tolist()
    assert kept == [17, 900]


def test_a_row_without_filters_is_left_whole_beside_one_with_them() -> None:
    logits = torch.randn(2, 151_936, generator=torch.Generator().manual_seed(2)) * 4
    out = warp(logits.clone(), torch.tensor([1.0, 1.0]), torch.tensor([0, 40]), torch.tensor([1.0, 1.0]),
               torch.tensor([0.0, 0.0]))
    torch.testing.assert_close(out[0], logits[0] - logits[0].max())
    assert int(torch.isfinite(out[1]).sum()) == 40
