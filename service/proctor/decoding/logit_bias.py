"""The request's ``logit_bias``: added to the logits; a bias of -100 bans the token outright.

(-100 as a ban is what callers of other APIs expect: a finite -100 can still win after
temperature or when every other token is masked.)
"""

from __future__ import annotations

import torch

BAN = -100.0


class LogitBias:
    def __init__(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        banned = values <= BAN
        self._ids, self._values = ids[~banned], values[~banned]
        self._banned = ids[banned]

    def __call__(self, row: torch.Tensor) -> None:
        if self._ids.numel():
            row.index_add_(0, self._ids, self._values.to(row.dtype))
        if self._banned.numel():
            row[self._banned] = float("-inf")

    def to(self, device: torch.device) -> LogitBias:
        moved = LogitBias.__new__(LogitBias)
        moved._ids, moved._values, moved._banned = (t.to(device) for t in (self._ids, self._values, self._banned))
        return moved
