"""The model forward pass: token ids in, last-position float32 logits out, KV cache reused."""

from __future__ import annotations

from typing import Any

import torch


class ModelRunner:
    def __init__(self, model: Any, device: torch.device) -> None:
        self.model = model
        self.device = device

    def forward(self, input_ids: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None) -> torch.Tensor:
        """Run one forward pass and return logits [B, V] (float32) of the last position only.

        The caller (the engine thread) runs under ``torch.inference_mode``."""
        out = self.model(input_ids=input_ids, cache=cache, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()
