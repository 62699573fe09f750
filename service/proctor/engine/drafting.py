"""Drafts: the tokens a running row will likely produce next, verified several to a forward.

A decode step feeds each row its last token and gets one token back. When the next tokens can be guessed,
the engine feeds ``[last, d1 … dk]`` in one forward instead (``SlotForward.forward``: every position the same
bits as a decode step of its own) and verifies the draft position by position with the ordinary pipeline
(engine/verify.py): position ``j``'s logits are processed and sampled only when every earlier draft token
was the token sampled before it. So the tokens, their log-probabilities and the generator's draws are
exactly the stepwise ones, whatever was drafted and whatever else ran; a draft only decides how many
positions one forward computes. For a draft of one token ``d`` this *is* rejection sampling: ``d`` is
kept with probability p(d), otherwise a token is drawn from p without ``d``, by the row's seeded
generator in the same order, so a replay draws the same.

Two sources, forced first:

- **jump-forward**: the tokens the constraint forces (constraints/forced.py: llguidance's own fast-forward,
  else a mask with one allowed token). Almost always kept; on by default (``--no-jump-forward``).
- **prompt lookup** (speculation): the last 3, else 2, tokens matched at their latest earlier occurrence in
  the prompt and the output; the tokens that followed it, cut where a constraint would reject them. Each
  rejected position is a row of compute for nothing, so a row's draft length follows what its verifications
  kept, and ``auto`` speculates while at most ``speculation_max_rows`` rows run (16: bench/fewer_steps.py
  measured it paying at 1 and 16 streams on 2 cores, bench/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from proctor.config import Settings
from proctor.constraints.forced import accepted_prefix, forced_tokens
from proctor.decoding.prompt_lookup import PromptLookup
from proctor.domain.request import Speculation
from proctor.engine.sequence import SequenceState


@dataclass(frozen=True, slots=True)
class DraftPolicy:
    """What may be drafted: the server's settings (config.Settings holds their defaults); a request may turn
    speculation on or off for itself."""

    jump_forward: bool
    max_forced_tokens: int
    speculation: str  # auto | on | off
    speculation_tokens: int
    speculation_max_rows: int

    @classmethod
    def from_settings(cls, settings: Settings) -> DraftPolicy:
        return cls(settings.jump_forward, settings.max_forced_tokens, settings.speculation,
                   settings.speculation_tokens, settings.speculation_max_rows)

    def speculates(self, state: SequenceState, rows: int) -> bool:
        """Whether ``state`` drafts by lookup this step, ``rows`` running (``auto``: while at most
        ``speculation_max_rows`` rows run; beyond, a step is compute-bound and a rejected draft costs the others)."""
        if self.speculation_tokens <= 0:
            return False
        asked = state.request.speculation
        if asked == Speculation.ON or asked == Speculation.OFF:
            return asked == Speculation.ON
        if self.speculation != "auto":
            return self.speculation == "on"
        return rows <= self.speculation_max_rows


class Drafter:
    def __init__(self, policy: DraftPolicy, vocab_size: int) -> None:
        self.policy = policy
        self._vocab_size = vocab_size
        self.drafted = self.accepted = 0  # draft tokens fed and kept since start (metrics)
        self._looked_up: set[int] = set()  # id() of the rows whose latest draft was looked up (not forced)

    def drafts(self, states: list[SequenceState]) -> list[list[int]]:
        """Each running row's draft (empty: a plain decode step for it): proposals the step plan schedules
        within its budget (engine/scheduler.py)."""
        self._looked_up = set()
        return [self.draft(state, len(states)) for state in states]

    def learn(self, states: list[SequenceState], drafts: list[list[int]], kept: list[int]) -> None:
        """After a verification: the totals; and a row whose looked-up draft was kept whole may draft one more
        token next time (up to ``speculation_tokens``), one that lost any drafts one fewer (at least one), as
        Hugging Face's assisted generation schedules its draft length. Each rejected position is a row of
        compute for nothing (a row costs about a third of a one-row step here: bench/README.md)."""
        for state, draft, keep in zip(states, drafts, kept, strict=True):
            self.drafted, self.accepted = self.drafted + len(draft), self.accepted + keep - 1
            if id(state) in self._looked_up and draft:
                whole = keep - 1 == len(draft)
                state.lookup_limit = min(self.policy.speculation_tokens, state.lookup_limit + 1) if whole \
                    else max(1, state.lookup_limit - 1)

    def draft(self, state: SequenceState, rows: int) -> list[int]:
        room = state.output_budget.draft_room(len(state.generated))
        if room <= 0 or state.finished:
            return []
        policy, matcher = self.policy, state.matcher
        closing = state.closing_draft(room) if policy.jump_forward else []
        if closing:  # the budget's ending (engine/closing.py): forced, so kept whole
            return closing
        # An engine without its own forced-token API is asked through its mask: one fill more a step, so only
        # after a step the mask forced (forced runs come together; the run's first token is a step of its own).
        if policy.jump_forward and matcher is not None and (state.last_forced or hasattr(matcher, "forced_tokens")):
            forced = forced_tokens(matcher, min(room, policy.max_forced_tokens), self._vocab_size)
            if forced:
                return forced
        if not policy.speculates(state, rows):
            return []
        if state.lookup is None:
            state.lookup, state.lookup_limit = PromptLookup(state.prompt_ids), policy.speculation_tokens
        drafted = state.lookup.draft(state.generated, min(room, state.lookup_limit))
        if drafted and matcher is not None:
            drafted = accepted_prefix(matcher, drafted, self._vocab_size)
        if drafted:
            self._looked_up.add(id(state))
        return drafted
