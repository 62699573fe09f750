"""Verifying drafts: the pipeline run position by position over one extended forward (engine/drafting.py).

Round 0 is an ordinary decode step: every row's first fed position (its last token) is processed, sampled
and committed. Round ``j`` then takes the rows whose draft token ``j - 1`` was the token just sampled, and
processes, samples and commits their position ``j``: the same logits (SlotForward.forward), the same state
and the same generator draws as the ``j``-th step of the stepwise path. A row leaves the rounds at its
first mismatch, when it finishes, or at the end of its draft (whose last position still gives one token).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from proctor.decoding.masks import ConstraintAhead
from proctor.decoding.pipeline import run_pipeline
from proctor.engine.sequence import SequenceState

MasksObserver = Callable[[float, list[str]], None]


def verify(states: list[SequenceState], drafts: list[list[int]], logits: torch.Tensor, now: Callable[[], float],
           on_masks: MasksObserver | None = None, ahead: ConstraintAhead | None = None) -> list[int]:
    """Commit each row's verified tokens; return how many fed positions each row keeps in its cache. ``ahead``: the
    rows' constraint bitmasks as they stand before round 0 (filled while the forward ran)."""
    first = [0]
    for draft in drafts:
        first.append(first[-1] + 1 + len(draft))
    kept = [0] * len(states)
    for state, draft in zip(states, drafts, strict=True):  # counted before any commit: the last one reports them
        state.decode_steps += 1
        state.drafted += len(draft)
    active = list(range(len(states)))
    position = 0
    while active:
        if first[-1] == len(states):  # no drafts: a plain decode step, its logits as they are
            picked = logits
        else:
            rows = torch.tensor([first[i] + position for i in active], dtype=torch.long, device=logits.device)
            picked = logits.index_select(0, rows)
        decisions = run_pipeline(picked, [states[i].row for i in active], on_masks, ahead if position == 0 else None)
        at = now()
        for i, decision in zip(active, decisions, strict=True):
            kept[i] += 1
            states[i].accepted += int(position > 0)  # this position's input was a draft token, sampled before it
            states[i].commit(decision, at)
        position += 1
        active = [i for i in active if position <= len(drafts[i]) and not states[i].finished
                  and states[i].generated[-1] == drafts[i][position - 1]]
    return kept
