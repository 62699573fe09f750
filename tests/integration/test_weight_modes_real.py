"""Weight modes on the real default model: quality against the dense reference, and what the server reports.

The thresholds are set from the measured figures (bench/weights.py, bench/README.md) with a margin:
fp16 must give dense's greedy outputs and perplexity; q8 may drift, within bounds that catch a
broken quantization (a wrong scale or lost smoothing moves these by multiples).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from helpers.weight_quality import agreement, perplexity

from proctor.config import SAMPLER_REVISION, WEIGHT_MODE_REVISIONS, Settings
from proctor.executor.weights import fbgemm_available
from proctor.models import load_model
from proctor.models.placement import resolve_weights

pytestmark = [pytest.mark.real_model,
              pytest.mark.skipif(not fbgemm_available(), reason="fbgemm needs an x86 CPU with AVX2")]


@pytest.fixture(scope="module")
def dense_loaded(model_dir: Any) -> Any:
    """A private copy of the model (the session server released its own dense weights)."""
    return load_model(Settings.load({"device": "cpu", "dtype": "float32", "weights": "dense", "warmup": False},
                                    environ={}))


def test_fp16_weights_give_the_dense_greedy_outputs_and_perplexity(dense_loaded: Any) -> None:
    model, tokenizer = dense_loaded.model, dense_loaded.tokenizer
    result = agreement(model, tokenizer, "fp16", tokens=32)
    assert result.identical_share == 1.0, result
    dense, fp16 = perplexity(model, tokenizer, "dense"), perplexity(model, tokenizer, "fp16")
    assert abs(fp16 - dense) / dense < 0.005, (dense, fp16)


def test_q8_weights_stay_close_to_dense(dense_loaded: Any) -> None:
    model, tokenizer = dense_loaded.model, dense_loaded.tokenizer
    dense, q8 = perplexity(model, tokenizer, "dense"), perplexity(model, tokenizer, "q8")
    assert abs(q8 - dense) / dense < 0.10, (dense, q8)  # measured 2-7 %; unsmoothed 7-bit: 5-7 %
    result = agreement(model, tokenizer, "q8", tokens=32)
    assert result.mean_tokens_until_divergence >= 3, result


def test_the_server_reports_its_weights_mode_and_records_it(server: Any, client: Any) -> None:
    loaded = server.running.engine.loaded
    info = client.model_info()
    assert info.weights == loaded.weights
    assert loaded.weights == resolve_weights("auto", loaded.device, torch.float32)  # the session server runs auto
    response = client.generate("Hi", max_new_tokens=2)
    record = json.loads(client.audit_record(response.audit_id).record_json)
    assert record["model"]["weights"] == loaded.weights
    assert record["model"]["weights_revision"] == WEIGHT_MODE_REVISIONS[loaded.weights]
    assert record["model"]["sampler_revision"] == info.sampler_revision == SAMPLER_REVISION
    # Every prompt position is a row of the step: no split changes a bit, so no chunk size is recorded for replay.
    assert server.running.settings.prefill_chunk_tokens > 0
    assert record["model"]["prefill_chunk_tokens"] == info.prefill_chunk_tokens == 0
    # On the CPU every row's logits are its own bits whatever shares its forward: said, and recorded for replay.
    assert record["model"]["batch_invariant"] is True and info.batch_invariant
    # The server dropped its dense projection weights once its runner held its own copies.
    assert loaded.model.model.layers[0].mlp.down_proj.weight.numel() == 0
    if loaded.weights == "q4":  # and its embedding table: tokens are looked up in the LM head's blocks
        assert loaded.model.model.embed_tokens.weight.numel() == 0
