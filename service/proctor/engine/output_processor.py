"""A request's output: its text, the token details its events carry, and the events themselves.

The text comes from the incremental detokenizer (engine/detokenizer.py: never a split character, never an invented
space); stop strings are searched in the new tail only and a possible start of one is held back while streaming
(decoding/stop_strings.py). Each event goes to the request's sink; the final one carries what the request ended
with: its usage, timings and seed, the schema check of a JSON output, the must-include results.

The engine thread decides whether and why a request ends (engine/sequence.py) and hands the facts it fixed then
(an ``Ending``) with the text work. For a request whose text decides nothing (no stop strings, criteria, plugins,
must-include phrases or closing rule: ``SequenceState.text_free``) the text work could run anywhere after the token
is chosen, since nothing here touches the row's decoding state. It runs on the engine thread: bench/output_thread.py
measured it at ~35 µs of CPU per token, about 1% of the engine thread's time at 16 streams, and a worker thread
gained nothing measurable on two cores (bench/README.md, "Output work off the engine thread").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.decoding.pipeline import RowDecision
from proctor.decoding.stop_strings import StopScan, StopStringMatcher
from proctor.domain import (
    Confidence,
    FinishReason,
    ReturnedSequence,
    SchemaCheck,
    TokenAlternative,
    TokenDetail,
    TokenEvent,
)
from proctor.domain.events import Timings, Usage
from proctor.engine.detokenizer import IncrementalDetokenizer, text_decoder

if TYPE_CHECKING:
    from proctor.decoding.controls import PhraseTracker
    from proctor.engine.preprocess import PreparedRequest

EventSink = Callable[[TokenEvent], None]
# Finish reasons after which the constrained structure may be incomplete.
UNFINISHED = frozenset({FinishReason.LENGTH, FinishReason.DEADLINE, FinishReason.CANCELLED,
                        FinishReason.DEAD_END, FinishReason.ERROR, FinishReason.FORBIDDEN_PHRASE,
                        FinishReason.REPETITION, FinishReason.STOP_CRITERION})
# Finishes that release no held text (the output is cut, not ended).
CUT = frozenset({FinishReason.CANCELLED, FinishReason.ERROR})


@dataclass(frozen=True, slots=True)
class Ending:
    """What the final event reports besides its text: the facts the engine thread fixed when the request ended."""

    reason: FinishReason
    detail: str
    usage: Usage
    timings: Timings
    confidence: Confidence | None = None
    sequences: tuple[ReturnedSequence, ...] = ()  # beam search: the returned beams


class OutputProcessor:
    """One request's text and events; ``pieces``: token id → its text, shared by every request (ids never change
    text); ``must_include``: the request's phrase tracker (its results are read from the returned text)."""

    def __init__(self, prepared: PreparedRequest, *, tokenizer: Any, seed: int, sink: EventSink,
                 pieces: dict[int, str] | None = None, must_include: PhraseTracker | None = None) -> None:
        request = prepared.request
        self.request_id = request.request_id
        self.detokenizer = IncrementalDetokenizer(tokenizer, list(prepared.prompt_ids))
        self._decode_piece = text_decoder(tokenizer, skip_special_tokens=False)
        self._pieces = pieces if pieces is not None else {}
        self.stop_matcher = StopStringMatcher(request.stopping.stop)
        self._alternatives = max(request.top_logprobs, request.audit_top_n)  # reported per token
        self._wants_details = request.wants_details
        self._must_include = must_include
        self._constraint = prepared.constraint
        self._plugins = prepared.controls.plugins
        self._truncation = prepared.truncation
        self._seed = seed
        self.sink = sink
        self._text: list[str] = []
        markers = prepared.thought.markers if prepared.thought is not None else None
        self._markers = {markers.start_id: markers.start_text, markers.end_id: markers.end_text} if markers else {}
        self.pending = ""  # this step's released text, while stopping criteria read ``text``

    @property
    def text(self) -> str:
        """The text released so far, this step's included (what the caller sees)."""
        return "".join(self._text) + self.pending

    # --- the text of a token ---------------------------------------------------------------
    def piece(self, token_id: int) -> str:
        """The text ``token_id`` adds, once it is certain (may be empty)."""
        return self.detokenizer.push(token_id)

    def scan(self, piece: str) -> StopScan:
        """``piece`` after the stop strings: what may be released, and the stop string it completed, if any."""
        return self.stop_matcher.push(piece)

    def drain(self) -> str:
        """Release held text at a non-stop-string finish: a stop string may still match in it."""
        scan = self.stop_matcher.push(self.detokenizer.flush())
        return scan.release + ("" if scan.matched else self.stop_matcher.flush())

    def follow(self, token_id: int, decision: RowDecision, error: str | None, ending: Ending | None) -> None:
        """A token whose text decides nothing (no stop string can match: ``SequenceState.text_free``): its text, its
        event, and at the end the held text too."""
        text = self.scan(self.piece(token_id)).release
        if ending is not None:
            text += self.drain()
        self.emit((token_id,), text, decision, error, ending)

    def close(self, error: str | None, ending: Ending) -> None:
        """The final event of a request that ends between steps (cancel, deadline, fault, a dead end)."""
        self.emit((), self.drain() if ending.reason not in CUT else "", None, error, ending)

    # --- events -------------------------------------------------------------------------------
    def thought(self, token_id: int, piece: str, decision: RowDecision, error: str | None,
                ending: Ending | None) -> None:
        """A token of the thought (``piece``: its text): its event carries the text as ``reasoning``, a marker's own
        text left out; at the end the held text is the thought's too."""
        marker = self._markers.get(token_id)
        if marker:
            piece = piece.replace(marker, "", 1)
        if ending is not None:
            piece += self.detokenizer.flush()
        self.emit((token_id,), "", decision, error, ending, reasoning=piece)

    def emit(self, token_ids: tuple[int, ...], text: str, decision: RowDecision | None, error: str | None,
             ending: Ending | None, reasoning: str = "") -> None:
        """One event to the sink (``decision``: the token's, for its details; ``ending``: the final one)."""
        details = (self.detail(decision),) if decision is not None and self._wants_details else ()
        self._text.append(text)
        if ending is None:
            self.sink(TokenEvent(self.request_id, token_ids, text, details, error=error, reasoning=reasoning))
            return
        returned = "".join(self._text)
        included = self._must_include.results(returned) if self._must_include is not None else ()
        self.sink(TokenEvent(
            self.request_id, token_ids, text, details, reasoning=reasoning,
            finish_reason=ending.reason, finish_detail=ending.detail,
            usage=ending.usage, timings=ending.timings, seed=self._seed, error=error,
            constraint=self._constraint.summary if self._constraint else None,
            schema_check=self.schema_check(returned, ending.reason), plugins=self._plugins,
            confidence=ending.confidence, must_include=included, prompt_truncation=self._truncation,
            sequences=ending.sequences))

    def detail(self, decision: RowDecision) -> TokenDetail:
        """A decision as a token detail (the one the request's own events carry; beam search reports its beams'
        with it)."""
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

    def schema_check(self, text: str, reason: FinishReason) -> SchemaCheck | None:
        """Validate a JSON output against its schema; an unfinished output is never valid."""
        if self._constraint is None or self._constraint.schema is None:
            return None
        from proctor.constraints.json_schema import validate_json_output

        result = validate_json_output(text, self._constraint.schema, truncated=reason is FinishReason.LENGTH,
                                      canonical=self._constraint.schema_canonical or None)
        if reason in UNFINISHED and reason is not FinishReason.LENGTH:
            ended = f"output ended ({reason.value}) before the JSON was complete; it is not a valid instance"
            return SchemaCheck(False, (ended, *result.errors), (("", "ended"), *result.sites))
        return SchemaCheck(result.valid, result.errors, result.sites)
