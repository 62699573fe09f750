"""One request in the engine: its parts, and what the engine tracks about it (rule 2 of DESIGN.md: all of a
request's mutable decode state hangs from one object).

The state is a composition of parts with one job each, each testable alone:

- ``row`` (engine/row_decoding.py): the row's decoding state, what the pipeline reads each step (tokens, masks,
  processors, the sampling view and its settings tensor) and what a token advances (the token stop rules, the
  constraint);
- ``output`` (engine/output_processor.py): its text (detokenizer, stop strings), token details and events;
- ``budget`` (engine/row_budget.py): its ``OutputBudget`` and the JSON closing rule.

What stays here is the engine's own record of the request (status, timings, counts, the abort flag, the drafting
index) and ``commit``, which runs one token through the parts in a fixed order: the masks' last word (forbidden
phrases), the token rules and the constraint, then the text (the budget, must-include phrases, stop strings and
stopping criteria read it and may end the request or force its ending), then the event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from proctor.constraints.backend import Matcher
from proctor.decoding.controls import ConfidenceStats
from proctor.decoding.pipeline import RowDecision
from proctor.decoding.prompt_lookup import PromptLookup
from proctor.decoding.stopping import check_external
from proctor.domain import FinishReason, ReturnedSequence, TokenDetail
from proctor.domain.events import Timings, Usage
from proctor.domain.output_budget import OutputBudget
from proctor.engine.closing import ClosingRule
from proctor.engine.output_processor import Ending, EventSink, OutputProcessor
from proctor.engine.preprocess import PreparedRequest
from proctor.engine.row_budget import RowBudget
from proctor.engine.row_decoding import Outcome, RowDecoding
from proctor.engine.status import RequestStatus, status_after
from proctor.engine.thought_gate import ThoughtRule

__all__ = ["EventSink", "SequenceState"]
log = logging.getLogger("proctor.engine")


class SequenceState:
    """One request: its decoding row, its output, its budget, and the engine's record of it."""

    def __init__(self, prepared: PreparedRequest, *, tokenizer: Any, eos_token_ids: frozenset[int],
                 pieces: dict[int, str] | None = None,
                 vocab_size: int, device: torch.device, seed: int, sink: EventSink) -> None:
        request = prepared.request
        self.prepared = prepared
        self.request = request
        self.request_id = request.request_id
        self.seed = seed
        self.sequences: tuple[ReturnedSequence, ...] = ()  # beam search: the returned beams (engine/beam.py)
        self.plugin_error: str | None = None  # a plugin raised: the request fails, the engine goes on
        masks = prepared.controls
        self.row = RowDecoding(prepared, eos_token_ids=eos_token_ids, vocab_size=vocab_size, device=device, seed=seed,
                               plugin_processors=tuple((name, self._guarded(name, processor))
                                                       for name, processor in masks.processors))
        self.criteria = tuple((name, self._guarded(name, criterion)) for name, criterion in masks.criteria)
        self.output = OutputProcessor(prepared, tokenizer=tokenizer, seed=seed, sink=sink, pieces=pieces,
                                      must_include=self.row.must_include)
        rule = None
        if prepared.closing is not None and self.row.matcher is not None:
            reader = ThoughtRule(prepared.closing.rule, self.row.thought).reader() if self.row.thought else None
            rule = ClosingRule(prepared.closing, self.row.matcher, tokenizer, vocab_size, reader)
        self.budget = RowBudget(prepared.output_budget, rule, self.row.matcher)
        self.row.force(self.budget.opening())  # a budget too tight for even one free token: the shortest output
        self.confidence = ConfidenceStats() if request.confidence else None
        self.status = RequestStatus.WAITING  # set by the engine at each transition (engine/status.py)
        self.lookup: PromptLookup | None = None  # its tokens indexed for prompt lookup (engine/drafting.py)
        self.lookup_limit = -1  # tokens its next looked-up draft may hold (-1: not set yet; adapts to acceptance)
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
        # Whether its text decides nothing: no stop string, criterion, plugin, must-include phrase or closing rule
        # reads it, so its end is known from its tokens alone (and its text is the detokenizer's, as it comes).
        self.text_free = not (self.output.stop_matcher.active or self.criteria or masks.processors
                              or self.row.must_include is not None or self.budget.rule is not None
                              or self.row.thought is not None)

    # --- the parts' facts, as the other rooms and plugins (SequenceView) read them --------------
    @property
    def prompt_ids(self) -> list[int]:
        return self.row.prompt_ids

    @property
    def generated(self) -> list[int]:
        return self.row.generated

    @property
    def text(self) -> str:
        """The text released so far, this step's included (what the caller sees)."""
        return self.output.text

    @property
    def matcher(self) -> Matcher | None:
        return self.row.matcher

    @property
    def last_forced(self) -> bool:
        return self.row.last_forced

    @property
    def output_budget(self) -> OutputBudget:
        return self.budget.output

    @property
    def constraint(self) -> Any:
        return self.prepared.constraint

    def closing_draft(self, limit: int) -> list[int]:
        """The budget's ending still to come but its last token, up to ``limit`` (engine/drafting.py)."""
        return self.budget.closing_draft(len(self.row.generated), limit)

    def detail(self, decision: RowDecision) -> TokenDetail:
        """A decision as a token detail (beam search reports its beams' with it)."""
        return self.output.detail(decision)

    @property
    def finished(self) -> bool:
        return self.status.finished

    # --- called by the engine -------------------------------------------------------------
    def check_external(self, now: float) -> FinishReason | None:
        return check_external(self.abort_requested, self.request.deadline, now)

    def commit(self, decision: RowDecision, now: float) -> None:
        """Append the chosen token, run the stop checks and emit this step's event."""
        token_id, row = decision.token_id, self.row
        if self.plugin_error is not None:
            self.finish_without_token(FinishReason.ERROR, now, error=self.plugin_error)
            return
        if token_id < 0:
            self.finish_without_token(decision.dead_end_reason, now, detail=self._dead_end(decision))
            return
        phrase = row.forbidden_phrase(token_id)
        if phrase is not None:  # the mask was bypassed: never emit the phrase
            self.finish_without_token(FinishReason.ERROR, now,
                                      error=f"token {token_id} would complete the forbidden phrase {phrase!r}")
            return
        if self.confidence is not None and row.forced_now is None:
            self.confidence.add(decision.final_logprob, decision.alternatives)
        reason, detail = row.append(decision)
        if self.first_token_at is None:
            self.first_token_at = now
        if row.in_thought:
            self._thought_step(decision, reason, detail, now)
            return
        if self.text_free:
            if row.controlled and reason is None:
                row.plan_step()
            self.output.follow(token_id, decision, self.plugin_error, self._ending(reason, detail, now))
            return
        text, (reason, detail) = self._text_step(token_id, reason, detail)
        if row.controlled and reason is None:
            row.plan_step()
        self.output.emit((token_id,), text, decision, self.plugin_error, self._ending(reason, detail, now))

    def _thought_step(self, decision: RowDecision, reason: FinishReason | None, detail: str, now: float) -> None:
        """A token of the thought: the closing rule reads it (a thought that runs long is ended in time for the
        answer), the end marker is forced at the thought's budget; stop strings and criteria read the answer only."""
        row, token_id = self.row, decision.token_id
        piece = self.output.piece(token_id)
        reason, detail, ending = self.budget.after(piece, len(row.generated), reason, detail)
        row.force(ending)
        if reason is None:
            row.end_thought_when_due()
            if row.controlled:
                row.plan_step()
        self.output.thought(token_id, piece, decision, self.plugin_error, self._ending(reason, detail, now))

    def _text_step(self, token_id: int, reason: FinishReason | None, detail: str) -> tuple[str, Outcome]:
        """The token's text, where it decides: the closing rule and the must-include phrases read it, then the stop
        strings and stopping criteria may end the request; the text to release."""
        piece = self.output.piece(token_id)
        reason, detail, ending = self.budget.after(piece, len(self.row.generated), reason, detail)
        self.row.force(ending)
        if self.row.must_include is not None:
            self.row.must_include.push(piece)
        scan = self.output.scan(piece)
        text = scan.release
        if scan.matched is not None:
            return text, (FinishReason.STOP_STRING, f"matched stop string {scan.matched!r}")
        if reason is None and self.criteria:
            self.output.pending = text
            reason, detail = self._check_criteria()
            self.output.pending = ""
            if self.plugin_error is not None:
                reason, detail = FinishReason.ERROR, self.plugin_error
        if reason is not None:
            text += self.output.drain()
        return text, (reason, detail)

    def _dead_end(self, decision: RowDecision) -> str:
        detail = decision.dead_end or "no token is allowed"
        forced = self.row.forced_now
        if forced is None:
            return detail
        position = len(self.row.generated)
        return (f"sampling.forced_tokens[{position}]: token {forced} is not allowed at position {position} (the "
                f"constraint or another mask removes it; it was not emitted): {detail}")

    def finish_without_token(self, reason: FinishReason, now: float, detail: str = "",
                             error: str | None = None) -> None:
        """End the sequence between steps (cancel, deadline, engine fault), releasing held text."""
        ending = self._ending(reason, detail, now)
        assert ending is not None
        self.output.close(error, ending)

    def _ending(self, reason: FinishReason | None, detail: str, now: float) -> Ending | None:
        """None while the request goes on; at its end, its status, and the facts its final event reports."""
        if reason is None:
            return None
        self.finish_reason = reason
        self.status = status_after(reason)
        generated = len(self.row.generated)
        started = self.started if self.started is not None else now
        ttft = (self.first_token_at - self.created) * 1000 if self.first_token_at else 0.0
        thought = self.row.thought
        usage = Usage(len(self.row.prompt_ids), generated, self.cached_prompt_tokens, self.decode_steps, self.drafted,
                      self.accepted, self.budget.forced(generated), thought.tokens if thought is not None else 0)
        timings = Timings((started - self.created) * 1000, ttft, (now - self.created) * 1000)
        confidence = self.confidence.summary() if self.confidence is not None else None
        return Ending(reason, detail, usage, timings, confidence, self.sequences)

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

    def _check_criteria(self) -> Outcome:
        """Stopping-criterion plugins, in request order, on the text released so far."""
        for name, criterion in self.criteria:
            detail = criterion()
            if detail:
                return FinishReason.STOP_CRITERION, f"{name}: {detail}"
        return None, ""
