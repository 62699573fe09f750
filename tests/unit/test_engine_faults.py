"""An engine that cannot step answers its waiting requests with the fault instead of holding them forever (found in
issue 56: a model whose vocabulary is not a multiple of 8 cannot be served with --weights q4, and the executor's build
failed at every step while the request waited)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from helpers.engine import Collector
from helpers.thinking import thinking_loaded

from proctor.domain import FinishReason, GenerationRequest, StoppingParams


def test_a_request_waiting_on_an_engine_that_cannot_step_ends_with_the_fault(make_engine: Any,
                                                                          default_model_dir: Path) -> None:
    from proctor.executor.fused_decode import load_problem

    assert load_problem() is None  # the kernels built first (once), so the wait below is the engine's alone
    loaded = thinking_loaded(default_model_dir, "model_opens", 256)
    loaded.model.resize_token_embeddings(loaded.vocab_size - 5)  # 49155 rows: q4 blocks need a multiple of 8
    loaded = dataclasses.replace(loaded, vocab_size=loaded.vocab_size - 5, weights="q4")
    engine = make_engine(loaded=loaded)
    sink = Collector()
    engine.submit(engine.prepare(GenerationRequest(request_id="stuck", prompt="Hello",
                                                   stopping=StoppingParams(max_new_tokens=4))), sink)
    final = sink.wait(30)[-1]
    assert final.finish_reason is FinishReason.ERROR
    assert final.error is not None and "multiples of 8" in final.error
    assert not engine.healthy
