"""The executor seam: what the engine asks of whatever runs the model (``forward(feeds)``), and what it may ask.

The engine (scheduler, step, request state) decides what every row is fed this step; an executor owns the
weights, the kernels, the family's arithmetic and the KV cache as slots, and runs one forward over all the
feeds. It declares what it can do in ``Capabilities`` instead of being asked what class it is, so a new runner
plugs in by saying what it offers (which one serves is the executor plan's to say: plan.py):

- ``SlotForward`` (slot_forward.py): every family executor/families.py describes, every position a row of its own,
  with its strategies (strategies.py);
- ``PerSlotExecutor`` (model_runner.py): any other causal LM through transformers' forward, row by row.

A ``Feed`` is one row's tokens for this step, appended at its slot's current length: a piece of its prompt, its
last token, or its last token and a draft. ``logits`` says how many of its last positions the update needs
(0 for a piece of a prompt that goes on next step), so the forward computes the LM head only for those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True, slots=True)
class Feed:
    slot: int
    tokens: list[int]
    logits: int  # the last ``logits`` positions' logits are returned (0 … len(tokens))


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an executor offers the step.

    ``extend``: a row may be fed several tokens at once with every position's logits the bits a one-token
    step gives (drafts and jump-forward are verified only then). ``split_prompts``: a prompt may be fed in
    pieces of any size, beside any other rows, with the same bits as whole (else each prompt is fed whole, in
    one step). ``spans``: the slots' keys and values can be read and written (the prefix cache).
    ``rows_own_bits``: a row's logits never depend on what else shares the forward. ``thread_invariant``:
    nor on the intra-op thread count (the engine may tune it under load)."""

    device: torch.device
    extend: bool
    split_prompts: bool
    spans: bool
    rows_own_bits: bool
    thread_invariant: bool


class Executor(Protocol):
    """The model behind the step, its KV cache as ``max_slots`` slots (each with its own length)."""

    max_slots: int
    bytes_per_token: int
    lengths: list[int]  # tokens each slot holds

    @property
    def capabilities(self) -> Capabilities: ...

    def forward(self, feeds: Sequence[Feed]) -> torch.Tensor:
        """Append each feed's tokens to its slot in one forward; the wanted positions' float32 logits, feed
        after feed ([sum of ``logits``, V])."""
        ...

    def move(self, source: int, target: int) -> None: ...

    def free(self, slot: int) -> None: ...

    def reorder(self, slots: Sequence[int], parents: Sequence[int]) -> None:
        """Slot ``slots[i]`` takes the cache of slot ``slots[parents[i]]`` (a beam search's beams follow their
        parents)."""
        ...

    def trim(self, slot: int, length: int) -> None:
        """Keep the first ``length`` positions of ``slot`` (a draft's rejected positions go)."""
        ...

    def bytes_for(self, lengths: Sequence[int]) -> int:
        """The cache's resident bytes once its slots hold ``lengths`` tokens (admission under ``--kv-cache-mb``)."""
        ...

    def read_span(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def write_span(self, slot: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None: ...

