"""What GetModelInfo and every audit record say about the loaded model: which weights, which arithmetic (the
revisions a replay is checked against), which device, and whether its rows are batch-invariant."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proctor.config import CLOSING_REVISION, SAMPLER_REVISION, WEIGHT_MODE_REVISIONS

if TYPE_CHECKING:
    from proctor.engine.loaded_model import LoadedModel
    from proctor.executor.plan import ExecutorPlan


def model_info(loaded: LoadedModel, plan: ExecutorPlan) -> dict[str, object]:
    """The ModelInfo fields that describe the loaded model and the executor ``plan`` that serves it."""
    return {
        "model_id": loaded.model_id,
        "runner": plan.description,
        "weights_sha256": loaded.weights_sha256,
        "tokenizer_sha256": loaded.tokenizer_sha256,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "weights": loaded.weights,
        "weights_revision": WEIGHT_MODE_REVISIONS[loaded.weights],
        "sampler_revision": SAMPLER_REVISION,
        "closing_revision": CLOSING_REVISION,
        # The chunk size that changed a prompt's bits (replay refused across sizes). Since weights revisions
        # dense 2, fp16 2, q8 3, q4 2, gguf 3 every prompt position is a row of its own (engine/batch.py), and the
        # per-slot executor feeds prompts whole: no split changes a bit, so 0.
        "prefill_chunk_tokens": 0,
        "device": str(loaded.device),
        # Whether each row's logits were its own bits whatever shared its forward (replay refused across a
        # difference): every executor on the CPU; on CUDA the invariant kernels' (--batch-invariant on).
        "batch_invariant": plan.rows_own_bits,
        "context_length_tokens": loaded.context_length,
        "vocab_size": loaded.vocab_size,
        "eos_token_ids": list(loaded.eos_token_ids),
        "pad_token_id": loaded.pad_token_id,
        "bos_token_id": loaded.bos_token_id,
    }
