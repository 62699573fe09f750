"""Beam search with ``generate()``'s semantics (transformers 5.x ``GenerationMixin._beam_search``).

A beam request waits in the scheduler's queue like any other request (the same admission and limits), and
joins the running batch with ``num_beams`` rows (DecodeBatch.join_search: one KV-cache slot per beam). Its
prompt is fed like any prompt (in pieces within the step's budget, into its first slot); then at every step the
plan feeds each beam its last token beside the other rows, in the step's one forward. The update pass hands the
beams' logits to the search (``first`` after the prompt, then ``next``), and the cache rows follow the beams'
parents (DecodeBatch.reorder_search). Each selection follows transformers exactly — the same tensor operations
in the same order, so the same ties break the same way:

1. each beam's next-token log-softmax, with the masks applied after it (the constraint, forbidden
   phrases, ``allowed_token_ids``, end-of-sequence before ``min_new_tokens``: each beam its own state);
2. plus the beam's running score; the best ``max(2, 1 + n_eos) * num_beams`` continuations over all beams;
3. a continuation ending in an end token (or reaching ``max_new_tokens``) among the first ``num_beams``
   joins the finished beams with score ``sum(logprob) / generated ** length_penalty`` (kept: the best
   ``num_beams``); the best ``num_beams`` that did not end run on (the KV cache rows reordered to their
   parents);
4. stop when no running beam can still beat the worst finished one (``early_stopping``: ``False`` —
   generate()'s heuristic at the current length, ``True`` — as soon as ``num_beams`` are finished,
   ``"never"`` — the best possible length).

The finished beams, best first, are the result: the best is replayed through the request's own
``SequenceState`` (its detokenizer, stop rules, schema check, events and audit details: the request
then reads like any other, released at the end), the first ``num_return_sequences`` are reported as
``TokenEvent.sequences``. Each beam carries its own constraint matcher (forked: llguidance copies its
state; other engines replay the beam's tokens into a new matcher) and forbidden-phrase state.
Sampling, penalties, processors, stop strings and the repetition stop are refused with beams.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from proctor.constraints.backend import Matcher
from proctor.decoding import logits_ops
from proctor.decoding.forbidden import ForbiddenTracker
from proctor.decoding.masks import build_masks
from proctor.decoding.pipeline import RowDecision
from proctor.domain import FinishReason, RequestValidationError, ReturnedSequence
from proctor.domain.output_budget import OutputBudget
from proctor.domain.request import EarlyStopping
from proctor.engine.batch import DecodeBatch, RowFeed
from proctor.engine.detokenizer import text_decoder
from proctor.engine.sequence import SequenceState
from proctor.engine.status import RequestStatus
from proctor.executor.plan import ExecutorPlan

NEG = -1.0e9  # transformers' "impossible" score


@dataclass
class Beam:
    """One hypothesis: its tokens and their decisions, its own constraint and forbidden-phrase state."""

    tokens: list[int]
    decisions: list[RowDecision]
    matcher: Matcher | None
    forbidden: ForbiddenTracker | None
    allowed_mask: torch.Tensor | None
    budget: OutputBudget
    end_ids: tuple[int, ...]
    eos_ids: tuple[int, ...]
    dead: bool = False

    # --- MaskedRow (decoding/masks.py) ---
    @property
    def last_step(self) -> bool:
        return self.budget.last_step(len(self.tokens))

    def end_token_ids(self) -> tuple[int, ...]:
        return self.end_ids

    def banned_token_ids(self) -> tuple[int, ...]:
        return self.eos_ids if self.budget.holds_end(len(self.tokens)) else ()


@dataclass
class BeamSearch:
    """One beam request's search: the step plan feeds its beams, the update pass hands it their logits."""

    host: SequenceState
    end_ids: frozenset[int]  # tokens that end a beam: end-of-sequence (unless ignore_eos) and stop tokens
    n_eos: int
    decode: Callable[[list[int]], str]  # a returned beam's text (special tokens skipped, as the output's)
    slots: list[int] = field(default_factory=list)  # the batch's cache slots, one a beam (DecodeBatch.join_search)
    beams: list[Beam] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # after a selection: the beam each running one continues
    _scores: torch.Tensor | None = None  # running beam scores [B]
    _finished: list[tuple[Beam, FinishReason] | None] = field(default_factory=list)
    _finished_scores: torch.Tensor | None = None
    _finished_flags: torch.Tensor | None = None
    _improvable: bool = True

    @property
    def num_beams(self) -> int:
        return self.host.request.sampling.num_beams

    def lane_tokens(self) -> list[int]:
        """What each beam is fed next: its last token."""
        return [beam.tokens[-1] for beam in self.beams]

    def first(self, logits: torch.Tensor) -> bool:
        """The prompt's last logits ([1, V]), from which every beam starts (the update pass then copies the prompt
        into each beam's slot); the first selection. True once the request has been answered."""
        host, count = self.host, self.num_beams
        row = host.row
        rules = row.rules
        eos = tuple(sorted(rules.eos_token_ids))
        self.beams = [Beam([], [], row.matcher if slot == 0 else _fork(host, row.matcher, []),
                           _copy_tracker(row.forbidden), row.allowed_mask, rules.budget,
                           tuple(sorted(self.end_ids)), eos) for slot in range(count)]
        row.matcher = _fork(host, row.matcher, [])  # the host replays the winner from the start
        self._scores = torch.zeros(count, dtype=torch.float32)
        self._scores[1:] = NEG
        self._finished = [None] * count
        self._finished_scores = torch.full((count,), NEG, dtype=torch.float32)
        self._finished_flags = torch.zeros(count, dtype=torch.bool)
        return self.next(logits.expand(count, -1).contiguous())

    def next(self, logits: torch.Tensor) -> bool:
        """One selection over the beams' logits ([num_beams, V]); True once the request has been answered, else
        ``parents`` says which beam each running one continues."""
        assert self._scores is not None
        count, host = self.num_beams, self.host
        logits = logits.float()
        raw = torch.log_softmax(logits, dim=-1)
        top = raw.argmax(dim=-1).tolist()
        masks = build_masks(logits, self.beams, top)
        log_probs = raw.masked_fill(masks.banned, float("-inf")) if masks.banned is not None else raw.clone()
        vocab = log_probs.shape[-1]
        accumulated = (log_probs + self._scores[:, None]).reshape(1, -1)
        keep = max(2, 1 + self.n_eos) * count
        values, indices = torch.topk(accumulated, k=keep)
        values, indices = values[0], indices[0]
        parents = (indices // vocab).tolist()
        tokens = (indices % vocab).tolist()
        generated = len(self.beams[0].tokens) + 1  # tokens each continuation holds
        length_hit = host.row.rules.budget.reached(generated)
        hits = torch.tensor([length_hit or token in self.end_ids for token in tokens], dtype=torch.bool)
        want = max(host.request.top_logprobs, host.request.audit_top_n)
        alternatives = _alternatives(raw, want)
        candidates = [self._extend(parents[i], tokens[i], raw, log_probs, masks, alternatives) for i in range(keep)]
        # Running beams for the next step (transformers' _get_running_beams_for_next_iteration).
        running_scores = values + hits.to(torch.float32) * NEG
        next_indices = torch.topk(running_scores, k=count)[1].tolist()
        # Finished beams (transformers' _update_finished_beams).
        just = hits & (torch.arange(keep) < count)
        normalised = values / (generated ** host.request.sampling.length_penalty)
        early = host.request.sampling.early_stopping
        assert self._finished_flags is not None and self._finished_scores is not None
        if bool(self._finished_flags.all()) and early == EarlyStopping.WHEN_FULL:
            normalised = normalised + NEG
        if not self._improvable:
            normalised = normalised + NEG
        normalised = normalised + (~just).to(torch.float32) * NEG
        merged_scores = torch.cat((self._finished_scores, normalised))
        merged_flags = torch.cat((self._finished_flags, just))
        merged = [*self._finished, *[(c, FinishReason.LENGTH if length_hit and t not in self.end_ids
                                      else self._end_reason(t)) for c, t in zip(candidates, tokens, strict=True)]]
        chosen = torch.topk(merged_scores, k=count)[1].tolist()
        self._finished = [merged[i] for i in chosen]
        self._finished_scores = merged_scores[chosen]
        self._finished_flags = merged_flags[chosen]
        # Move to the running beams: the cache rows follow their parents (the update pass reorders them).
        self._scores = running_scores[next_indices]
        self.parents = [parents[i] for i in next_indices]
        self.beams = [self._advance(candidates[i], tokens[i]) for i in next_indices]
        self._improvable = self._still_improvable(generated)
        exists_open = not (bool(self._finished_flags.all()) and early == "true")
        if self._improvable and exists_open and not bool(hits.all()):
            return False
        self._answer()
        return True

    def _end_reason(self, token: int) -> FinishReason:
        return FinishReason.EOS if token in self.host.row.rules.eos_token_ids and not self.host.row.rules.ignore_eos \
            else FinishReason.STOP_TOKEN

    def _extend(self, parent: int, token: int, raw: torch.Tensor, log_probs: torch.Tensor, masks: Any,
                alternatives: list[tuple[tuple[int, float], ...]]) -> Beam:
        """The parent beam plus ``token`` (its matcher not yet advanced: most candidates are dropped)."""
        beam = self.beams[parent]
        decision = RowDecision(token, float(raw[parent, token]), float(log_probs[parent, token]), alternatives[parent],
                               removed_by=masks.removed_by[parent], allowed_count=masks.allowed_count[parent])
        return Beam([*beam.tokens, token], [*beam.decisions, decision], beam.matcher, beam.forbidden,
                    beam.allowed_mask, beam.budget, beam.end_ids, beam.eos_ids, beam.dead)

    def _advance(self, beam: Beam, token: int) -> Beam:
        """A running beam's own constraint and forbidden state, moved past its new token."""
        matcher = _fork(self.host, beam.matcher, beam.tokens[:-1]) if beam.matcher is not None else None
        forbidden = _copy_tracker(beam.forbidden)
        dead = beam.dead
        if matcher is not None and not dead and not matcher.advance(token):
            dead = True  # only a beam kept at an impossible score can take a token its grammar refuses
        if forbidden is not None and not dead:
            forbidden.advance(token)
        return Beam(beam.tokens, beam.decisions, matcher, forbidden, beam.allowed_mask, beam.budget, beam.end_ids,
                    beam.eos_ids, dead)

    def _still_improvable(self, generated: int) -> bool:
        """transformers' _check_early_stop_heuristic, after the step (``generated`` tokens so far)."""
        assert self._scores is not None and self._finished_flags is not None and self._finished_scores is not None
        sampling = self.host.request.sampling
        if sampling.early_stopping == EarlyStopping.NEVER and sampling.length_penalty > 0.0:
            length = self.host.row.rules.budget.max_new_tokens
        else:
            length = generated
        best_possible = self._scores[:1] / (length ** sampling.length_penalty)
        worst = torch.where(self._finished_flags, torch.min(self._finished_scores), torch.tensor(NEG))
        return self._improvable and bool(torch.any(best_possible > worst))

    def _answer(self) -> None:
        """Replay the best finished beam through the request's own state; report the returned ones."""
        host = self.host
        assert self._finished_scores is not None  # set when the search started
        finished = [(entry, float(score)) for entry, score in zip(self._finished, self._finished_scores.tolist(),
                                                                   strict=True) if entry is not None]
        wanted = finished[:host.request.num_return_sequences]
        details = host.request.wants_details  # the audit record keeps every returned beam's token details
        host.sequences = tuple(
            ReturnedSequence(tuple(beam.tokens), self.decode(beam.tokens), score, reason,
                             details=tuple(host.detail(d) for d in beam.decisions) if details else ())
            for (beam, reason), score in wanted)
        now = time.monotonic()
        if not wanted:
            host.finish_without_token(FinishReason.DEAD_END, now, detail="no beam finished")
            return
        (best, _), _ = wanted[0]
        for decision in best.decisions:
            if host.finished:
                break
            host.commit(decision, now)
        if not host.finished:  # the best beam ended at the token limit without the host's own rules seeing it
            host.finish_without_token(FinishReason.LENGTH, now)


class BeamSearches:
    """The engine's beam requests while they wait: created on a caller's thread, taken by the batch when they join."""

    def __init__(self, loaded: Any, max_rows: int, plan: ExecutorPlan) -> None:
        self._loaded = loaded
        self._max_rows = max_rows
        self._plan = plan
        self._decode = text_decoder(loaded.tokenizer, skip_special_tokens=True)
        self._lock = threading.Lock()
        self._pending: dict[int, BeamSearch] = {}  # by id() of the request's state, while it waits in the queue

    def create(self, state: SequenceState) -> BeamSearch:
        """A beam request's search (what beam search does not combine with was refused by api/validation.py;
        what this model or this batch cannot do is refused here, before any work)."""
        if not self._plan.beams:
            raise RequestValidationError.single(
                "sampling.num_beams", f"beam search needs the slot forward; this server runs {self._plan.description}")
        beams = state.request.sampling.num_beams
        if beams > self._max_rows:
            raise RequestValidationError.single(
                "sampling.num_beams", f"{beams} beams need {beams} rows of the batch; this server runs "
                f"{self._max_rows} (--max-batch-size)")
        rules = state.row.rules
        ends = rules.stop_token_ids | (frozenset() if rules.ignore_eos else rules.eos_token_ids)
        return BeamSearch(state, ends, len(self._loaded.eos_token_ids), self._decode)

    def hold(self, search: BeamSearch) -> None:
        """Keep a created search while its request waits in the scheduler's queue, like any other request."""
        with self._lock:
            self._pending[id(search.host)] = search

    def take(self, state: SequenceState) -> BeamSearch:
        """The search of ``state``, which joins the batch now (the step plan: engine/scheduler.py)."""
        with self._lock:
            return self._pending.pop(id(state))

    def drop(self, state: SequenceState) -> None:
        """Forget the search of a request that ended while it waited (cancelled, past its deadline, shutdown)."""
        with self._lock:
            self._pending.pop(id(state), None)

    def waiting(self) -> int:
        """Beam requests waiting in the queue (any thread: the admission counters)."""
        with self._lock:
            return len(self._pending)


def update_searches(batch: DecodeBatch, spans: list[tuple[RowFeed, range]], logits: torch.Tensor) -> None:
    """The update pass for the step's beam rows (``spans``: the step's feeds and their rows of ``logits``): each
    search's selection over its beams' logits (after its prompt's last piece: that position's, from which every
    beam starts), then its cache rows follow the beams' parents. An answered search leaves when its host retires
    (Engine._retire)."""
    rows: dict[int, list[int]] = {}
    first: set[int] = set()
    for feed, span in spans:
        if feed.beam is not None and span:
            rows.setdefault(id(feed.state), []).extend(span)
            if feed.prompt:
                first.add(id(feed.state))
    for search in [search for search in batch.searches if id(search.host) in rows]:
        wanted = logits[rows[id(search.host)]]
        starting = id(search.host) in first
        if starting:
            search.host.status = RequestStatus.RUNNING
        if not (search.first(wanted) if starting else search.next(wanted)):
            # every beam starts from the prompt, whichever parent the first selection names: one copy of it
            batch.reorder_search(search, [0] * search.num_beams if starting else search.parents)


def _fork(host: SequenceState, matcher: Matcher | None, history: list[int]) -> Matcher | None:
    """An independent matcher at the same position: the engine's own copy when it has one, else a new
    matcher that read the beam's tokens again."""
    if matcher is None:
        return None
    fork: Callable[[], Matcher] | None = getattr(matcher, "fork", None)
    if fork is not None:
        return fork()
    assert host.constraint is not None
    fresh: Matcher = host.constraint.compiled.new_matcher()
    for token in history:
        fresh.advance(token)
    return fresh


def _copy_tracker(tracker: ForbiddenTracker | None) -> ForbiddenTracker | None:
    if tracker is None:
        return None
    copy = ForbiddenTracker(tracker.index)
    copy.state = tracker.state
    return copy


def _alternatives(raw: torch.Tensor, want: int) -> list[tuple[tuple[int, float], ...]]:
    if not want:
        return [()] * raw.shape[0]
    values, ids = logits_ops.row_topk(raw, min(want, raw.shape[-1]))
    return [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
