"""The executor for architectures the slot forward does not describe, and ``make_executor``, which builds what the
executor plan (plan.py) says.

- ``SlotForward`` (slot_forward.py): one forward for all rows, each row with its own length — the fast
  path, for every family executor/families.py describes, with the plan's strategies.
- ``PerSlotExecutor`` (here): any other causal LM through transformers' own forward, one
  ``DynamicCache`` per slot, the rows run one after another. Correct for every architecture, without the
  batching speed-up (strategies.per_slot_capabilities says what it does not offer).

Both return float32 logits.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import DynamicCache

from proctor.executor.plan import ExecutorKind, ExecutorPlan
from proctor.executor.protocol import Capabilities, Executor, Feed
from proctor.executor.slot_forward import SlotForward
from proctor.executor.strategies import per_slot_capabilities

log = logging.getLogger("proctor.engine")


class PerSlotExecutor:
    def __init__(self, model: Any, max_slots: int, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.max_slots = max_slots
        self._caches: list[DynamicCache | None] = [None] * max_slots
        self.lengths = [0] * max_slots
        cfg = model.config
        layers: int = getattr(cfg, "num_hidden_layers", 1)
        kv_heads: int = getattr(cfg, "num_key_value_heads", 0) or getattr(cfg, "num_attention_heads", 1)
        head_dim: int = getattr(cfg, "head_dim", 0) or cfg.hidden_size // getattr(cfg, "num_attention_heads", 1)
        element = next(model.parameters()).element_size()
        self.bytes_per_token = int(layers * 2 * kv_heads * head_dim * element)

    @property
    def capabilities(self) -> Capabilities:
        return per_slot_capabilities(self.device)

    def bytes_for(self, lengths: Sequence[int]) -> int:
        return sum(lengths) * self.bytes_per_token  # each slot's cache grows with its own tokens

    def forward(self, feeds: Sequence[Feed]) -> torch.Tensor:
        """Each feed through the model's own forward with its slot's cache, one after another."""
        rows = []
        for feed in feeds:
            cache = self._caches[feed.slot]
            if cache is None or self.lengths[feed.slot] == 0:
                cache = self._caches[feed.slot] = DynamicCache()
            ids = torch.tensor([feed.tokens], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=max(1, feed.logits))
            self.lengths[feed.slot] += len(feed.tokens)
            if feed.logits:
                rows.append(cast(torch.Tensor, out.logits[0, -feed.logits:, :].float()))
        return torch.cat(rows)

    def move(self, source: int, target: int) -> None:
        self._caches[target], self._caches[source] = self._caches[source], None
        self.lengths[target], self.lengths[source] = self.lengths[source], 0

    def free(self, slot: int) -> None:
        self._caches[slot] = None
        self.lengths[slot] = 0

    def reorder(self, slots: Sequence[int], parents: Sequence[int]) -> None:
        caches = [copy.deepcopy(self._caches[slots[parent]]) for parent in parents]
        lengths = [self.lengths[slots[parent]] for parent in parents]
        for slot, cache, length in zip(slots, caches, lengths, strict=True):
            self._caches[slot], self.lengths[slot] = cache, length

    def trim(self, slot: int, length: int) -> None:
        if length != self.lengths[slot]:
            raise NotImplementedError("the per-slot executor takes no drafts, so it never trims")

    def read_span(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError("the per-slot executor keeps no spans (capabilities.spans)")

    def write_span(self, slot: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        raise NotImplementedError("the per-slot executor keeps no spans (capabilities.spans)")


def make_executor(plan: ExecutorPlan, model: Any, max_slots: int, calibration_ids: list[int] | None = None) -> Executor:
    """The executor ``plan`` names for ``model``, with ``max_slots`` slots (``calibration_ids``: what q8 weights are
    smoothed on). A plan with a problem is refused: the server stops at start-up on it (app.py)."""
    if plan.problem is not None:
        raise ValueError(plan.problem)
    if plan.kind is ExecutorKind.PER_SLOT:
        log.warning("batched decoding is not available for this model; rows are decoded one by one (%s)",
                    plan.description)
        return PerSlotExecutor(model, max_slots, plan.device)
    return SlotForward(model, max_slots, plan.device, plan.weights, calibration_ids, products=plan.products,
                       replay=plan.replay, largest_bucket=plan.largest_bucket)
