"""Which text opens and closes a model's thought: the reasoning parsers, one table (issue 56; vLLM's
``--reasoning-parser`` holds one class per family, here one row each).

``proctor serve --reasoning-parser NAME``: a name from ``PARSERS``; ``auto`` (the default) finds a thinking section
in the chat template and the vocabulary (a marker in the template, both markers single tokens of the
vocabulary) and names the parser by who opens it: ``deepseek_r1`` when the generation prompt ends with the start
marker, ``qwen3`` when the model opens it; ``none`` turns sections off. Markers are matched as token ids, never as
text, so a thought that quotes ``</think>`` in pieces does not end it (vLLM's parsers do the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ParserSpec:
    """A family's section: its start and end text, and whether its chat template opens the section itself."""

    start: str
    end: str
    template_opens: bool


PARSERS: dict[str, ParserSpec] = {
    "qwen3": ParserSpec("<think>", "</think>", template_opens=False),  # Qwen3, SmolLM3: the model opens it
    "deepseek_r1": ParserSpec("<think>", "</think>", template_opens=True),  # R1 distills: the prompt ends "<think>\n"
}
PARSER_NAMES = ("auto", "none", *PARSERS)


@dataclass(frozen=True, slots=True)
class ThoughtMarkers:
    """The serving model's section markers, as texts and as the single token ids that spell them."""

    parser: str
    start_text: str
    end_text: str
    start_id: int
    end_id: int


def single_token(tokenizer: Any, text: str) -> int | None:
    """The one token id that spells ``text`` in this vocabulary, else None."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


def resolve_markers(name: str, tokenizer: Any) -> ThoughtMarkers | None:
    """The markers ``--reasoning-parser NAME`` serves with; ValueError when a named parser's markers are not single
    tokens of this model's vocabulary (said at start-up, not per request)."""
    if name not in PARSER_NAMES:
        raise ValueError(f"--reasoning-parser must be one of {', '.join(PARSER_NAMES)}, got {name!r}")
    if name == "none":
        return None
    if name == "auto":
        return _detect(tokenizer)
    spec = PARSERS[name]
    start, end = single_token(tokenizer, spec.start), single_token(tokenizer, spec.end)
    if start is None or end is None:
        missing = spec.start if start is None else spec.end
        raise ValueError(f"--reasoning-parser {name}: this model's vocabulary has no single token for {missing!r} "
                         "(use --reasoning-parser none or auto)")
    return ThoughtMarkers(name, spec.start, spec.end, start, end)


def _detect(tokenizer: Any) -> ThoughtMarkers | None:
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    for name, spec in PARSERS.items():
        if spec.start not in template and spec.end not in template:
            continue
        start, end = single_token(tokenizer, spec.start), single_token(tokenizer, spec.end)
        if start is None or end is None:
            continue
        opens = _generation_prompt(tokenizer).rstrip().endswith(spec.start)
        named = next((n for n, s in PARSERS.items() if (s.start, s.end, s.template_opens) ==
                      (spec.start, spec.end, opens)), name)
        return ThoughtMarkers(named, spec.start, spec.end, start, end)
    return None


def _generation_prompt(tokenizer: Any) -> str:
    try:
        return str(tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                                 add_generation_prompt=True))
    except Exception:  # a template that needs more than one user turn: its own opening is not known
        return ""
