"""What the engine emits per step: token events and the typed finish reason."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FinishReason(enum.Enum):
    """Why a sequence ended; mirrors ``proctor.v1.FinishReason`` (the API maps one to the other)."""

    EOS = "eos"
    LENGTH = "length"
    STOP_STRING = "stop_string"
    STOP_TOKEN = "stop_token"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    ERROR = "error"
    CONSTRAINT_COMPLETE = "constraint_complete"
    DEAD_END = "dead_end"
    FORBIDDEN_PHRASE = "forbidden_phrase"
    REPETITION = "repetition"
    STOP_CRITERION = "stop_criterion"
    BLOCKED = "blocked"  # an input screen refused the input: nothing was generated (the API's, never the engine's)
    MODERATED = "moderated"  # an output moderator withheld the output (the API's response only, never the engine's)
    CLOSED_AT_BUDGET = "closed_at_budget"  # the JSON was ended with its shortest valid ending (engine/closing.py)


@dataclass(frozen=True, slots=True)
class TokenAlternative:
    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenDetail:
    """Per-token details: raw logprob (model) and final logprob (the distribution sampled from)."""

    token_id: int
    text: str
    logprob: float
    final_logprob: float
    top_logprobs: tuple[TokenAlternative, ...] = ()
    removed_by: str = ""  # the mask or processor that removed the model's top choice, if any
    allowed_count: int = -1  # tokens the constraint allowed at this step (-1: no constraint)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    decode_steps: int = 0  # decode forwards after the prefill (engine/drafting.py: several tokens to one)
    drafted_tokens: int = 0  # proposed ahead of the model: forced by the constraint or looked up
    accepted_tokens: int = 0  # of those, verified and kept
    closing_tokens: int = 0  # the last tokens, forced to end the JSON validly within the budget (engine/closing.py)
    reasoning_tokens: int = 0  # of completion_tokens, the thought's (its markers included: engine/thought.py)


@dataclass(frozen=True, slots=True)
class Timings:
    queue_ms: float
    time_to_first_token_ms: float
    total_ms: float


@dataclass(frozen=True, slots=True)
class SchemaCheck:
    """Server-side validation of a JSON output against its schema."""

    valid: bool
    errors: tuple[str, ...] = ()  # messages for people: they quote the output
    sites: tuple[tuple[str, str], ...] = ()  # each error's (JSON path, keyword): readable where the messages are sealed


@dataclass(frozen=True, slots=True)
class FormatUse:
    """One ``format`` in a JSON schema and how it was held: "enforced" by the mask, "validated"
    (the mask enforces an approximation or nothing; the server's validator decides), or
    "annotation" (a format the specification does not define: it constrains nothing)."""

    path: str
    format: str
    handling: str


@dataclass(frozen=True, slots=True)
class ConstraintSummary:
    """Which constraint a request ran under and how it was compiled.

    ``exact`` False: the validated fallback — the mask enforces a superset of the schema with the
    ``relaxed`` keywords (``"uniqueItems at #/properties/tags"``) dropped, and each output is
    validated against the full schema and retried within a budget.
    """

    kind: str
    backend: str
    spec_sha256: str
    schema_ref: str = ""
    cache_hit: bool = False
    compile_ms: float = 0.0
    exact: bool = True
    relaxed: tuple[str, ...] = ()
    formats: tuple[FormatUse, ...] = ()
    # Exact thanks to the key memory (issue 56), "keyword at pointer": before it they were relaxed (the fallback).
    remembered: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Attempt:
    """One generation of a request on the validated fallback path (the last one is the output)."""

    number: int
    seed: int
    temperature: float  # 0: greedy
    completion_tokens: int
    finish_reason: FinishReason
    valid: bool
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PluginInfo:
    name: str
    version: str
    kind: str  # "logits_processor" or "stopping_criterion"


@dataclass(frozen=True, slots=True)
class Confidence:
    """A heuristic of how sure the model was over an output (not a calibrated probability of correctness).

    Over the generated tokens the model chose (forced ones left out): the chosen token's probability
    under the final distribution sampled from (exp of ``final_logprob``), and the top-2 gap ``p1 - p2``
    of the model's raw distribution at each of those steps; mean and minimum of each.
    """

    tokens: int
    mean_token_probability: float
    min_token_probability: float
    mean_top2_gap: float
    min_top2_gap: float


@dataclass(frozen=True, slots=True)
class ReturnedSequence:
    """One finished beam of a beam search, best first (the first is also the request's own output)."""

    token_ids: tuple[int, ...]
    text: str
    score: float  # beams: sum(logprob) / generated ** length_penalty (generate()'s); samples: sum(logprob)
    finish_reason: FinishReason
    audit_id: str = ""  # samples: each completion's own record ("": the call's)
    details: tuple[TokenDetail, ...] = ()  # each token's details (beams: for the audit record, when it keeps them)
    receipt: str = ""  # samples: the log's signed receipt of the completion's own record


@dataclass(frozen=True, slots=True)
class PromptTruncation:
    """How ``context_overflow`` shortened an input to fit the context (only when it did)."""

    policy: str
    original_prompt_tokens: int
    prompt_tokens: int
    dropped_messages: int = 0
    dropped_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PhraseInclusion:
    """Whether the returned text includes one ``must_include`` phrase."""

    phrase: str
    included: bool


@dataclass(frozen=True, slots=True)
class ModerationVerdict:
    """What one input screen or output moderator decided ("allow" or "block"), for the response and the audit."""

    name: str
    version: str
    kind: str  # "input_screen" or "output_moderator"
    verdict: str  # "allow", "block", or "error" (the plugin raised; the call failed)
    score: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One step's output for one request.

    ``text`` is the newly releasable text (held-back stop-string prefixes and incomplete UTF-8
    are released later). The last event has ``finish_reason`` set, plus usage and timings; an
    engine fault sets ``error`` and ``finish_reason=ERROR``.
    """

    request_id: str
    token_ids: tuple[int, ...] = ()
    text: str = ""
    details: tuple[TokenDetail, ...] = ()
    finish_reason: FinishReason | None = None
    finish_detail: str = ""
    usage: Usage | None = None
    timings: Timings | None = None
    seed: int = 0
    error: str | None = None
    constraint: ConstraintSummary | None = None
    schema_check: SchemaCheck | None = None
    plugins: tuple[PluginInfo, ...] = ()
    attempts: tuple[Attempt, ...] = ()  # validated fallback only: every attempt, the returned one last
    confidence: Confidence | None = None  # final event only, when the request asked for it
    must_include: tuple[PhraseInclusion, ...] = ()  # final event only: one per must_include phrase
    prompt_truncation: PromptTruncation | None = None  # final event only, when the input was shortened
    sequences: tuple[ReturnedSequence, ...] = ()  # final event only, beam search: the returned beams, best first
    moderation: tuple[ModerationVerdict, ...] = ()  # final event only: the screens' and moderators' verdicts
    receipt: str = ""  # final event only, as answered: the log's signed receipt of the call's record
    # A thinking model's thought (its markers left out), apart from ``text``, the answer (engine/thought.py).
    reasoning: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
