"""All mutable decode state of one request lives here (rule 2 of DESIGN.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from proctor.constraints.backend import Matcher
from proctor.decoding.controls import ConfidenceStats, EndBan, ForceToken, PhraseTracker
from proctor.decoding.forbidden import ForbiddenTracker
from proctor.decoding.logit_bias import LogitBias
from proctor.decoding.penalties import PenaltyState
from proctor.decoding.pipeline import RowDecision
from proctor.decoding.prompt_lookup import PromptLookup
from proctor.decoding.stop_strings import StopStringMatcher
from proctor.decoding.stopping import TokenStopRules, check_external
from proctor.domain import (
    FinishReason,
    ReturnedSequence,
    SamplingParams,
    SchemaCheck,
    TokenAlternative,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.events import Timings, Usage
from proctor.engine.budget import BudgetRule
from proctor.engine.detokenizer import IncrementalDetokenizer, text_decoder
from proctor.engine.preprocess import PreparedRequest
from proctor.engine.status import RequestStatus, status_after

EventSink = Callable[[TokenEvent], None]
log = logging.getLogger("proctor.engine")
# Finish reasons after which the constrained structure may be incomplete.
UNFINISHED = frozenset({FinishReason.LENGTH, FinishReason.DEADLINE, FinishReason.CANCELLED,
                        FinishReason.DEAD_END, FinishReason.ERROR, FinishReason.FORBIDDEN_PHRASE,
                        FinishReason.REPETITION, FinishReason.STOP_CRITERION})


class SequenceState:
    """Tokens, detokenizer, stop state, penalties, RNG and timings of one request."""

    def __init__(self, prepared: PreparedRequest, *, tokenizer: Any, eos_token_ids: frozenset[int],
                 pieces: dict[int, str] | None = None,
                 vocab_size: int, device: torch.device, seed: int, sink: EventSink) -> None:
        request = prepared.request
        self.prepared = prepared
        self.request = request
        self.request_id = request.request_id
        self.prompt_ids = list(prepared.prompt_ids)
        self.truncation = prepared.truncation
        self._forced_steps: list[bool] = []
        self.sequences: tuple[ReturnedSequence, ...] = ()  # beam search: the returned beams (engine/beam.py)
        self.output_budget = prepared.output_budget
        self.generated: list[int] = []
        self.seed = seed
        self.sink = sink
        self.step_sampling = request.sampling  # this step's view: greedy on forced and greedy-prefix steps
        self._alternatives = max(request.top_logprobs, request.audit_top_n)  # reported per token
        # Computed per token: the confidence summary needs the raw distribution's best two.
        self.top_logprobs = max(self._alternatives, 2 if request.confidence else 0)
        self.confidence = ConfidenceStats() if request.confidence else None
        self.generator: torch.Generator | None = None
        if not request.sampling.greedy:
            # On the CPU whatever the device: one uniform a step (decoding/sampler.py), the same stream on CPU
            # and CUDA for a seed (and the CPU draw refuses a CUDA generator).
            self.generator = torch.Generator()
            self.generator.manual_seed(seed)
        self.penalties = PenaltyState(request.sampling, self.prompt_ids, vocab_size) \
            if request.sampling.has_penalties else None
        masks = prepared.controls
        self.rules = TokenStopRules(
            eos_token_ids=eos_token_ids, stop_token_ids=frozenset(request.stopping.stop_token_ids),
            ignore_eos=request.stopping.ignore_eos, budget=prepared.output_budget,
            repetition=request.stopping.repetition)
        self.plugin_error: str | None = None  # a plugin raised: the request fails, the engine goes on
        self.criteria = tuple((name, self._guarded(name, criterion)) for name, criterion in masks.criteria)
        self._step_text = ""
        self._eos_tuple = tuple(sorted(eos_token_ids))
        self._end_ids = tuple(sorted(eos_token_ids | frozenset(request.stopping.stop_token_ids)))
        self.forbidden = ForbiddenTracker(masks.forbidden) if masks.forbidden is not None else None
        self.allowed_mask = masks.allowed_mask.to(device) if masks.allowed_mask is not None else None
        processors: list[tuple[str, Callable[[torch.Tensor], None]]] = []
        if masks.logit_bias is not None:
            processors.append(("logit_bias", LogitBias(*masks.logit_bias).to(device)))
        processors += [(name, self._guarded(name, processor)) for name, processor in masks.processors]
        self.processors = tuple(processors)
        self.plugins = masks.plugins
        self._init_controls(device)
        self._pieces = pieces if pieces is not None else {}  # token id -> its text; shared, ids never change text
        self.detokenizer = IncrementalDetokenizer(tokenizer, self.prompt_ids)
        self._decode_piece = text_decoder(tokenizer, skip_special_tokens=False)
        self.stop_matcher = StopStringMatcher(request.stopping.stop)
        self.constraint = prepared.constraint
        self.matcher: Matcher | None = prepared.constraint.compiled.new_matcher() if prepared.constraint else None
        self.budget = BudgetRule(prepared.budget, self.matcher, tokenizer, vocab_size) \
            if prepared.budget is not None and self.matcher is not None else None
        if self.budget is not None:  # a budget too tight for even one free token: the shortest output from the start
            self._force_ending(self.budget.plan(0, self.output_budget.left(0)) or ())
        self._text: list[str] = []
        self.status = RequestStatus.WAITING  # set by the engine at each transition (engine/status.py)
        self.lookup: PromptLookup | None = None  # its tokens indexed for prompt lookup (engine/drafting.py)
        self.lookup_limit = -1  # tokens its next looked-up draft may hold (-1: not set yet; adapts to acceptance)
        self.last_forced = False  # whether the masks left its last token the only one (engine/drafting.py)
        self.cached_prompt_tokens = 0  # prompt tokens whose cache came from the prefix cache
        self.prompt_fed = 0  # prompt tokens in its cache slot (fed, or from the prefix cache): engine/batch.py
        self.decode_steps = 0  # decode forwards after the prefill
        self.drafted = 0  # draft tokens fed to verify (engine/drafting.py)
        self.accepted = 0  # of those, kept
        self.abort_requested = False  # set from any thread (Engine.abort); the engine ends the request
        self.finish_reason: FinishReason | None = None
        self.created = time.monotonic()
        self.started: float | None = None
        self.first_token_at: float | None = None

    def _init_controls(self, device: torch.device) -> None:
        """Forced tokens, the greedy prefix and must-include phrases change the row step by step;
        a request with none of them keeps its sampling and processors fixed (``_controlled`` False)."""
        request = self.request
        sampling = request.sampling
        self._forced = dict(sampling.forced_tokens)
        self._greedy_prefix = 0 if sampling.greedy else sampling.greedy_first_tokens
        self._greedy_view = SamplingParams() if not sampling.greedy else sampling
        # The first tokens' view: greedy, or sampled at their own temperature (a mixed schedule).
        self._prefix_view = (dataclasses.replace(sampling, temperature=sampling.first_tokens_temperature)
                             if sampling.first_tokens_temperature > 0 else self._greedy_view)
        self.must_include = PhraseTracker(request.stopping.must_include) if request.stopping.must_include else None
        ending = self.rules.stop_token_ids | (frozenset() if self.rules.ignore_eos else self.rules.eos_token_ids)
        self._end_ban = EndBan(sorted(ending), device) if self.must_include is not None and ending else None
        self._base_processors = self.processors
        self._forced_now: int | None = None
        self._controlled = bool(self._forced or self._greedy_prefix or self.must_include is not None)
        if self._controlled:
            self._plan_step()

    def _plan_step(self) -> None:
        """The next step's sampling view and processors: a forced step is greedy, a first-tokens step greedy or at
        its own temperature (greedy: the generator draws nothing); the end ban runs while a phrase is missing
        (not on a forced step)."""
        position = len(self.generated)
        forced = self._forced.get(position)
        self._forced_now = forced
        if forced is not None:
            self.step_sampling = self._greedy_view
        else:
            self.step_sampling = self._prefix_view if position < self._greedy_prefix else self.request.sampling
        extra: list[tuple[str, Callable[[torch.Tensor], None]]] = []
        if self._end_ban is not None and forced is None and self.must_include is not None and self.must_include.missing:
            extra.append(("must_include", self._end_ban))
        if forced is not None:
            extra.append(("forced_tokens", ForceToken(forced)))
        self.processors = self._base_processors + tuple(extra)

    # --- read by the pipeline and by plugins ------------------------------------------------
    def banned_token_ids(self) -> tuple[int, ...]:
        return self._eos_tuple if self.rules.suppress_eos(len(self.generated)) else ()

    def end_token_ids(self) -> tuple[int, ...]:
        return self._end_ids

    @property
    def last_step(self) -> bool:
        return self.rules.is_last_step(len(self.generated))

    @property
    def text(self) -> str:
        """The text released so far, this step's included (what the caller sees)."""
        return "".join(self._text) + self._step_text

    # --- called by the engine -------------------------------------------------------------
    def check_external(self, now: float) -> FinishReason | None:
        return check_external(self.abort_requested, self.request.deadline, now)

    def commit(self, decision: RowDecision, now: float) -> None:
        """Append the chosen token, run the stop checks and emit this step's event."""
        token_id = decision.token_id
        if self.plugin_error is not None:
            self.finish_without_token(FinishReason.ERROR, now, error=self.plugin_error)
            return
        if token_id < 0:
            detail = decision.dead_end or "no token is allowed"
            if self._forced_now is not None:
                position = len(self.generated)
                detail = (f"sampling.forced_tokens[{position}]: token {self._forced_now} is not allowed at position "
                          f"{position} (the constraint or another mask removes it; it was not emitted): {detail}")
            self.finish_without_token(decision.dead_end_reason, now, detail=detail)
            return
        if self.forbidden is not None:
            phrase = self.forbidden.advance(token_id)
            if phrase is not None:  # the mask was bypassed: never emit the phrase
                self.finish_without_token(FinishReason.ERROR, now, error=f"token {token_id} would complete the "
                                                                         f"forbidden phrase {phrase!r}")
                return
        if self.confidence is not None and self._forced_now is None:
            self.confidence.add(decision.final_logprob, decision.alternatives)
        self.generated.append(token_id)
        self.last_forced = decision.allowed_count == 1
        if self.first_token_at is None:
            self.first_token_at = now
        if self.penalties is not None:
            self.penalties.commit(token_id)
        if self.rules.repetition is not None:  # which steps the masks decided alone (see repetition_stop)
            self._forced_steps.append(decision.allowed_count == 1)
        stop = self.rules.check_token(token_id, self.generated, self._forced_steps)
        reason, detail = (stop.reason, stop.detail) if stop is not None else (None, "")
        if self.matcher is not None:
            reason, detail = self._advance_constraint(token_id, reason, detail)
        piece = self.detokenizer.push(token_id)
        if self.budget is not None:
            reason, detail = self._budget_step(piece, reason, detail)
        if self.must_include is not None:
            self.must_include.push(piece)
        scan = self.stop_matcher.push(piece)
        text = scan.release
        if scan.matched is not None:
            reason, detail = FinishReason.STOP_STRING, f"matched stop string {scan.matched!r}"
        elif reason is None and self.criteria:
            self._step_text = text
            reason, detail = self._check_criteria()
            self._step_text = ""
            if self.plugin_error is not None:
                reason, detail = FinishReason.ERROR, self.plugin_error
        if reason is not None and scan.matched is None:
            text += self._drain()
        details = (self._detail(decision),) if self.request.wants_details else ()
        event = TokenEvent(self.request_id, (token_id,), text, details, error=self.plugin_error)
        if self._controlled and reason is None:
            self._plan_step()
        self._emit(event, reason, detail, now)

    def _advance_constraint(self, token_id: int, reason: FinishReason | None,
                            detail: str) -> tuple[FinishReason | None, str]:
        """Advance the matcher after sampling; a complete constraint ends the request at once."""
        assert self.matcher is not None
        if reason is FinishReason.EOS and self.matcher.can_end():
            return reason, detail
        if not self.matcher.advance(token_id):
            return FinishReason.ERROR, f"the constraint rejected token {token_id} after masking"
        if reason in (None, FinishReason.LENGTH) and self.matcher.must_end():
            return FinishReason.CONSTRAINT_COMPLETE, "the constraint is complete"
        return reason, detail

    def _budget_step(self, piece: str, reason: FinishReason | None, detail: str) -> tuple[FinishReason | None, str]:
        """Close the JSON when the tokens left come within its ending (or it loops): the ending's tokens become
        forced steps; the row ends CLOSED_AT_BUDGET with its last one (engine/budget.py)."""
        budget = self.budget
        assert budget is not None and self.matcher is not None
        budget.push(piece)
        done = len(self.generated)
        if budget.closing:
            if done >= budget.closes_at and reason in (None, FinishReason.LENGTH, FinishReason.CONSTRAINT_COMPLETE) \
                    and self.matcher.can_end():
                return FinishReason.CLOSED_AT_BUDGET, budget.detail(self.output_budget.max_new_tokens)
            return (None, "") if reason is FinishReason.REPETITION else (reason, detail)  # an ending may repeat
        if reason is FinishReason.LENGTH and budget.complete and self.matcher.can_end():  # it closed itself, at the end
            most = self.output_budget.max_new_tokens
            return FinishReason.CONSTRAINT_COMPLETE, f"the JSON is complete at max_new_tokens {most}"
        if reason is not None and reason is not FinishReason.REPETITION:
            return reason, detail
        ending = budget.plan(done, self.output_budget.left(done), now=reason is FinishReason.REPETITION)
        if ending is None:
            return reason, detail
        if not ending:  # complete as it stands (a number that could go on): it ends here
            return FinishReason.CLOSED_AT_BUDGET, budget.detail(self.output_budget.max_new_tokens)
        self._force_ending(ending)
        return None, ""

    def _force_ending(self, ending: tuple[int, ...]) -> None:
        """The ending's tokens as forced steps from the next position on."""
        if ending:
            done = len(self.generated)
            self._forced.update(zip(range(done, done + len(ending)), ending, strict=True))
            self._controlled = True
            self._plan_step()

    def closing_draft(self, limit: int) -> list[int]:
        """The ending's tokens still to come but the last (each verified by the one before it), up to ``limit``."""
        if self.budget is None or not self.budget.closing:
            return []
        start = len(self.generated)
        return [self._forced[p] for p in range(start, min(self.budget.closes_at - 1, start + limit))]

    def _guarded(self, name: str, plugin: Callable[..., Any]) -> Callable[..., Any]:
        """Bind a plugin to this request; an exception in it fails this request only."""
        def call(*args: Any) -> Any:
            if self.plugin_error is not None:
                return None
            try:
                return plugin(self, *args)
            except Exception as exc:
                log.exception("plugin %s failed in request %s", name, self.request_id)
                self.plugin_error = f"{name} failed: {type(exc).__name__}: {exc}"
                return None
        return call

    def _check_criteria(self) -> tuple[FinishReason | None, str]:
        """Stopping-criterion plugins, in request order, on the text released so far."""
        for name, criterion in self.criteria:
            detail = criterion()
            if detail:
                return FinishReason.STOP_CRITERION, f"{name}: {detail}"
        return None, ""

    def finish_without_token(self, reason: FinishReason, now: float, detail: str = "",
                             error: str | None = None) -> None:
        """End the sequence between steps (cancel, deadline, engine fault), releasing held text."""
        text = self._drain() if reason not in (FinishReason.CANCELLED, FinishReason.ERROR) else ""
        self._emit(TokenEvent(self.request_id, (), text, (), error=error), reason, detail, now)

    # --- helpers ----------------------------------------------------------------------------
    def _drain(self) -> str:
        """Release held text at a non-stop-string finish: a stop string may still match in it."""
        scan = self.stop_matcher.push(self.detokenizer.flush())
        return scan.release + ("" if scan.matched else self.stop_matcher.flush())

    def detail(self, decision: RowDecision) -> TokenDetail:
        """A decision as a token detail (the one the request's own events carry; beam search reports its beams'
        with it)."""
        return self._detail(decision)

    def _detail(self, decision: RowDecision) -> TokenDetail:
        piece = self._piece
        alternatives = tuple(TokenAlternative(i, piece(i), lp) for i, lp in decision.alternatives[:self._alternatives])
        return TokenDetail(decision.token_id, piece(decision.token_id), decision.raw_logprob,
                           decision.final_logprob, alternatives, decision.removed_by, decision.allowed_count)

    def _piece(self, token_id: int) -> str:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._decode_piece([token_id])
            self._pieces[token_id] = piece
        return piece

    def _schema_check(self, reason: FinishReason) -> SchemaCheck | None:
        """Validate a JSON output against its schema; an unfinished output is never valid."""
        if self.constraint is None or self.constraint.schema is None:
            return None
        from proctor.constraints.json_validation import validate_json_output

        text = "".join(self._text)
        result = validate_json_output(text, self.constraint.schema, truncated=reason is FinishReason.LENGTH,
                                      canonical=self.constraint.schema_canonical or None)
        if reason in UNFINISHED and reason is not FinishReason.LENGTH:
            ended = f"output ended ({reason.value}) before the JSON was complete; it is not a valid instance"
            return SchemaCheck(False, (ended, *result.errors), (("", "ended"), *result.sites))
        return SchemaCheck(result.valid, result.errors, result.sites)

    def _emit(self, event: TokenEvent, reason: FinishReason | None, detail: str, now: float) -> None:
        self._text.append(event.text)
        if reason is not None:
            included = self.must_include.results("".join(self._text)) if self.must_include is not None else ()
            self.finish_reason = reason
            self.status = status_after(reason)
            started = self.started if self.started is not None else now
            ttft = (self.first_token_at - self.created) * 1000 if self.first_token_at else 0.0
            event = TokenEvent(
                event.request_id, event.token_ids, event.text, event.details, finish_reason=reason,
                finish_detail=detail, usage=Usage(len(self.prompt_ids), len(self.generated), self.cached_prompt_tokens,
                                                     self.decode_steps, self.drafted, self.accepted,
                                                     self.budget.forced(len(self.generated)) if self.budget else 0),
                timings=Timings((started - self.created) * 1000, ttft, (now - self.created) * 1000),
                seed=self.seed, error=event.error,
                constraint=self.constraint.summary if self.constraint else None,
                schema_check=self._schema_check(reason), plugins=self.plugins,
                confidence=self.confidence.summary() if self.confidence is not None else None,
                must_include=included, prompt_truncation=self.truncation, sequences=self.sequences)
        self.sink(event)

    @property
    def finished(self) -> bool:
        return self.status.finished
