"""Step 1 of the pipeline: every token a row may not produce, as one boolean [B, V] tensor.

Layers, in order (the name of the layer that removed the model's top choice is reported):

1. ``constraint`` — the grammar's allowed set (all rows' bitmasks filled into one tensor);
2. ``forbidden`` — tokens that would complete a forbidden phrase (a cached mask per automaton
   state), plus end-of-sequence/stop tokens when ending now would complete a whole-word phrase;
3. ``allowed_token_ids`` — the request's own allow-list;
4. ``min_new_tokens`` — end-of-sequence tokens until enough tokens were generated.

A row that had tokens left after layer 1 but none after layer 2 is a forbidden-phrase dead end;
the phrase that the best remaining token would have completed is named.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from proctor.constraints.backend import Matcher, allocate_bitmask, bitmask_to_bool, fill_bitmasks
from proctor.decoding import logits_ops
from proctor.decoding.forbidden import ForbiddenTracker


class MaskedRow(Protocol):
    @property
    def matcher(self) -> Matcher | None: ...
    @property
    def forbidden(self) -> ForbiddenTracker | None: ...
    @property
    def allowed_mask(self) -> torch.Tensor | None: ...
    @property
    def last_step(self) -> bool: ...
    def end_token_ids(self) -> tuple[int, ...]: ...
    def banned_token_ids(self) -> tuple[int, ...]: ...


@dataclass(slots=True)
class Masks:
    banned: torch.Tensor | None  # [B, V] bool, None when nothing is masked
    removed_by: list[str]  # per row: the layer that removed the model's top choice, or ""
    forbidden_dead_end: list[str]  # per row: the phrase that left no token, or ""
    allowed_count: list[int]  # per row: tokens the constraint allowed (-1: no constraint)
    constraint_only: bool = False  # only the constraint layer masked: a row is left with nothing iff its count is 0


@dataclass(frozen=True, slots=True)
class ConstraintAhead:
    """The constraint layer of a step's rows ([B, W] bitmasks, as ``constraint_bitmask`` makes them), filled while the
    device ran the forward (``constraints_ahead``), and how long that took."""

    bitmask: torch.Tensor
    seconds: float


def constraints_ahead(rows: Sequence[MaskedRow], vocab: int) -> ConstraintAhead | None:
    """The constraint bitmasks of ``rows`` as their matchers stand, before the step's logits are read: on CUDA the
    forward runs on the device while the host fills them (xgrammar's and vLLM's overlap). None: no row has one."""
    constrained = [index for index, row in enumerate(rows) if row.matcher is not None]
    if not constrained:
        return None
    start = time.perf_counter()
    bitmask = constraint_bitmask(rows, constrained, vocab)
    return ConstraintAhead(bitmask, time.perf_counter() - start)


def build_masks(logits: torch.Tensor, rows: Sequence[MaskedRow], top: list[int],
                ahead: ConstraintAhead | None = None) -> Masks:
    size, vocab = logits.shape
    removed = [""] * size
    dead = [""] * size
    counts = [-1] * size
    constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
    eos_bans = [row.banned_token_ids() for row in rows]
    layered = [i for i, row in enumerate(rows)
               if row.forbidden is not None or row.allowed_mask is not None or eos_bans[i]]
    if not constrained and not layered:
        return Masks(None, removed, dead, counts)
    if constrained:
        bitmask = ahead.bitmask if ahead is not None else constraint_bitmask(rows, constrained, vocab)
        banned, allowed = _unpack(bitmask.to(logits.device), vocab)
        for index in constrained:
            counts[index] = int(allowed[index])
            if banned[index, top[index]]:
                removed[index] = "constraint"
    else:
        banned = torch.zeros((size, vocab), dtype=torch.bool, device=logits.device)
    for index in layered:
        row = rows[index]
        if row.forbidden is not None:
            _forbid(banned, index, row, top, removed, dead, logits)
        if row.allowed_mask is not None:
            banned[index] |= ~row.allowed_mask
            _note(banned, index, top, removed, "allowed_token_ids")
        if eos_bans[index]:
            banned[index, list(eos_bans[index])] = True
            _note(banned, index, top, removed, "min_new_tokens")
    return Masks(banned, removed, dead, counts, constraint_only=not layered)


def constraint_bitmask(rows: Sequence[MaskedRow], constrained: list[int], vocab: int) -> torch.Tensor:
    """The constraint layer as [B, W] int32 bitmasks (bit set: allowed); rows without a constraint allow all."""
    bitmask = allocate_bitmask(len(rows), vocab)
    fill_bitmasks(bitmask, [(matcher, index) for index in constrained if (matcher := rows[index].matcher) is not None])
    return bitmask


def only_constraints(rows: Sequence[MaskedRow]) -> list[int] | None:
    """The rows with a constraint, when that is the only mask layer any row has (else None)."""
    if any(row.forbidden is not None or row.allowed_mask is not None or row.banned_token_ids() for row in rows):
        return None
    return [index for index, row in enumerate(rows) if row.matcher is not None]


def _unpack(bitmask: torch.Tensor, vocab: int) -> tuple[torch.Tensor, list[int]]:
    """Banned tokens [B, V] and each row's allowed count: one pass in the kernel library when it is
    loaded (the same values; ~0.2 ms less a step at one row), PyTorch operations otherwise."""
    unpacked = logits_ops.unpack_banned(bitmask, vocab)
    if unpacked is None:
        banned = ~bitmask_to_bool(bitmask, vocab)
        return banned, (~banned).sum(dim=-1).tolist()
    return unpacked[0], unpacked[1].tolist()


def apply_banned(logits: torch.Tensor, banned: torch.Tensor) -> None:
    """``logits.masked_fill_(banned, -inf)``; on CPU through the q8 kernel library's vectorised loop when
    it is loaded (the same bits; on a [16, 49152] batch here ~0.3 ms against ~3.1 ms)."""
    if not logits_ops.fill_banned(logits, banned):
        logits.masked_fill_(banned, float("-inf"))


def _note(banned: torch.Tensor, index: int, top: list[int], removed: list[str], layer: str) -> None:
    if not removed[index] and bool(banned[index, top[index]]):
        removed[index] = layer


def _forbid(banned: torch.Tensor, index: int, row: MaskedRow, top: list[int], removed: list[str],
            dead: list[str], logits: torch.Tensor) -> None:
    tracker = row.forbidden
    assert tracker is not None
    before = banned[index].clone()
    ban = tracker.banned(row.last_step)  # cached on the CPU; a no-op move there
    banned[index] |= ban.base.to(banned.device, non_blocking=True)
    if ban.extra.numel():
        banned[index, ban.extra.to(banned.device, non_blocking=True)] = True
    ending = tracker.end_blocked()
    if ending is not None:
        banned[index, list(row.end_token_ids())] = True
    _note(banned, index, top, removed, "forbidden")
    if bool(banned[index].all()) and not bool(before.all()):
        candidate = int(logits[index].masked_fill(before, float("-inf")).argmax())
        dead[index] = tracker.would_complete(candidate) or ending or tracker.index.phrases[0]
