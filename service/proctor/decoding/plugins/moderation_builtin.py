"""The shipped input screen and output moderator (docs/plugins.md). Heuristics, not a security boundary.

* ``prompt_injection`` (input screen): blocks an input in which a rule matches: a request to ignore
  or override earlier instructions, to reveal the system prompt, a "you are now DAN / developer
  mode" switch, or a line that plays a system turn (``System:``, ``[SYSTEM]``, ``<|im_start|>system``,
  ``<<SYS>>``) inside the caller's text. Text is compared after NFKC and case folding, with
  zero-width characters removed. It stops the common copy-paste attacks and nothing clever: a
  paraphrase, another language or an encoding passes. Treat it as a tripwire that leaves a record.
* ``keyword_score`` (output moderator): score = sum over the configured terms of weight × the
  number of times the term occurs in the output (same normalisation); at or above ``threshold``
  the output is withheld and the caller gets ``reply``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from proctor.decoding.plugins.api import (
    ModerationInput,
    PluginContext,
    PluginParamsError,
    PluginSpec,
    ScreenInput,
    Verdict,
)

MAX_PATTERNS = 32
MAX_PATTERN_CHARS = 256
MAX_TERMS = 1000
MAX_TERM_CHARS = 200
MAX_REPLY_CHARS = 2000
SCREEN_REPLY = "I'm sorry, but I can't help with that request."
MODERATOR_REPLY = "I'm sorry, but I can't share that response."
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))
_VERB = r"(?:ignore|disregard|forget|override|bypass)"
RULES: dict[str, re.Pattern[str]] = {
    "ignore_previous": re.compile(
        rf"\b{_VERB}\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+|my\s+)?"
        r"(?:previous|prior|above|earlier|preceding|foregoing|original|system|developer)\s+"
        r"(?:instructions?|prompts?|rules|directions|guidelines|directives|messages?)\b"),
    "reveal_system_prompt": re.compile(
        r"\b(?:reveal|show|print|repeat|output|display|leak|tell)\s+(?:me\s+)?(?:your|the)\s+"
        r"(?:system\s+(?:prompt|message)|(?:hidden|initial|original|secret)\s+(?:instructions?|prompt))\b"),
    "mode_switch": re.compile(
        r"\b(?:you\s+are\s+now|from\s+now\s+on\s+you\s+are|act\s+as|pretend\s+(?:to\s+be|you\s+are))\s+"
        r"(?:an?\s+|in\s+)?(?:dan\b|unrestricted|unfiltered|jailbroken|developer\s+mode)"),
    "fake_system_turn": re.compile(
        r"(?m)^[ \t]*(?:\[/?\s*system\s*\]|<<\s*sys\s*>>|<\|im_start\|>\s*system\b|<\|\s*system\s*\|>"
        r"|#{1,6}[ \t]*system\b|system(?:[ \t]+prompt)?[ \t]*:)"),
}


def normalise(text: str) -> str:
    """NFKC, case folding, zero-width characters removed: the form every rule and term is matched on."""
    return unicodedata.normalize("NFKC", text).casefold().translate(_ZERO_WIDTH)


def _reply(params: dict[str, Any], default: str) -> str:
    reply = params.get("reply", default)
    if not isinstance(reply, str) or not reply.strip() or len(reply) > MAX_REPLY_CHARS:
        raise PluginParamsError(f"'reply' must be a non-empty string of at most {MAX_REPLY_CHARS} characters")
    return reply


def _unknown(params: dict[str, Any], known: set[str]) -> None:
    unknown = set(params) - known
    if unknown:
        raise PluginParamsError(f"unknown parameters: {', '.join(sorted(unknown))}")


def _strings(params: dict[str, Any], key: str, default: list[str]) -> list[str]:
    value = params.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PluginParamsError(f"'{key}' must be a list of strings")
    return value


class PromptInjection:
    def __init__(self, rules: dict[str, re.Pattern[str]], roles: frozenset[str], reply: str) -> None:
        self._rules = rules
        self._roles = roles
        self._reply = reply

    def __call__(self, screen_input: ScreenInput) -> Verdict:
        if screen_input.messages is None:
            texts = [screen_input.text]
        else:  # the caller's own system turns are legitimate: only the configured roles are read
            texts = [content for role, content in screen_input.messages if role in self._roles]
        normalised = [normalise(text) for text in texts]
        matched = [name for name, rule in self._rules.items() if any(rule.search(text) for text in normalised)]
        if not matched:
            return Verdict.allow(0.0)
        return Verdict.block(f"matched {', '.join(matched)}", self._reply, float(len(matched)))


def _prompt_injection(params: dict[str, Any], context: PluginContext) -> PromptInjection:
    _unknown(params, {"rules", "patterns", "roles", "reply"})
    names = _strings(params, "rules", list(RULES))
    bad = [name for name in names if name not in RULES]
    if bad:
        raise PluginParamsError(f"unknown rules {', '.join(bad)}; the rules are {', '.join(RULES)}")
    rules = {name: RULES[name] for name in names}
    patterns = _strings(params, "patterns", [])
    if len(patterns) > MAX_PATTERNS or any(not p or len(p) > MAX_PATTERN_CHARS for p in patterns):
        raise PluginParamsError(f"at most {MAX_PATTERNS} 'patterns' of 1 to {MAX_PATTERN_CHARS} characters")
    for index, pattern in enumerate(patterns):
        try:
            rules[f"patterns[{index}]"] = re.compile(normalise(pattern))
        except re.error as exc:
            raise PluginParamsError(f"patterns[{index}] is not a regular expression: {exc}") from exc
    if not rules:
        raise PluginParamsError("no rules left: name at least one rule or pattern")
    roles = _strings(params, "roles", ["user"])
    return PromptInjection(rules, frozenset(roles), _reply(params, SCREEN_REPLY))


class KeywordScore:
    def __init__(self, weights: dict[str, float], pattern: re.Pattern[str], threshold: float, reply: str) -> None:
        self._weights = weights
        self._pattern = pattern
        self._threshold = threshold
        self._reply = reply

    def __call__(self, moderation_input: ModerationInput) -> Verdict:
        counts: dict[str, int] = {}
        for match in self._pattern.finditer(normalise(moderation_input.output)):
            counts[match.group(0)] = counts.get(match.group(0), 0) + 1
        score = sum(self._weights[term] * n for term, n in counts.items())
        terms = ", ".join(f"{term!r}×{n}" for term, n in sorted(counts.items()))
        if score < self._threshold:
            return Verdict.allow(score, f"score {score:g} < threshold {self._threshold:g}")
        return Verdict.block(f"score {score:g} >= threshold {self._threshold:g} ({terms})", self._reply, score)


def _keyword_score(params: dict[str, Any], context: PluginContext) -> KeywordScore:
    _unknown(params, {"terms", "threshold", "whole_word", "reply"})
    raw = params.get("terms")
    if isinstance(raw, list):
        raw = dict.fromkeys(raw, 1.0) if all(isinstance(t, str) for t in raw) else None
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_TERMS:
        raise PluginParamsError(f"'terms' must be a list of terms or an object term → weight, 1 to {MAX_TERMS} terms")
    weights: dict[str, float] = {}
    for term, weight in raw.items():
        if not isinstance(term, str) or not term.strip() or len(term) > MAX_TERM_CHARS:
            raise PluginParamsError(f"a term is a non-empty string of at most {MAX_TERM_CHARS} characters")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) \
                or not -100 <= weight <= 100:
            raise PluginParamsError(f"the weight of {term!r} must be a number in [-100, 100]")
        weights[normalise(term)] = weights.get(normalise(term), 0.0) + float(weight)
    threshold = params.get("threshold", 1.0)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold) \
            or threshold <= 0:
        raise PluginParamsError("'threshold' must be a number above 0")
    whole_word = params.get("whole_word", True)
    if not isinstance(whole_word, bool):
        raise PluginParamsError("'whole_word' must be true or false")
    alternation = "|".join(re.escape(term) for term in sorted(weights, key=len, reverse=True))
    pattern = re.compile(rf"(?<!\w)(?:{alternation})(?!\w)" if whole_word else f"(?:{alternation})")
    return KeywordScore(weights, pattern, float(threshold), _reply(params, MODERATOR_REPLY))


MODERATION_PLUGINS = (
    PluginSpec("prompt_injection", "1.0", "input_screen", _prompt_injection,
               "block inputs that match prompt-injection heuristics (a tripwire, not a security boundary)"),
    PluginSpec("keyword_score", "1.0", "output_moderator", _keyword_score,
               "withhold outputs whose weighted count of 'terms' reaches 'threshold'"),
)
