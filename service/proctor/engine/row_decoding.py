"""A row's decoding state: what the pipeline reads for one request each step, and what its tokens advance.

This is the pipeline's ``DecodeRow`` (decoding/pipeline.py): the prompt and generated tokens, the masks (the
constraint's matcher, the forbidden-phrase automaton, the allowed ids), the processors (logit bias, plugins, the
generation controls), the penalties, the seeded generator, and the step's sampling view with its settings as a
tensor. Everything that does not change from step to step is built once, when the request's state is made (on the
caller's thread, before it joins the batch): the allowed mask and the logit bias on the device, the end ban, and
``warp_values`` of each sampling view, so a step stacks its rows' settings instead of reading each one anew into
new tensors.

A committed token advances it (``append``): the token-level stop rules (decoding/stopping.py) and the constraint
say whether the output ends. The text side of a token lives in engine/output_processor.py, the budget's in
engine/row_budget.py; engine/sequence.py composes the three.

Generation controls change the row step by step: a forced token makes its step greedy with every other token
removed, the first ``greedy_first_tokens`` are greedy (or at their own temperature), and while a ``must_include``
phrase is missing the end tokens are banned. A request with none of them keeps its sampling and processors fixed
(``controlled`` False) and pays nothing per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from proctor.decoding.controls import EndBan, ForceToken, PhraseTracker
from proctor.decoding.forbidden import ForbiddenTracker
from proctor.decoding.logit_bias import LogitBias
from proctor.decoding.penalties import PenaltyState
from proctor.decoding.pipeline import RowDecision, RowProcessor
from proctor.decoding.stopping import TokenStopRules
from proctor.decoding.warpers import warp_values
from proctor.domain import FinishReason, SamplingParams
from proctor.engine.thought import ThoughtSection
from proctor.engine.thought_gate import ThoughtGate

if TYPE_CHECKING:
    from proctor.constraints.backend import Matcher
    from proctor.engine.preprocess import PreparedRequest

Outcome = tuple[FinishReason | None, str]  # a finish reason (None: it goes on) and its detail


class RowDecoding:
    """One request's row as the pipeline sees it; ``plugin_processors``: its logits-processor plugins, already bound to
    the request (engine/sequence.py guards them)."""

    def __init__(self, prepared: PreparedRequest, *, eos_token_ids: frozenset[int], vocab_size: int,
                 device: torch.device, seed: int, plugin_processors: tuple[RowProcessor, ...] = ()) -> None:
        request = prepared.request
        sampling = request.sampling
        self.prompt_ids = list(prepared.prompt_ids)
        self.generated: list[int] = []
        self.top_logprobs = max(request.top_logprobs, request.audit_top_n, 2 if request.confidence else 0)
        self.generator: torch.Generator | None = None
        if not sampling.greedy:
            # On the CPU whatever the device: one uniform a step (decoding/sampler.py), the same stream on CPU
            # and CUDA for a seed (and the CPU draw refuses a CUDA generator).
            self.generator = torch.Generator()
            self.generator.manual_seed(seed)
        self.penalties = PenaltyState(sampling, self.prompt_ids, vocab_size) if sampling.has_penalties else None
        self.rules = TokenStopRules(
            eos_token_ids=eos_token_ids, stop_token_ids=frozenset(request.stopping.stop_token_ids),
            ignore_eos=request.stopping.ignore_eos, budget=prepared.output_budget,
            repetition=request.stopping.repetition)
        self._eos_tuple = tuple(sorted(eos_token_ids))
        self._end_ids = tuple(sorted(eos_token_ids | frozenset(request.stopping.stop_token_ids)))
        masks = prepared.controls
        self.forbidden = ForbiddenTracker(masks.forbidden) if masks.forbidden is not None else None
        self.allowed_mask = masks.allowed_mask.to(device) if masks.allowed_mask is not None else None
        self.matcher: Matcher | None = prepared.constraint.compiled.new_matcher() if prepared.constraint else None
        # A thinking model's section (engine/thought.py): the constraint starts after it (engine/thought_gate.py).
        self.thought = ThoughtSection(prepared.thought) if prepared.thought is not None else None
        self.in_thought = False  # the last token belonged to the section (its text is the thought's)
        if self.matcher is not None and prepared.thought is not None:
            self.matcher = ThoughtGate(self.matcher, prepared.thought, eos_token_ids, vocab_size)
        bias: tuple[RowProcessor, ...] = ()
        if masks.logit_bias is not None:
            bias = (("logit_bias", LogitBias(*masks.logit_bias).to(device)),)
        self._base_processors = bias + plugin_processors
        self.processors = self._base_processors
        self._forced_steps: list[bool] = []  # which steps the masks decided alone (the repetition stop reads them)
        self.last_forced = False  # whether the masks left its last token the only one (engine/drafting.py)
        self._init_controls(sampling, request.stopping.must_include, device)  # (the end ban lives on the device)
        if prepared.thought is not None:
            self.force(prepared.thought.first_tokens)

    def _init_controls(self, sampling: SamplingParams, must_include: tuple[str, ...], device: torch.device) -> None:
        """The sampling views a step may take, each with its settings tensor made once (on the CPU: a step moves its
        rows' stacked to the device in one copy), and the controls' state."""
        self._forced = dict(sampling.forced_tokens)
        self._greedy_prefix = 0 if sampling.greedy else sampling.greedy_first_tokens
        self._sampling = (sampling, warp_values(sampling))
        self._greedy_view = (SamplingParams(), None) if not sampling.greedy else self._sampling
        # The first tokens' view: greedy, or sampled at their own temperature (a mixed schedule).
        self._prefix_view = self._greedy_view
        if sampling.first_tokens_temperature > 0:
            prefix = dataclasses.replace(sampling, temperature=sampling.first_tokens_temperature)
            self._prefix_view = (prefix, warp_values(prefix))
        self.step_sampling, self.sampling_values = self._sampling
        self.must_include = PhraseTracker(must_include) if must_include else None
        ending = self.rules.stop_token_ids | (frozenset() if self.rules.ignore_eos else self.rules.eos_token_ids)
        self._end_ban = EndBan(sorted(ending), device) if self.must_include is not None and ending else None
        self.forced_now: int | None = None  # the token this step is forced to, if any
        self.controlled = bool(self._forced or self._greedy_prefix or self.must_include is not None)
        if self.controlled:
            self.plan_step()

    def plan_step(self) -> None:
        """The next step's sampling view and processors: a forced step is greedy, a first-tokens step greedy or at
        its own temperature (greedy: the generator draws nothing); the end ban runs while a phrase is missing (not
        on a forced step)."""
        position = len(self.generated)
        forced = self._forced.get(position)
        self.forced_now = forced
        if forced is not None:
            view = self._greedy_view
        else:
            view = self._prefix_view if position < self._greedy_prefix else self._sampling
        self.step_sampling, self.sampling_values = view
        extra: list[tuple[str, Callable[[torch.Tensor], None]]] = []
        if self._end_ban is not None and forced is None and self.must_include is not None and self.must_include.missing:
            extra.append(("must_include", self._end_ban))
        if forced is not None:
            extra.append(("forced_tokens", ForceToken(forced)))
        self.processors = self._base_processors + tuple(extra)

    def end_thought_when_due(self) -> None:
        """Force the end marker when the thought reached its budget (``reasoning.max_tokens``), unless the next
        position is already forced (the closing rule's ending begins with it)."""
        if self.thought is not None and len(self.generated) not in self._forced:
            self.force(self.thought.due())

    def force(self, ending: tuple[int, ...]) -> None:
        """Force ``ending``'s tokens from the next position on (the budget's closing: engine/row_budget.py)."""
        if ending:
            done = len(self.generated)
            self._forced.update(zip(range(done, done + len(ending)), ending, strict=True))
            self.controlled = True
            self.plan_step()

    # --- read by the pipeline and by plugins ------------------------------------------------
    def banned_token_ids(self) -> tuple[int, ...]:
        return self._eos_tuple if self.rules.suppress_eos(len(self.generated)) else ()

    def end_token_ids(self) -> tuple[int, ...]:
        return self._end_ids

    @property
    def last_step(self) -> bool:
        return self.rules.is_last_step(len(self.generated))

    # --- advanced by each committed token ----------------------------------------------------
    def forbidden_phrase(self, token_id: int) -> str | None:
        """Advance the forbidden-phrase automaton; the phrase ``token_id`` would complete (the mask was bypassed:
        it must not be emitted), else None."""
        return self.forbidden.advance(token_id) if self.forbidden is not None else None

    def append(self, decision: RowDecision) -> Outcome:
        """Append the chosen token; the token rules' and the constraint's verdict on it."""
        token_id = decision.token_id
        self.generated.append(token_id)
        if self.thought is not None:
            self.in_thought = self.thought.advance(token_id)
        self.last_forced = decision.allowed_count == 1
        if self.penalties is not None:
            self.penalties.commit(token_id)
        if self.rules.repetition is not None:
            self._forced_steps.append(decision.allowed_count == 1)
        stop = self.rules.check_token(token_id, self.generated, self._forced_steps)
        reason, detail = (stop.reason, stop.detail) if stop is not None else (None, "")
        if self.matcher is not None:
            return self._advance_constraint(token_id, reason, detail)
        return reason, detail

    def _advance_constraint(self, token_id: int, reason: FinishReason | None, detail: str) -> Outcome:
        """Advance the matcher after sampling; a complete constraint ends the request at once."""
        assert self.matcher is not None
        if reason is FinishReason.EOS and self.matcher.can_end():
            return reason, detail
        if not self.matcher.advance(token_id):
            return FinishReason.ERROR, f"the constraint rejected token {token_id} after masking"
        if reason in (None, FinishReason.LENGTH) and self.matcher.must_end():
            return FinishReason.CONSTRAINT_COMPLETE, "the constraint is complete"
        return reason, detail
