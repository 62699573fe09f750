"""The running batch and its KV cache: the only module that indexes the cache by batch position.

Prompts of a group are left-padded together and prefilled in one forward pass; each decode step
feeds one token per row. Finished rows are dropped by selecting cache rows. A single unpadded
row skips the attention mask and position ids entirely (the common batch-1 case, cheapest path).
Merging new prompts into a running batch (continuous batching) extends this module later.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from proctor.engine.model_runner import ModelRunner
from proctor.engine.sequence import SequenceState


class DecodeBatch:
    def __init__(self, runner: ModelRunner, pad_token_id: int) -> None:
        self._runner = runner
        self._pad = pad_token_id
        self.states: list[SequenceState] = []
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # [B, L] 1 = real token; None = no padding anywhere
        self._next_pos: torch.Tensor | None = None  # [B] position id of the next token

    def __len__(self) -> int:
        return len(self.states)

    def prefill(self, states: list[SequenceState]) -> torch.Tensor:
        """Start a new batch from these sequences; return their next-token logits [B, V]."""
        device = self._runner.device
        self.states = list(states)
        self._cache = DynamicCache()
        lengths = [len(s.prompt_ids) for s in states]
        width = max(lengths)
        ids = torch.full((len(states), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(states), width), dtype=torch.long)
        for row, s in enumerate(states):
            ids[row, width - lengths[row]:] = torch.tensor(s.prompt_ids)
            mask[row, width - lengths[row]:] = 1
        self._next_pos = torch.tensor(lengths, device=device)
        if min(lengths) == width:
            self._mask = None
            return self._runner.forward(ids.to(device), self._cache, None, None)
        self._mask = mask.to(device)
        positions = (self._mask.cumsum(-1) - 1).clamp(min=0)
        return self._runner.forward(ids.to(device), self._cache, self._mask, positions)

    def decode(self, token_ids: list[int]) -> torch.Tensor:
        """Feed one new token per row (in ``states`` order); return the next logits [B, V]."""
        device = self._runner.device
        ids = torch.tensor(token_ids, dtype=torch.long, device=device).unsqueeze(-1)
        assert self._next_pos is not None
        if self._mask is None:
            logits = self._runner.forward(ids, self._cache, None, None)
        else:
            self._mask = torch.cat([self._mask, self._mask.new_ones((len(token_ids), 1))], dim=-1)
            logits = self._runner.forward(ids, self._cache, self._mask, self._next_pos.unsqueeze(-1))
        self._next_pos = self._next_pos + 1
        return logits

    def keep(self, keep_rows: list[int]) -> None:
        """Drop every row not listed, freeing its slice of the KV cache."""
        if len(keep_rows) == len(self.states):
            return
        self.states = [self.states[i] for i in keep_rows]
        if not keep_rows:
            self.clear()
            return
        device = self._runner.device
        index = torch.tensor(keep_rows, dtype=torch.long, device=device)
        assert self._cache is not None and self._next_pos is not None
        self._cache.batch_select_indices(index)
        self._next_pos = self._next_pos.index_select(0, index)
        if self._mask is not None:
            self._mask = self._mask.index_select(0, index)

    def clear(self) -> None:
        self.states = []
        self._cache = None
        self._mask = None
        self._next_pos = None
