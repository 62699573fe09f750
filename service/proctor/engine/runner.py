"""The executor a server's engine runs: chosen from the loaded model and the settings (executor/model_runner.py)."""

from __future__ import annotations

import logging

from proctor.config import Settings
from proctor.engine.loaded_model import LoadedModel
from proctor.executor.model_runner import make_runner
from proctor.executor.protocol import Executor
from proctor.executor.slot_weights import release_dense
from proctor.executor.smoothing import calibration_ids

log = logging.getLogger("proctor.engine")


def build_runner(loaded: LoadedModel, settings: Settings, rows: int, release_dense_weights: bool) -> Executor:
    """The slot runner in the loaded weights mode; with ``release_dense_weights`` (a server's own model) the model's
    dense projections are dropped once the runner holds its copies."""
    calibration = calibration_ids(loaded.tokenizer) if loaded.weights == "q8" else None
    runner = make_runner(loaded.model, rows, loaded.device, loaded.weights, calibration, settings.batch_invariant,
                         settings.cuda_graphs, settings.max_step_tokens)
    if release_dense_weights:  # a no-op unless the runner built slot weights of its own (slot_weights.py)
        freed = release_dense(loaded.model)
        if freed:
            log.info("weights %s: %.0f MB of dense projection weights released", loaded.weights, freed / 2**20)
    return runner
