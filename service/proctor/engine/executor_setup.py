"""The executor a server's engine runs: the plan made from the loaded model and the settings (executor/plan.py),
and the runner built from it (executor/build.py)."""

from __future__ import annotations

import logging

from proctor.config import Settings
from proctor.engine.loaded_model import LoadedModel
from proctor.executor.build import make_executor
from proctor.executor.plan import ExecutorPlan, executor_plan
from proctor.executor.protocol import Executor
from proctor.executor.slot_weights import release_dense
from proctor.executor.smoothing import calibration_ids

log = logging.getLogger("proctor.engine")


def plan_for(loaded: LoadedModel, settings: Settings) -> ExecutorPlan:
    """The executor plan for ``loaded`` under ``settings``: the one place the settings become the plan's flags.

    Its home is the engine (``Engine.plan``), made once: the engine holds both things the plan is made of and runs
    the executor it names. Not ``LoadedModel``: that is what models/ loaded, whatever the flags (tests run one
    loaded model under several engines' settings)."""
    return executor_plan(loaded.model, loaded.device, loaded.weights, asked_weights=settings.weights,
                         batch_invariant=settings.batch_invariant, cuda_graphs=settings.cuda_graphs,
                         step_tokens=settings.max_step_tokens)


def build_executor(loaded: LoadedModel, plan: ExecutorPlan, rows: int, release_dense_weights: bool) -> Executor:
    """The runner ``plan`` names, with ``rows`` slots; with ``release_dense_weights`` (a server's own model) the
    model's dense projections are dropped once the runner holds its copies."""
    calibration = calibration_ids(loaded.tokenizer) if plan.weights == "q8" else None
    runner = make_executor(plan, loaded.model, rows, calibration)
    if release_dense_weights:  # a no-op unless the runner built slot weights of its own (slot_weights.py)
        freed = release_dense(loaded.model)
        if freed:
            log.info("weights %s: %.0f MB of dense projection weights released", plan.weights, freed / 2**20)
    return runner
