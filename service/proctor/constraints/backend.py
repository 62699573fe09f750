"""The one small protocol every constraint engine adapter implements (rule 5 of DESIGN.md).

Three tiers: a ``Backend`` is built once per model (it holds the engine's tokenizer info); it
compiles a ``ConstraintSpec`` into a ``CompiledConstraint`` that is cached and shared; each request
gets its own ``Matcher`` from it. Compiled constraints serialize to bytes so compilation can run
in a separate process (interruptible under a time limit) and the result be loaded here.

Masks are int32 bitmasks, 32 tokens per word, bit ``i % 32`` of word ``i // 32`` set when token
``i`` is allowed (the layout xgrammar and llguidance share); EOS bits are set only when the
constraint may end there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from proctor.constraints.spec import ConstraintSpec


class Matcher(Protocol):
    """Per-request constraint state; advanced by the engine after sampling (never from input_ids)."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed-token bitmask into ``bitmask[row]`` (int32, shape [B, ceil(V/32)])."""

    def advance(self, token_id: int) -> bool:
        """Consume a sampled token; False if the constraint rejects it (a bug: masks prevent it)."""

    def can_end(self) -> bool:
        """The output so far is complete: end-of-sequence is allowed now."""

    def must_end(self) -> bool:
        """Nothing but the end is allowed: the request ends now (CONSTRAINT_COMPLETE)."""

    def rollback(self, tokens: int) -> None:
        """Undo the last ``tokens`` advances (the forbidden-phrase lookahead tries tokens, then undoes them)."""


class CompiledConstraint(Protocol):
    backend: str
    spec: ConstraintSpec

    def new_matcher(self) -> Matcher: ...

    def to_bytes(self) -> bytes:
        """Serialize (to move a compile result from the compile process into the server)."""

    def memory_bytes(self) -> int:
        """Approximate size, for the cache's memory bound."""


class Backend(Protocol):
    """A constraint engine bound to one model's tokenizer (built once per model)."""

    name: str

    def compile(self, spec: ConstraintSpec) -> CompiledConstraint:
        """Compile or raise ConstraintError naming the reason."""

    def load(self, spec: ConstraintSpec, data: bytes) -> CompiledConstraint:
        """Rebuild a compiled constraint from ``CompiledConstraint.to_bytes``."""


FillTogether = Callable[[torch.Tensor, list[tuple[Matcher, int]]], None]  # a matcher class's batch fill


def fill_bitmasks(bitmask: torch.Tensor, pairs: list[tuple[Matcher, int]]) -> None:
    """``matcher.fill_bitmask(bitmask, row)`` for every pair; matchers whose class can fill several rows
    at once (``fill_together``: llguidance, on its own threads) do so, the rest one by one."""
    together: dict[FillTogether, list[tuple[Matcher, int]]] = {}
    for matcher, row in pairs:
        fill: FillTogether | None = getattr(type(matcher), "fill_together", None)
        if fill is not None:
            together.setdefault(fill, []).append((matcher, row))
        else:
            matcher.fill_bitmask(bitmask, row)
    for fill_rows, group in together.items():
        fill_rows(bitmask, group)


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack [B, W] int32 bitmasks into a [B, V] bool tensor of allowed tokens."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
