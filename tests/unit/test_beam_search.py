"""Beam search (engine/beam.py) against transformers' own ``generate(num_beams=...)`` on the tiny model:
the same returned sequences in the same order with the same scores, for several length penalties and
early-stopping modes; constraints per beam; what beams do not combine with is refused by field."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from proctor.domain import (
    ConstraintRequest,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    StoppingParams,
)
from tests.helpers.engine import Collector

PROMPT = "The history of the printing press begins"
_ids = itertools.count()


def beam_request(n: int, beams: int = 4, returned: int = 1, **sampling: object) -> GenerationRequest:
    ignore_eos = bool(sampling.pop("ignore_eos", False))
    return GenerationRequest(request_id=f"beam-{next(_ids)}", prompt=PROMPT,
                             sampling=SamplingParams(num_beams=beams, **sampling),  # type: ignore[arg-type]
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=ignore_eos),
                             num_return_sequences=returned)


def run(engine, request: GenerationRequest) -> Collector:  # type: ignore[no-untyped-def]
    sink = Collector()
    engine.submit(engine.prepare(request), sink)
    sink.wait(60)
    return sink


def hf_beams(model, tokenizer, n: int, beams: int, returned: int, eos: int | None, **kwargs: object
             ) -> list[tuple[list[int], float]]:  # type: ignore[no-untyped-def]
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             num_beams=beams, num_return_sequences=returned, eos_token_id=eos,
                             pad_token_id=tokenizer.pad_token_id, output_scores=True, return_dict_in_generate=True,
                             **kwargs)
    result = []
    for row, score in zip(out.sequences[:, ids.shape[1]:].tolist(), out.sequences_scores.tolist(), strict=True):
        if eos is not None and eos in row:
            row = row[:row.index(eos) + 1]
        result.append((row, score))
    return result


def beam_token(model, tokenizer, step: int) -> int:  # type: ignore[no-untyped-def]
    """The best unconstrained beam's token at ``step``: made the end-of-sequence token, beams end at varied
    lengths."""
    return hf_beams(model, tokenizer, step + 1, 4, 1, None)[0][0][step]


def favourite(model, tokenizer, step: int) -> int:  # type: ignore[no-untyped-def]
    """The greedy continuation's token at ``step``: made the end-of-sequence token, beams end at varied lengths."""
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=step + 1,
                             eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    return int(out[0, ids.shape[1] + step])


def test_beams_to_the_limit_equal_generate(make_engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine()
    expected = hf_beams(tiny_model, tokenizer, 12, 4, 3, None)
    sink = run(engine, beam_request(12, 4, 3, ignore_eos=True))
    final = sink.final
    assert final.error is None, final.error
    assert [list(s.token_ids) for s in final.sequences] == [row for row, _ in expected]
    assert [s.score for s in final.sequences] == pytest.approx([score for _, score in expected], rel=1e-6)
    assert sink.token_ids == expected[0][0] and final.finish_reason is FinishReason.LENGTH
    assert all(not s.details for s in final.sequences)  # nobody asked for details: none are kept
    audited = run(engine, dataclasses.replace(beam_request(12, 4, 3, ignore_eos=True), audited=True, audit_top_n=2))
    for sequence in audited.final.sequences:  # the audit record gets every returned beam's token details
        assert [d.token_id for d in sequence.details] == list(sequence.token_ids)
        assert all(len(d.top_logprobs) == 2 for d in sequence.details)
        mean = sum(d.final_logprob for d in sequence.details) / len(sequence.details)  # length_penalty 1
        assert sequence.score == pytest.approx(mean, rel=1e-5)
    best = audited.final.sequences[0]
    assert [d.logprob for d in best.details] == [d.logprob for e in audited.events for d in e.details]
    assert all(s.finish_reason is FinishReason.LENGTH for s in final.sequences)
    greedy = [favourite(tiny_model, tokenizer, step) for step in range(12)]
    assert sink.token_ids != greedy  # the search found something greedy decoding did not


@pytest.mark.parametrize(("length_penalty", "early_stopping"), [(1.0, False), (0.5, True), (2.0, "never"),
                                                                (-1.0, False)])
def test_beams_that_end_equal_generate(make_engine, tiny_loaded, tiny_model, tokenizer, length_penalty: float,
                                       early_stopping: bool | str) -> None:  # type: ignore[no-untyped-def]
    eos = beam_token(tiny_model, tokenizer, 3)
    engine = make_engine(loaded=dataclasses.replace(tiny_loaded, eos_token_ids=(eos,)))
    expected = hf_beams(tiny_model, tokenizer, 16, 4, 4, eos, length_penalty=length_penalty,
                        early_stopping=early_stopping)
    sink = run(engine, beam_request(16, 4, 4, length_penalty=length_penalty,
                                    early_stopping=str(early_stopping).lower()))
    final = sink.final
    assert final.error is None, final.error
    assert [list(s.token_ids) for s in final.sequences] == [row for row, _ in expected]
    assert [s.score for s in final.sequences] == pytest.approx([score for _, score in expected], rel=1e-6)
    if length_penalty <= 0.5:  # a penalty that favours short beams returns some that ended on their own
        assert any(s.token_ids[-1] == eos for s in final.sequences)
    best = final.sequences[0]
    if best.token_ids[-1] == eos:
        assert final.finish_reason is FinishReason.EOS and sink.token_ids == list(best.token_ids)


def test_each_beam_keeps_its_own_constraint_state(make_engine, tiny_loaded, default_model_dir) -> None:  # type: ignore[no-untyped-def]
    from proctor.constraints.compiler import ConstraintCompiler
    from proctor.constraints.service import ConstraintService

    engine = make_engine(start=False)
    engine.constraints = ConstraintService(ConstraintCompiler(
        tokenizer=tiny_loaded.tokenizer, model_path=str(default_model_dir), vocab_size=tiny_loaded.vocab_size,
        eos_token_ids=tiny_loaded.eos_token_ids, tokenizer_fingerprint="tiny", isolate=False))
    engine.start()
    options = ["alpha beta gamma", "alpha delta", "omega"]
    request = dataclasses.replace(beam_request(12, 3, 3),
                                  constraint=ConstraintRequest("choice", options=tuple(options)))
    sink = run(engine, request)
    assert sink.final.error is None, sink.final.error
    texts = [s.text for s in sink.final.sequences]
    assert sink.text in options and all(text in options for text in texts)
    tokens = [s.token_ids for s in sink.final.sequences]
    assert len(set(tokens)) == len(tokens) == 3  # three different beams (the same text may come two ways)
    assert len(set(texts)) > 1


@pytest.mark.parametrize(("changes", "field"), [
    ({"sampling": SamplingParams(num_beams=2, temperature=0.7)}, "sampling.temperature"),
    ({"sampling": SamplingParams(num_beams=2), "num_return_sequences": 3}, "num_return_sequences"),
    ({"sampling": SamplingParams(num_beams=2, repetition_penalty=1.2)}, "sampling"),
    ({"sampling": SamplingParams(num_beams=99)}, "sampling.num_beams"),
    ({"stopping": StoppingParams(max_new_tokens=4, stop=("x",))}, "stopping"),
])
def test_what_beams_do_not_combine_with_is_refused_by_field(changes: dict[str, object], field: str) -> None:
    """Refused by the request check (api/validation.py), before any work; a plain beam request passes it."""
    from proctor.api.validation import validate
    from proctor.config import Settings

    assert validate(beam_request(4, 2), Settings()) == []
    request = dataclasses.replace(beam_request(4, 2), **changes)  # type: ignore[arg-type]
    assert field in [v.field for v in validate(request, Settings())]


def test_beams_share_each_steps_one_forward_and_keep_their_bits(make_engine, tiny_model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """Two searches and plain requests in one batch, with a step budget that splits the prompts: every step is one
    forward over all of them, the searches return what generate() returns, the plain requests what they return
    alone; the shorter search leaves first and the one below it moves up into its slots."""
    def plain(name: str, n: int) -> GenerationRequest:
        return GenerationRequest(request_id=name, prompt=PROMPT + " and", stopping=StoppingParams(max_new_tokens=n))

    solo = {name: run(make_engine(), plain(name, n)).token_ids for name, n in (("p1", 9), ("p2", 20))}
    engine = make_engine(start=False, max_batch_size=8, max_step_tokens=12)
    runner = engine._batch._executor
    forwards: list[list[int]] = []
    real_forward = runner.forward

    def counted(feeds):  # type: ignore[no-untyped-def]
        forwards.append([feed.slot for feed in feeds])
        return real_forward(feeds)

    runner.forward = counted
    sinks = {name: Collector() for name in ("p1", "short", "long", "p2")}
    requests = {"p1": plain("p1", 9), "short": beam_request(5, 4, 2, ignore_eos=True),
                "long": beam_request(14, 2, 2, ignore_eos=True), "p2": plain("p2", 20)}
    for name, req in requests.items():
        engine.submit(engine.prepare(req), sinks[name])
    moved = False
    with torch.inference_mode():
        for _ in range(200):
            before = len(forwards)
            if not engine._step():
                break
            assert len(forwards) == before + 1  # one forward a step, beams and all
            searches = engine._batch.searches
            moved = moved or (len(searches) == 1 and searches[0].num_beams == 2 and searches[0].slots == [6, 7])
    assert all(sink.events and sink.final.finished for sink in sinks.values())
    assert moved  # the two-beam search, below the four-beam one, moved up when that one left
    assert any(max(slots) >= 4 and min(slots) <= 1 for slots in forwards)  # beams beside the plain rows
    for name, n, returned in (("short", 5, 4), ("long", 14, 2)):
        expected = hf_beams(tiny_model, tokenizer, n, returned, 2, None)
        final = sinks[name].final
        assert final.error is None, final.error
        assert [list(s.token_ids) for s in final.sequences] == [row for row, _ in expected]
        assert [s.score for s in final.sequences] == pytest.approx([score for _, score in expected], rel=1e-6)
    assert sinks["p1"].token_ids == solo["p1"] and sinks["p2"].token_ids == solo["p2"]
    assert engine._batch.free_rows() == 8 and engine.admission_counts()["beams"] == 0
