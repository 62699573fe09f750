"""Frozen request dataclasses: what the API hands to the engine after validation."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from proctor.domain.reasoning import ReasoningParams

CHAT_ROLES = frozenset({"system", "user", "assistant"})
MAX_SUBJECT_CHARS = 256  # subject_id: a customer or case id (audit erasure and retention)


def valid_subject(subject: str) -> bool:
    """A subject id the key store may name: at most MAX_SUBJECT_CHARS printable characters."""
    return len(subject) <= MAX_SUBJECT_CHARS and subject.isprintable()


class ContextOverflow(enum.StrEnum):
    """What to do when the input and max_new_tokens do not both fit the context (engine/context_policy.py).

    The one list of these names: the wire's ``CONTEXT_OVERFLOW_<NAME>`` (api/convert.py derives its tables
    from it) and the audit record's value (a ``str``, so records read as before)."""

    REFUSE = "refuse"
    DROP_OLDEST_TURNS = "drop_oldest_turns"
    KEEP_START_AND_END = "keep_start_and_end"


class Speculation(enum.StrEnum):
    """Prompt-lookup speculation for one request (engine/drafting.py). Names are the wire's
    (``SPECULATION_<NAME>``); DEFAULT follows the server's ``--speculation``."""

    DEFAULT = "default"
    ON = "on"
    OFF = "off"


class EarlyStopping(enum.StrEnum):
    """Beam search's stopping rule. Names are the wire's (``BEAM_EARLY_STOPPING_<NAME>``); values are
    generate()'s ``early_stopping`` (False: its heuristic, True: when num_beams are finished, "never"),
    which is also what audit records hold."""

    HEURISTIC = "false"
    WHEN_FULL = "true"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters; ``temperature`` None or 0 means greedy.

    ``typical_p`` 1 is off; ``greedy_first_tokens``: the first N generated tokens are greedy;
    ``forced_tokens``: (generated position, token id) pairs, sorted by position.
    """

    temperature: float | None = None
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    seed: int | None = None
    typical_p: float = 1.0
    num_beams: int = 1  # > 1: beam search (engine/beam.py), with generate()'s semantics
    length_penalty: float = 1.0  # beam search: a finished beam scores sum(logprob) / generated_tokens ** this
    early_stopping: str = EarlyStopping.HEURISTIC  # beam search (EarlyStopping); a str as records hold it
    greedy_first_tokens: int = 0
    first_tokens_temperature: float = 0.0  # the temperature of those first tokens (0: greedy)
    forced_tokens: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        # Stored as sorted pairs, whatever iterable of pairs came in (the audit trail gives JSON lists back),
        # so a replayed request equals the recorded one.
        object.__setattr__(self, "forced_tokens", tuple(sorted((int(p), int(t)) for p, t in self.forced_tokens)))

    @property
    def greedy(self) -> bool:
        return not self.temperature

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.no_repeat_ngram_size > 0
        )


@dataclass(frozen=True, slots=True)
class RepetitionParams:
    """Stop when the last ``ngram_size`` tokens occurred ``repeats`` times in a row."""

    ngram_size: int
    repeats: int


@dataclass(frozen=True, slots=True)
class StoppingParams:
    """Stopping parameters; ``max_new_tokens`` None means the server default."""

    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition: RepetitionParams | None = None
    must_include: tuple[str, ...] = ()  # the end is held off until the output contains each (controls.py)
    close_at_budget: bool = True  # a JSON output running short of tokens gets its shortest valid ending (budget.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "must_include", tuple(self.must_include))  # (a list when read back from JSON)


@dataclass(frozen=True, slots=True)
class ForbiddenParams:
    """Phrases the output must never contain (the server's list is merged in by the engine)."""

    phrases: tuple[str, ...] = ()
    case_insensitive: bool = True
    whole_word: bool = False


@dataclass(frozen=True, slots=True)
class PluginCall:
    """A named plugin with its parameters (plain JSON values); ``field`` is where it came from."""

    name: str
    params: dict[str, object]
    field: str


@dataclass(frozen=True, slots=True)
class ConstraintRequest:
    """The constraint as asked (before registry lookup and compilation).

    ``kind`` is "json_schema", "regex", "choice", "grammar" or "schema_ref"; ``text`` holds the
    schema JSON, the regex, the grammar or the schema reference; ``options`` the choices.
    ``backend`` is "auto" or an engine name; ``field`` is the request field it came from.
    ``parsed``: a JSON schema's object, when the door read it as one (the HTTP door): ``text`` is its JSON, for
    the limits and the record, and nothing parses it again (not part of equality; never recorded).
    """

    kind: str
    text: str = ""
    options: tuple[str, ...] = ()
    grammar_syntax: str = "lark"
    backend: str = "auto"
    flexible_whitespace: bool = False
    exact_only: bool = False  # refuse a JSON schema no engine enforces exactly (no validated fallback)
    parsed: tuple[object, ...] = field(default=(), compare=False, repr=False)

    @property
    def field(self) -> str:
        return {"choice": "choice.options", "grammar": "grammar.text"}.get(self.kind, self.kind)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One validated generation request. Exactly one of ``prompt`` and ``messages`` is set.

    ``deadline`` is an absolute ``time.monotonic()`` value (None: no deadline).
    """

    request_id: str
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    tools_json: str = ""  # the tools shown to the model with the messages (a JSON array of function tools)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopping: StoppingParams = field(default_factory=StoppingParams)
    top_logprobs: int = 0
    token_details: bool = False
    deadline: float | None = None
    constraint: ConstraintRequest | None = None
    forbidden: ForbiddenParams = field(default_factory=ForbiddenParams)
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] = ()
    logits_processors: tuple[PluginCall, ...] = ()
    stopping_criteria: tuple[PluginCall, ...] = ()
    audit_top_n: int = 0  # alternatives the audit trail records per token (set by the server, not the caller)
    audited: bool = False
    confidence: bool = False  # report a Confidence summary with the final event
    num_return_sequences: int = 1  # beam search: the best this many finished beams (<= num_beams)
    context_overflow: str = ContextOverflow.REFUSE  # what to do when the input does not fit (ContextOverflow)
    input_screens: tuple[PluginCall, ...] = ()  # run on the rendered input before generation (server defaults first)
    output_moderators: tuple[PluginCall, ...] = ()  # run on the finished output (server defaults first)
    speculation: str = Speculation.DEFAULT  # prompt-lookup drafts (Speculation); never changes the output
    cache_prompt: bool = True  # the caller's wish: this prompt's chunks may outlive the request in the prefix cache
    subject_id: str = ""  # whose data the call holds (audit erasure and retention); "": the caller's
    # The prefix cache's namespace for this prompt's chunks, set by the server (api/call_runner.admit): the
    # caller's name ("" when the server is open); None: nothing of the prompt outlives the request, and
    # nothing cached is read for it.
    prefix_cache_scope: str | None = None
    reasoning: ReasoningParams = field(default_factory=ReasoningParams)  # a thinking model's section (reasoning.py)
    chat_template_kwargs: str = ""  # a JSON object passed to the chat template ("": none), enable_thinking among them

    @property
    def wants_details(self) -> bool:
        return self.token_details or self.top_logprobs > 0 or self.audited
