"""Shortening an input that does not fit the context with room for its output (``context_overflow``).

``refuse`` (the default) never changes the input: one that does not fit is refused, one that fits gets
the room that is left (``prepare_request`` caps ``max_new_tokens``). The other two make room for the
whole ``max_new_tokens`` (or what the context allows at most, leaving the input one token):

* ``drop_oldest_turns`` (chat messages only): the oldest messages after the leading system message(s)
  go first, as few as possible (a binary search over how many: rendering is monotone in the turns
  kept); the last message always stays — when it alone does not fit, the request is refused;
* ``keep_start_and_end``: the first and last halves of the room, in tokens, with the middle dropped
  (the start holds the instructions, the end the question and the generation prompt).

The result is deterministic in the request, so a replay of the audit record shortens it the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from proctor.domain import GenerationRequest, PromptTruncation, RequestValidationError
from proctor.domain.request import ContextOverflow

Render = Callable[[GenerationRequest], tuple[str, bool]]


def input_room(context_length: int, budget: int) -> int:
    """Input tokens allowed so that the output keeps ``budget`` (at least one input token)."""
    return max(1, context_length - budget)


def shorten(tokenizer: Any, request: GenerationRequest, render: Render, room: int
            ) -> tuple[str, list[int], PromptTruncation | None]:
    """(rendered text, ids, what was cut) for ``request`` under its policy with ``room`` input tokens."""
    text, add_special = render(request)
    ids = _ids(tokenizer, text, add_special)
    if len(ids) <= room:
        return text, ids, None
    if request.context_overflow == ContextOverflow.KEEP_START_AND_END:
        head = room // 2
        kept = ids[:head] + ids[len(ids) - (room - head):]
        truncation = PromptTruncation(ContextOverflow.KEEP_START_AND_END, len(ids), len(kept),
                                      dropped_tokens=len(ids) - len(kept))
        return tokenizer.decode(kept, skip_special_tokens=False), kept, truncation
    return _drop_turns(tokenizer, request, render, room, len(ids))


def _drop_turns(tokenizer: Any, request: GenerationRequest, render: Render, room: int,
                original: int) -> tuple[str, list[int], PromptTruncation]:
    messages = request.messages
    if messages is None:
        raise RequestValidationError.single("context_overflow", "drop_oldest_turns needs chat messages, not a prompt")
    system = 0
    while system < len(messages) and messages[system].role == "system":
        system += 1

    def attempt(dropped: int) -> tuple[str, list[int]]:
        kept = (*messages[:system], *messages[system + dropped:])
        text, add_special = render(dataclasses.replace(request, messages=kept))
        return text, _ids(tokenizer, text, add_special)

    most = len(messages) - system - 1  # the last message always stays
    if most < 1 or len(attempt(most)[1]) > room:
        raise RequestValidationError.single(
            "messages", f"the input does not fit {room} tokens (the context less max_new_tokens) even with only "
                        "the system message(s) and the last message kept")
    low, high = 1, most  # the fewest dropped messages that fit lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if len(attempt(middle)[1]) <= room:
            high = middle
        else:
            low = middle + 1
    text, ids = attempt(low)
    return text, ids, PromptTruncation(ContextOverflow.DROP_OLDEST_TURNS, original, len(ids), dropped_messages=low)


def _ids(tokenizer: Any, text: str, add_special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special)["input_ids"])
