"""The rules a converted request must keep: every rule names the protobuf field it concerns.

Called once per request by api/check_request.py, after the message-level checks (``size_limits.py``);
all violations are collected and returned together, so a client fixes them in one go. Token ids are
checked against the model's vocabulary here too, when the caller knows its size.
"""

from __future__ import annotations

import json
import math

from proctor.api.caller_limits import output_limits
from proctor.config import Settings
from proctor.domain import FieldViolation, RequestValidationError
from proctor.domain.output_budget import OutputLimits, output_budget
from proctor.domain.reasoning import MAX_REASONING_TOKENS
from proctor.domain.request import CHAT_ROLES, MAX_SUBJECT_CHARS, GenerationRequest, valid_subject

MAX_TOP_LOGPROBS = 20
MAX_SEED = 2**64 - 1
MAX_REPETITION = 64
MAX_MUST_INCLUDE_CHARS = 256
MAX_SAMPLES = 16  # num_return_sequences without beam search: independent sampled completions
MAX_NUM_BEAMS = 16


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


class Violations(list[FieldViolation]):
    """Collects every bad field of a request."""

    def __call__(self, field: str, description: str) -> None:
        self.append(FieldViolation(field, description))


def validate(request: GenerationRequest, settings: Settings, vocab_size: int | None = None,
             limits: OutputLimits | None = None) -> list[FieldViolation]:
    """Every violation of ``request`` (``vocab_size``: the model's, for the token-id checks; None skips them;
    ``limits``: the output's, the caller's cap among them; None: the server's alone)."""
    bad = Violations()
    most = _validate_budget(request, limits or output_limits(settings, None), bad)
    _validate_input(request, settings, bad)
    s = request.sampling
    if s.temperature is not None and (not _finite(s.temperature) or s.temperature < 0):
        bad("sampling.temperature", f"must be a finite number >= 0 (0 means greedy), got {s.temperature}")
    if s.top_k < 0:
        bad("sampling.top_k", f"must be >= 0 (0 means off), got {s.top_k}")
    if not (_finite(s.top_p) and 0 < s.top_p <= 1):
        bad("sampling.top_p", f"must be in (0, 1], got {s.top_p}")
    if not (_finite(s.min_p) and 0 <= s.min_p <= 1):
        bad("sampling.min_p", f"must be in [0, 1], got {s.min_p}")
    if not (_finite(s.repetition_penalty) and s.repetition_penalty > 0):
        bad("sampling.repetition_penalty", f"must be > 0 (1 means none), got {s.repetition_penalty}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(s, name)
        if not (_finite(value) and -2 <= value <= 2):
            bad(f"sampling.{name}", f"must be in [-2, 2], got {value}")
    if s.no_repeat_ngram_size < 0:
        bad("sampling.no_repeat_ngram_size", f"must be >= 0, got {s.no_repeat_ngram_size}")
    _validate_controls(request, most, bad)
    _validate_stopping(request, settings, bad)
    _validate_masks(request, settings, bad)
    if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
        bad("top_logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}, got {request.top_logprobs}")
    if request.sampling.num_beams > 1:
        _validate_beams(request, bad)
    if vocab_size is not None:
        _validate_vocabulary(request, vocab_size, bad)
    if not valid_subject(request.subject_id):
        bad("subject_id", f"at most {MAX_SUBJECT_CHARS} printable characters, got {len(request.subject_id)}")
    return list(bad)


def _validate_beams(request: GenerationRequest, bad: Violations) -> None:
    """What beam search (engine/beam.py) does not combine with."""
    sampling, stopping = request.sampling, request.stopping
    if sampling.num_beams > MAX_NUM_BEAMS:
        bad("sampling.num_beams", f"must be in [2, {MAX_NUM_BEAMS}] for beam search")
    if not sampling.greedy:
        bad("sampling.temperature", "beam search is deterministic here: leave it unset or 0")
    if sampling.has_penalties or sampling.typical_p < 1.0 or sampling.forced_tokens or sampling.greedy_first_tokens:
        bad("sampling", "penalties, typical_p, forced_tokens and greedy_first_tokens are not offered with beam search")
    if stopping.stop or stopping.repetition is not None or stopping.must_include:
        bad("stopping", "stop strings, the repetition stop and must_include are not offered with beam search")
    if request.logit_bias or request.logits_processors or request.stopping_criteria:
        bad("logits_processors", "logit_bias and plugins are not offered with beam search")


def _validate_vocabulary(request: GenerationRequest, vocab_size: int, bad: Violations) -> None:
    """Token ids the request names must be inside the model's vocabulary."""
    outside = f"is outside the vocabulary (size {vocab_size})"
    for index, token_id in enumerate(request.stopping.stop_token_ids):
        if token_id >= vocab_size:
            bad(f"stopping.stop_token_ids[{index}]", f"{token_id} {outside}")
    for token_id, _ in request.logit_bias:
        if token_id >= vocab_size:
            bad(f"logit_bias[{token_id}]", f"{token_id} {outside}")
    for index, token_id in enumerate(request.allowed_token_ids):
        if token_id >= vocab_size:
            bad(f"allowed_token_ids[{index}]", f"{token_id} {outside}")
    for position, token_id in request.sampling.forced_tokens:
        if token_id >= vocab_size:
            bad(f"sampling.forced_tokens[{position}]", f"token {token_id} {outside}")


def _validate_input(request: GenerationRequest, settings: Settings, bad: Violations) -> None:
    if request.messages is None:
        if not request.prompt:
            bad("prompt", "the input is empty: set a non-empty prompt or chat messages")
        return
    if not request.messages:
        bad("messages", "the input is empty: at least one chat message is needed")
    for index, message in enumerate(request.messages):
        if message.role not in CHAT_ROLES:
            bad(f"messages.messages[{index}].role",
                f"unknown role {message.role!r}; expected one of {', '.join(sorted(CHAT_ROLES))}")
    if request.tools_json and not _tool_list(request.tools_json):
        bad("messages.tools_json", 'must be a JSON array of {"type": "function", "function": {"name": ...}} tools')
    _validate_reasoning(request, bad)


def _validate_reasoning(request: GenerationRequest, bad: Violations) -> None:
    """A thought's bounds and the template's variables (what only the model can tell: engine/template_kwargs.py)."""
    most = request.reasoning.max_tokens
    if most is not None and not 0 <= most <= MAX_REASONING_TOKENS:
        bad("reasoning.max_tokens", f"must be between 0 and {MAX_REASONING_TOKENS}, got {most}")
    if request.chat_template_kwargs:
        try:
            kwargs = json.loads(request.chat_template_kwargs)
        except ValueError:
            kwargs = None
        if not isinstance(kwargs, dict):
            bad("chat_template_kwargs_json", "must be a JSON object of the chat template's variables")
    if request.messages is None and request.chat_template_kwargs:
        bad("chat_template_kwargs_json", "needs chat messages: a plain prompt is not rendered with the chat template")


def _tool_list(text: str) -> bool:
    """Whether ``text`` is a JSON array of named function tools (what chat templates take as ``tools``)."""
    try:
        tools = json.loads(text)
    except ValueError:
        return False
    return isinstance(tools, list) and all(
        isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str) for t in tools)


def _validate_budget(request: GenerationRequest, limits: OutputLimits, bad: Violations) -> int:
    """The output budget's violations (domain/output_budget.py); the most new tokens the request may have."""
    try:
        return output_budget(request.stopping, limits).max_new_tokens
    except RequestValidationError as exc:
        bad.extend(exc.violations)
        asked = request.stopping.max_new_tokens
        return asked if asked is not None else limits.server_default


def _validate_stopping(request: GenerationRequest, settings: Settings, bad: Violations) -> None:
    st = request.stopping
    for index, stop in enumerate(st.stop):
        if not stop:
            bad(f"stopping.stop[{index}]", "stop strings must not be empty")
        elif len(stop) > settings.max_stop_string_chars:
            bad(f"stopping.stop[{index}]", f"longer than {settings.max_stop_string_chars} characters")
    for index, token_id in enumerate(st.stop_token_ids):
        if token_id < 0:
            bad(f"stopping.stop_token_ids[{index}]", f"token ids are >= 0, got {token_id}")
    if st.repetition is not None:
        if not 1 <= st.repetition.ngram_size <= MAX_REPETITION:
            bad("stopping.repetition.ngram_size",
                f"must be between 1 and {MAX_REPETITION}, got {st.repetition.ngram_size}")
        if not 2 <= st.repetition.repeats <= MAX_REPETITION:
            bad("stopping.repetition.repeats", f"must be between 2 and {MAX_REPETITION}, got {st.repetition.repeats}")


def _validate_controls(request: GenerationRequest, limit: int, bad: Violations) -> None:
    """typical_p, greedy_first_tokens, forced_tokens (``limit``: the output budget's most tokens) and must_include
    (ids against the vocabulary: the engine)."""
    s = request.sampling
    if not (_finite(s.typical_p) and 0 < s.typical_p <= 1):
        bad("sampling.typical_p", f"must be in (0, 1] (1 means off), got {s.typical_p}")
    if not (_finite(s.first_tokens_temperature) and 0 <= s.first_tokens_temperature <= 2):
        bad("sampling.first_tokens_temperature", f"must be in [0, 2] (0: greedy), got {s.first_tokens_temperature}")
    if s.greedy_first_tokens < 0:
        bad("sampling.greedy_first_tokens", f"must be >= 0 (0 means off), got {s.greedy_first_tokens}")
    for position, token_id in s.forced_tokens:
        field = f"sampling.forced_tokens[{position}]"
        if not 0 <= position < limit:
            bad(field, f"the position must be in [0, max_new_tokens) = [0, {limit}), got {position}")
        if token_id < 0:
            bad(field, f"token ids are >= 0, got {token_id}")
    if not _finite(s.length_penalty):
        bad("sampling.length_penalty", f"must be a finite number, got {s.length_penalty}")
    if s.num_beams < 1:
        bad("sampling.num_beams", f"must be >= 1, got {s.num_beams}")
    returned = request.num_return_sequences
    if s.num_beams > 1 and not 1 <= returned <= s.num_beams:  # the rest of beams: the engine's (engine/beam.py)
        bad("num_return_sequences", f"must be in [1, num_beams = {s.num_beams}], got {returned}")
    elif s.num_beams <= 1 and returned != 1 and (s.greedy or not 1 <= returned <= MAX_SAMPLES):
        bad("num_return_sequences", f"without beam search, more than one needs sampling (temperature > 0: greedy "
                                    f"completions would be identical), at most {MAX_SAMPLES}; got {returned}")
    for index, phrase in enumerate(request.stopping.must_include):
        if not phrase:
            bad(f"stopping.must_include[{index}]", "a phrase must not be empty")
        elif len(phrase) > MAX_MUST_INCLUDE_CHARS:
            bad(f"stopping.must_include[{index}]", f"longer than {MAX_MUST_INCLUDE_CHARS} characters")


def _validate_masks(request: GenerationRequest, settings: Settings, bad: Violations) -> None:
    """Forbidden phrases, logit bias and allowed ids (the engine checks ids against the vocabulary)."""
    for index, phrase in enumerate(request.forbidden.phrases):
        problem = forbidden_phrase_problem(phrase, request.forbidden.whole_word, settings.max_forbidden_phrase_chars)
        if problem:
            bad(f"forbidden.phrases[{index}]", problem)
    # Counts were checked on the message (size_limits.py): here each entry is within its limit's count.
    for token_id, bias in request.logit_bias:
        if token_id < 0:
            bad(f"logit_bias[{token_id}]", "token ids are >= 0")
        if not (_finite(bias) and -100 <= bias <= 100):
            bad(f"logit_bias[{token_id}]", f"the bias must be in [-100, 100], got {bias}")
    for index, token_id in enumerate(request.allowed_token_ids):
        if token_id < 0:
            bad(f"allowed_token_ids[{index}]", f"token ids are >= 0, got {token_id}")


def forbidden_phrase_problem(phrase: str, whole_word: bool, max_chars: int) -> str:
    """Why a forbidden phrase is unusable ("" when it is fine)."""
    if not phrase.strip():
        return "a forbidden phrase must not be empty or only spaces"
    if len(phrase) > max_chars:
        return f"longer than {max_chars} characters"
    if "\ufffd" in phrase:
        return "must not contain U+FFFD (the replacement character)"
    if whole_word and not any(ch.isalnum() for ch in phrase):
        return "with whole_word, a phrase needs at least one letter or digit"
    return ""
