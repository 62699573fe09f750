"""The engine fills a step's constraint bitmasks after it launched the forward and before it reads the logits
(engine.py ``_update``, decoding/masks.py ``constraints_ahead``): on CUDA the host's mask work then runs
while the device computes, as xgrammar's overlap does in vLLM and SGLang. Checked here by the order of the calls
on the CPU, where the forward returns only when done (so the order is the evidence, not the time)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.engine import Collector

from proctor.constraints.compiler import ConstraintCompiler
from proctor.constraints.service import ConstraintService
from proctor.domain import ConstraintRequest, GenerationRequest, StoppingParams


@pytest.fixture
def constrained(make_engine, tiny_loaded, default_model_dir: Path):  # type: ignore[no-untyped-def]
    compiler = ConstraintCompiler(tokenizer=tiny_loaded.tokenizer, model_path=str(default_model_dir),
                                  vocab_size=tiny_loaded.vocab_size, eos_token_ids=tiny_loaded.eos_token_ids,
                                  tokenizer_fingerprint="tiny", isolate=False)
    built = make_engine(start=False, jump_forward=False, speculation="off")  # one position a row: no later rounds
    built.constraints = ConstraintService(compiler)
    return built


def test_each_steps_masks_are_filled_between_the_forward_and_the_sampling_once(constrained, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from proctor.decoding import masks
    from proctor.engine import batch, verify
    from proctor.engine import step as stepping

    calls: list[str] = []

    def logged(name: str, function):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(name)
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(batch.DecodeBatch, "forward", logged("forward", batch.DecodeBatch.forward))
    monkeypatch.setattr(masks, "fill_bitmasks", logged("fill", masks.fill_bitmasks))
    monkeypatch.setattr(verify, "run_pipeline", logged("sample", verify.run_pipeline))
    monkeypatch.setattr(stepping, "run_pipeline", logged("sample", stepping.run_pipeline))
    constrained.start()
    digits = ConstraintRequest("regex", text="[0-9]{6}")
    sinks = [Collector() for _ in range(2)]
    for index, sink in enumerate(sinks):
        request = GenerationRequest(f"ahead{index}", prompt="Count: 1 2 3", constraint=digits,
                                    stopping=StoppingParams(max_new_tokens=6))
        constrained.submit(constrained.prepare(request), sink)
    for sink in sinks:
        sink.wait(120)
        assert sink.final.error is None and sink.text.isdigit() and len(sink.text) >= 1, sink.final
    steps: list[list[str]] = []
    for name in calls:
        if name == "forward":
            steps.append([])
        elif steps:
            steps[-1].append(name)
    sampled = [step for step in steps if "sample" in step]
    assert len(sampled) >= 6
    for step in sampled:  # every row of these steps has a constraint: its masks come first, filled once a group
        assert step[0] == "fill" and "fill" not in step[step.index("sample"):], steps
