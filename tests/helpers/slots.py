"""Feeding an executor the way the engine does, in the shapes tests ask for: each prompt into a slot of its own,
then one token a slot a step (``Executor.forward``: every feed's tokens in one forward)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from proctor.executor.protocol import Executor, Feed


def feed_prompt(runner: Executor, slot: int, ids: Sequence[int], every_position: bool = False) -> torch.Tensor:
    """``ids`` into ``slot`` in one forward; the last position's logits [1, V] (or every position's, [T, V])."""
    return runner.forward([Feed(slot, list(ids), len(ids) if every_position else 1)])


def feed_prompts(runner: Executor, rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Prompt ``i`` into slot ``i``, a forward each; each prompt's last position's logits [len(rows), V]."""
    return torch.cat([feed_prompt(runner, slot, ids) for slot, ids in enumerate(rows)])


def feed_step(runner: Executor, tokens: Sequence[int]) -> torch.Tensor:
    """Token ``i`` to slot ``i`` for every ``i < len(tokens)``, in one forward; their logits [len(tokens), V]."""
    return runner.forward([Feed(slot, [token], 1) for slot, token in enumerate(tokens)])
