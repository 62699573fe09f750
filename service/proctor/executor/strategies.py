"""The slot forward's strategies and what each offers: which products a step multiplies with, and how it runs.

- **products**: ``kernels`` — the C++ layer step (``kernels/``: q8, q4 and gguf weights, families.decodes_fused);
  ``library`` — PyTorch's operations (oneDNN, fbgemm or MKL on the CPU, cuBLAS on CUDA); ``invariant`` — the Triton
  kernels of invariant_kernels.py, one reduction order whatever the batch.
- **replay**: ``eager`` — each step's operations launched as they come; ``graphs`` — steps padded to row buckets
  and replayed as CUDA graphs (graph_step.py). Both Triton strategies (``invariant`` products, ``graphs``) compute
  the step as tensors in and out with Triton's attention (triton_step.py); ``graphs`` takes ``invariant`` or
  ``library`` products.

Why here, apart from the executors and the plan: the executors say what they offer from these functions, and the
plan (plan.py) predicts it from the same functions before anything is built, so the two cannot disagree.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

import torch

from proctor.executor.families import Family, decodes_fused, describe, unsupported_reason
from proctor.executor.protocol import Capabilities

Products = Literal["kernels", "library", "invariant"]
Replay = Literal["eager", "graphs"]
Step = Callable[[], torch.Tensor]  # a step over one bucket's static buffers (graph_step.py): its logits buffer
Capture = Callable[[Step], Step]  # a step → a replay of it (CUDA graphs on CUDA; tests count captures)


def slot_products(family: Family, weights: str) -> Products:
    """The eager slot forward's products in ``weights`` mode: the C++ layer step where it computes the family."""
    return "kernels" if decodes_fused(family, weights) else "library"


def triton_step_problem(model: Any, weights: str) -> str | None:
    """Why the Triton step (triton_step.py, under both ``invariant`` products and ``graphs``) cannot serve ``model``
    in ``weights`` mode (None: it can): it computes Llama's arithmetic with the model's own dense matrices, heads of a
    power-of-two size."""
    reason = unsupported_reason(model)
    if reason is not None:
        return f"the slot forward does not serve this model ({reason})"
    family = describe(model.config)
    if not family.plain:
        return (f"it computes Llama's arithmetic exactly; {family.name} differs (biases, norms, windows or "
                "softcaps the kernels do not take yet)")
    if family.head_dim & (family.head_dim - 1):
        return f"its attention takes head sizes that are powers of two, not {family.head_dim}"
    if weights != "dense":
        return f"it multiplies the model's own matrices (--weights dense), not --weights {weights}"
    if importlib.util.find_spec("triton") is None:
        return "triton, which compiles its kernels, is not installed"
    return None


def strategy_problem(model: Any, family: Family, weights: str, products: Products, replay: Replay) -> str | None:
    """Why the slot forward cannot run ``model`` in ``weights`` mode with these strategies (None: it can)."""
    if products == "kernels":
        if replay != "eager":
            return "the C++ layer step is not replayed as graphs (the graphed step is the Triton step)"
        if not decodes_fused(family, weights):
            return f"the C++ layer step does not compute {family.name} in --weights {weights}"
        return None
    if products == "invariant" or replay == "graphs":
        problem = triton_step_problem(model, weights)
        return None if problem is None else f"the Triton step cannot serve this model: {problem}"
    return None


def slot_capabilities(device: torch.device, products: Products, replay: Replay) -> Capabilities:
    """What the slot forward offers with these strategies on ``device``. A row's bits are its own with the invariant
    kernels anywhere, and eagerly on the CPU, where every product, norm and attention takes each row through the same
    operations whatever is beside it (slot_forward.py); on CUDA the libraries pick their kernels by the batch's shape
    (measured on a lent H200: a request alone and among 16 diverged at token 20), so nothing promises it there, nor
    with the library's products on plain matrices under the Triton step. Drafts only where the bits are a row's own.
    ``thread_invariant`` is what the strategies allow: the eager library and kernel products also need their weights
    packed for oneDNN or fbgemm (weights.py), which only building them tells (``built_capabilities``)."""
    own = products == "invariant" or (replay == "eager" and device.type == "cpu")
    return Capabilities(device=device, extend=own, split_prompts=True, spans=True, rows_own_bits=own,
                        thread_invariant=own)


def built_capabilities(offered: Capabilities, products: Products, weights_thread_invariant: bool) -> Capabilities:
    """``offered`` once the weights are built: a row keeps its bits at any thread count only where the products'
    weights do (the invariant kernels read the model's own matrices and always do)."""
    if products == "invariant":
        return offered
    return replace(offered, thread_invariant=offered.thread_invariant and weights_thread_invariant)


def per_slot_capabilities(device: torch.device) -> Capabilities:
    """transformers' own forward, one row after another (model_runner.PerSlotExecutor): each row alone, so its bits are
    its own; a prompt fed whole (its prefill computes a prompt split in pieces differently); no drafts (a position of
    a multi-token feed is not the bits of a one-token step); no spans to keep (its caches are transformers')."""
    return Capabilities(device=device, extend=False, split_prompts=False, spans=False, rows_own_bits=True,
                        thread_invariant=False)
