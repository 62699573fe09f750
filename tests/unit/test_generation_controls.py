"""Generation controls: typical_p (against transformers), the controls' processors in the pipeline,
conversion and validation, the client's request builder and CLI flags, the audit round trip."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from proctor.api.check_request import check_request
from proctor.api.convert import chunk_from_event, response_from_events
from proctor.audit.records import request_from_dict, request_to_dict
from proctor.config import Settings
from proctor.decoding.controls import ConfidenceStats, EndBan, ForceToken, PhraseTracker
from proctor.decoding.pipeline import run_pipeline
from proctor.decoding.warpers import warp, warp_values
from proctor.domain import (
    Confidence,
    FinishReason,
    GenerationRequest,
    PhraseInclusion,
    RequestValidationError,
    SamplingParams,
    StoppingParams,
    TokenEvent,
)
from proctor_client.cli import build_parser, request_from_args
from proctor_client.request import build_request
from proctor_client.v1 import generation_pb2 as pb

VOCAB = 300
SETTINGS = Settings.load({}, environ={})
DEFAULT_MAX = SETTINGS.default_max_new_tokens


def _logits(seed: int, rows: int = 3, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def _ours(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
          typical_p: float | None = None) -> torch.Tensor:
    rows = logits.shape[0]
    return warp(logits.clone(), torch.full((rows,), temperature), torch.full((rows,), top_k, dtype=torch.long),
                torch.full((rows,), top_p), torch.full((rows,), min_p),
                None if typical_p is None else torch.full((rows,), typical_p))


# --- typical_p ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mass", [0.05, 0.3, 0.6, 0.9, 0.99])
def test_typical_p_keeps_the_tokens_transformers_keeps(seed: int, mass: float) -> None:
    logits = _logits(seed)
    ours = _ours(logits, typical_p=mass)
    theirs = TypicalLogitsWarper(mass)(None, logits.clone())  # type: ignore[arg-type]
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert int(torch.isfinite(ours).sum()) < 3 * VOCAB  # it did remove something


@pytest.mark.parametrize("seed", range(12))
def test_typical_p_after_the_other_warpers_in_transformers_order(seed: int) -> None:
    # transformers' _get_logits_processor: temperature -> top-k -> top-p -> min-p -> typical-p.
    logits = _logits(seed, scale=2.0)
    ours = _ours(logits, temperature=0.8, top_k=120, top_p=0.97, min_p=0.001, typical_p=0.5)
    theirs = logits.clone()
    for processor in (TemperatureLogitsWarper(0.8), TopKLogitsWarper(120), TopPLogitsWarper(0.97),
                      MinPLogitsWarper(0.001), TypicalLogitsWarper(0.5)):
        theirs = processor(None, theirs)  # type: ignore[arg-type]
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    without = _ours(logits, temperature=0.8, top_k=120, top_p=0.97, min_p=0.001)
    assert torch.isfinite(ours).sum() < torch.isfinite(without).sum()


def test_typical_p_one_leaves_its_row_alone_in_a_mixed_batch() -> None:
    logits = _logits(3, rows=2)
    mixed = warp(logits.clone(), torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2), torch.zeros(2),
                 torch.tensor([0.4, 1.0]))
    plain = _ours(logits)
    assert torch.equal(mixed[1], plain[1])
    assert not torch.equal(torch.isfinite(mixed[0]), torch.isfinite(plain[0]))


# --- the controls' processors in the pipeline --------------------------------------------


@dataclass
class Row:
    """A minimal DecodeRow (an input to the pipeline, not a stand-in for it)."""

    step_sampling: SamplingParams
    processors: tuple[tuple[str, object], ...] = ()
    allowed_mask: torch.Tensor | None = None
    generator: torch.Generator | None = None
    penalties: None = None
    top_logprobs: int = 0
    matcher: None = None
    forbidden: None = None
    last_step: bool = False

    @property
    def sampling_values(self) -> torch.Tensor | None:
        return warp_values(self.step_sampling)

    def banned_token_ids(self) -> tuple[int, ...]:
        return ()

    def end_token_ids(self) -> tuple[int, ...]:
        return (0,)


def _allowed(*ids: int) -> torch.Tensor:
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[list(ids)] = True
    return mask


def _peaked(top: int, second: int) -> torch.Tensor:
    logits = torch.zeros(1, VOCAB)
    logits[0, top], logits[0, second] = 10.0, 5.0
    return logits


def test_the_end_ban_removes_the_end_while_something_else_is_allowed() -> None:
    ban = ("must_include", EndBan([0], torch.device("cpu")))
    [decision] = run_pipeline(_peaked(0, 5), [Row(SamplingParams(), (ban,), _allowed(0, 5))])
    assert decision.token_id == 5 and decision.removed_by == "must_include"


def test_the_end_ban_yields_where_only_the_end_is_allowed() -> None:
    ban = ("must_include", EndBan([0], torch.device("cpu")))
    [decision] = run_pipeline(_peaked(0, 5), [Row(SamplingParams(), (ban,), _allowed(0))])
    assert decision.token_id == 0 and not decision.dead_end


def test_a_forced_token_wins_over_the_model_and_has_probability_one() -> None:
    row = Row(SamplingParams(), (("forced_tokens", ForceToken(7)),))
    [decision] = run_pipeline(_peaked(3, 5), [row])
    assert decision.token_id == 7 and decision.final_logprob == 0.0 and decision.removed_by == "forced_tokens"


def test_a_forced_token_a_mask_removed_is_a_dead_end_never_emitted() -> None:
    row = Row(SamplingParams(), (("forced_tokens", ForceToken(7)),), _allowed(3, 5))
    [decision] = run_pipeline(_peaked(3, 5), [row])
    assert decision.token_id == -1 and decision.dead_end


def test_phrases_are_found_across_pieces_and_reported_on_the_returned_text() -> None:
    tracker = PhraseTracker(["banana split", "x"])
    for piece in ("I like ban", "ana", " spl"):
        tracker.push(piece)
    assert tracker.missing
    tracker.push("it")
    assert tracker.missing  # "x" is still missing
    tracker.push("x")
    assert not tracker.missing
    assert tracker.results("I like banana split") == (PhraseInclusion("banana split", True),
                                                      PhraseInclusion("x", False))


def test_confidence_stats() -> None:
    stats = ConfidenceStats()
    assert stats.summary() == Confidence(0, 0.0, 0.0, 0.0, 0.0)
    stats.add(0.0, [(1, 0.0), (2, -30.0)])
    stats.add(math.log(0.25), [(1, math.log(0.5)), (2, math.log(0.3))])
    summary = stats.summary()
    assert summary.tokens == 2
    assert summary.mean_token_probability == pytest.approx(0.625)
    assert summary.min_token_probability == pytest.approx(0.25)
    assert summary.min_top2_gap == pytest.approx(0.2) and summary.mean_top2_gap == pytest.approx(0.6)


# --- conversion and validation ----------------------------------------------------------------


def _violations(message: pb.GenerateRequest, settings: Settings = SETTINGS) -> dict[str, str]:
    with pytest.raises(RequestValidationError) as caught:
        check_request(message, settings, time_remaining_s=None)
    return {v.field: v.description for v in caught.value.violations}


def test_controls_are_converted() -> None:
    message = build_request("hi", temperature=0.7, typical_p=0.5, greedy_first_tokens=3, forced_tokens={4: 9, 0: 2},
                            must_include=["a", "b c"], confidence=True, max_new_tokens=8)
    request = check_request(message, SETTINGS, time_remaining_s=None)
    assert request.sampling.typical_p == pytest.approx(0.5)
    assert request.sampling.greedy_first_tokens == 3
    assert request.sampling.forced_tokens == ((0, 2), (4, 9))
    assert request.stopping.must_include == ("a", "b c")
    assert request.confidence is True
    plain = check_request(build_request("hi"), SETTINGS, time_remaining_s=None)
    assert (plain.sampling.typical_p, plain.sampling.greedy_first_tokens, plain.sampling.forced_tokens) == (1.0, 0, ())
    assert plain.stopping.must_include == () and plain.confidence is False


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"typical_p": 0.0}, "sampling.typical_p"),
    ({"typical_p": 1.5}, "sampling.typical_p"),
    ({"typical_p": float("nan")}, "sampling.typical_p"),
    ({"greedy_first_tokens": -1}, "sampling.greedy_first_tokens"),
    ({"first_tokens_temperature": -0.5}, "sampling.first_tokens_temperature"),
    ({"first_tokens_temperature": float("inf")}, "sampling.first_tokens_temperature"),
    ({"num_return_sequences": 2}, "num_return_sequences"),  # greedy: the completions would be identical
    ({"num_return_sequences": 17, "temperature": 0.5}, "num_return_sequences"),
    ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences"),
    ({"length_penalty": float("nan")}, "sampling.length_penalty"),
    ({"forced_tokens": {5: 1}, "max_new_tokens": 5}, "sampling.forced_tokens[5]"),
    ({"forced_tokens": {-1: 1}}, "sampling.forced_tokens[-1]"),
    ({"forced_tokens": {0: -3}}, "sampling.forced_tokens[0]"),
    ({"forced_tokens": {DEFAULT_MAX: 1}}, f"sampling.forced_tokens[{DEFAULT_MAX}]"),  # unset: the server default
    ({"must_include": [""]}, "stopping.must_include[0]"),
    ({"must_include": ["ok", "x" * 257]}, "stopping.must_include[1]"),
    ({"must_include": ["p"] * 17}, "stopping.must_include"),
])
def test_bad_controls_name_the_field(kwargs: dict[str, object], field: str) -> None:
    assert field in _violations(build_request("hi", **kwargs))  # type: ignore[arg-type]


def test_more_forced_positions_than_the_limit_are_refused_before_conversion() -> None:
    settings = Settings.load({"max_new_tokens_limit": 4, "default_max_new_tokens": 4}, environ={})
    found = _violations(build_request("hi", forced_tokens={i: 1 for i in range(5)}), settings)
    assert list(found) == ["sampling.forced_tokens"]


def _final_event(**fields: object) -> TokenEvent:
    return TokenEvent("r", (5,), "x", finish_reason=FinishReason.LENGTH, **fields)  # type: ignore[arg-type]


def test_confidence_and_phrase_results_reach_the_response_and_the_last_chunk() -> None:
    confidence = Confidence(3, 0.5, 0.25, 0.4, 0.1)
    event = _final_event(confidence=confidence, must_include=(PhraseInclusion("a", True), PhraseInclusion("b", False)))
    for message in (response_from_events([event]), chunk_from_event(event)):
        assert message.HasField("confidence")
        assert (message.confidence.tokens, message.confidence.mean_token_probability,
                message.confidence.min_token_probability, message.confidence.mean_top2_gap,
                message.confidence.min_top2_gap) == (3, 0.5, 0.25, 0.4, 0.1)
        assert [(p.phrase, p.included) for p in message.must_include] == [("a", True), ("b", False)]
    plain = response_from_events([_final_event()])
    assert not plain.HasField("confidence") and not plain.must_include


# --- client --------------------------------------------------------------------------------


def test_the_request_builder_sets_only_what_was_given() -> None:
    message = build_request("hi", typical_p=0.9, greedy_first_tokens=0, forced_tokens={3: 42}, must_include="a b",
                            confidence=True)
    assert message.sampling.HasField("typical_p") and message.sampling.HasField("greedy_first_tokens")
    assert dict(message.sampling.forced_tokens) == {3: 42}
    assert list(message.stopping.must_include) == ["a b"]  # a bare string is one phrase
    assert message.confidence
    plain = build_request("hi")
    assert not plain.sampling.HasField("typical_p") and not plain.sampling.HasField("greedy_first_tokens")
    assert not plain.sampling.forced_tokens and not plain.stopping.must_include and not plain.confidence


def test_cli_flags() -> None:
    args = build_parser().parse_args(["generate", "--prompt", "x", "--typical-p", "0.7", "--greedy-first-tokens", "2",
                                      "--force", "0=5", "--force", "3=9", "--must-include", "a", "--must-include",
                                      "b", "--confidence"])
    message = request_from_args(args)
    assert message.sampling.typical_p == pytest.approx(0.7) and message.sampling.greedy_first_tokens == 2
    assert dict(message.sampling.forced_tokens) == {0: 5, 3: 9}
    assert list(message.stopping.must_include) == ["a", "b"] and message.confidence


@pytest.mark.parametrize("bad", ["3", "a=1", "1=b", "1=2=3"])
def test_cli_force_needs_pos_equals_id(bad: str) -> None:
    args = build_parser().parse_args(["generate", "--prompt", "x", "--force", bad])
    with pytest.raises(ValueError, match="--force"):
        request_from_args(args)


def test_cli_force_refuses_a_repeated_position() -> None:
    args = build_parser().parse_args(["generate", "--prompt", "x", "--force", "1=2", "--force", "1=3"])
    with pytest.raises(ValueError, match="twice"):
        request_from_args(args)


# --- the audit record ------------------------------------------------------------------------


def test_the_audit_round_trip_keeps_the_token_choosing_controls() -> None:
    request = GenerationRequest(
        "r", prompt="p", sampling=SamplingParams(temperature=0.5, seed=3, typical_p=0.4, greedy_first_tokens=2,
                                                 forced_tokens=((4, 9), (1, 2))),
        stopping=StoppingParams(max_new_tokens=9, must_include=("a", "b")))
    recorded = json.loads(json.dumps(request_to_dict(request, 3)))
    assert recorded["sampling"]["forced_tokens"] == [[1, 2], [4, 9]]  # sorted by position
    back = request_from_dict(recorded, "r")
    assert back.sampling == request.sampling  # JSON lists come back as the same pairs
    assert back.stopping == request.stopping
