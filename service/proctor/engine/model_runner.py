"""Slot runners: the model forward behind continuous batching.

A runner owns the KV cache as ``max_slots`` slots. A request's prompt is prefilled into a free slot;
each decode step feeds one token to every slot ``0..B-1`` at once; when a request leaves, the
last slot moves into its hole (so the running rows are always ``0..B-1``). Two implementations:

- ``LlamaSlots`` (llama_step.py): one batched forward for all rows, each row with its own length —
  the fast path, for every family engine/families.py describes.
- ``PerSlotRunner`` (here): any other causal LM through transformers' own forward, one
  ``DynamicCache`` per slot, decoding the rows one after another. Correct for every architecture,
  without the batching speed-up.

Both return float32 logits of the last position, and a row's logits never depend on the other rows.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, cast

import torch
from transformers import DynamicCache

from proctor.engine.families import unsupported_reason
from proctor.engine.llama_step import LlamaSlots

log = logging.getLogger("proctor.engine")


class SlotRunner(Protocol):
    max_slots: int

    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor: ...

    def decode(self, token_ids: list[int]) -> torch.Tensor: ...

    def move(self, source: int, target: int) -> None: ...

    def free(self, slot: int) -> None: ...

    def bytes_for(self, rows: int, length: int) -> int: ...


class PerSlotRunner:
    def __init__(self, model: Any, max_slots: int, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.max_slots = max_slots
        self._caches: list[DynamicCache | None] = [None] * max_slots
        cfg = model.config
        layers: int = getattr(cfg, "num_hidden_layers", 1)
        kv_heads: int = getattr(cfg, "num_key_value_heads", 0) or getattr(cfg, "num_attention_heads", 1)
        head_dim: int = getattr(cfg, "head_dim", 0) or cfg.hidden_size // getattr(cfg, "num_attention_heads", 1)
        element = next(model.parameters()).element_size()
        self.bytes_per_token = int(layers * 2 * kv_heads * head_dim * element)

    def bytes_for(self, rows: int, length: int) -> int:
        return rows * length * self.bytes_per_token

    def prefill(self, slot: int, token_ids: list[int]) -> torch.Tensor:
        cache = DynamicCache()
        self._caches[slot] = cache
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        return self._forward(ids, cache)

    def decode(self, token_ids: list[int]) -> torch.Tensor:
        rows = []
        for slot, token in enumerate(token_ids):
            cache = self._caches[slot]
            assert cache is not None, f"slot {slot} was never prefilled"
            rows.append(self._forward(torch.tensor([[token]], dtype=torch.long, device=self.device), cache))
        return torch.cat(rows)

    def move(self, source: int, target: int) -> None:
        self._caches[target], self._caches[source] = self._caches[source], None

    def free(self, slot: int) -> None:
        self._caches[slot] = None

    def _forward(self, ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return cast(torch.Tensor, out.logits[:, -1, :].float())


def make_runner(model: Any, max_slots: int, device: torch.device, weights: str = "dense",
                calibration_ids: list[int] | None = None) -> SlotRunner:
    """The fast slot forward when the architecture allows it, else the generic per-slot runner
    (which runs the model's own dense weights whatever ``weights`` says)."""
    reason = unsupported_reason(model)
    if reason is None:
        return LlamaSlots(model, max_slots, device, weights, calibration_ids)
    log.warning("batched decoding is not available for this model (%s); rows are decoded one by one%s", reason,
                "" if weights == "dense" else f", with dense weights (not {weights})")
    return PerSlotRunner(model, max_slots, device)

