"""Tool calls in ``<tool_call>`` blocks: the grammar that carries them, and its output rule (issue 56).

The HTTP door serves ``tool_choice: "required"`` with parallel calls, and ``auto``, as a Lark grammar: one or more
``<tool_call>`` call ``</tool_call>`` blocks a newline apart (one block when parallel calls are off), and in
``auto`` mode free text (which does not begin with ``<``) instead. Each call is JSON held to the call schema
(``{"name": <a tool>, "arguments": <its parameters>}``) by llguidance's ``%json``.

The grammar is written here, not in the door, so that its output rule (constraints/output_rule.py) reads exactly
the form it was built in: the engine's budget rule closes a call running short of tokens as a complete, valid
call, as it closes a JSON-schema output (issue 45). A prepared grammar gets the rule when its text is the very
text ``tool_calls_grammar`` writes for some call schema and framing (``tool_calls_framing`` rebuilds it to
compare), so the rule follows from the request alone: a replay of the record gets the same rule, a gRPC caller
who sends the same grammar gets it too, and grammars written before this form (recorded without a rule) are
not recognised, so their replays take the decisions they took then.

The reader knows the framing: the tags as literals, the call JSON read by a ``JsonCloser`` over the call schema,
the newline between blocks, free text (which may end anywhere: nothing to close). A block whose call is the same
as an earlier one's (name and arguments) is a weak model's loop: the reader says so and the answer ends there.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from proctor.constraints.json_schema import JsonCloser, growth_here, json_options
from proctor.constraints.json_schema import growth_texts as json_growth_texts

CALL_OPEN, CALL_CLOSE, SEPARATOR = "<tool_call>", "</tool_call>", "\n"
GUIDANCE = "x-guidance"  # llguidance's JSON options, set in the call schema
_CALL_LINE = "call: %json "


def tool_calls_grammar(call_schema: dict[str, Any], *, auto: bool, parallel: bool) -> str:
    """The Lark grammar of tool-call blocks over ``call_schema`` (``auto``: text may stand instead)."""
    schema = {**call_schema, GUIDANCE: json_options(flexible=False)}  # as a json_schema's, no free whitespace
    calls = 'block ("\\n" block)*' if parallel else "block"  # blocks a SEPARATOR apart
    start = "TEXT | calls" if auto else "calls"
    return (f"start: {start}\ncalls: {calls}\nblock: \"{CALL_OPEN}\" call \"{CALL_CLOSE}\"\n"
            f"TEXT: /[^<](?s:.)*/\n{_CALL_LINE}{json.dumps(schema)}\n")


@dataclass(frozen=True, slots=True)
class Framing:
    """How calls are framed: the call schema (without llguidance's options), text allowed, several blocks."""

    schema: dict[str, Any]
    auto: bool
    parallel: bool


@functools.lru_cache(maxsize=64)
def tool_calls_framing(grammar: str) -> Framing | None:
    """The framing ``grammar`` was written with by ``tool_calls_grammar``, or None when it is another grammar."""
    line = next((line for line in grammar.splitlines() if line.startswith(_CALL_LINE)), None)
    if line is None:
        return None
    try:
        schema = json.loads(line[len(_CALL_LINE):])
    except ValueError:
        return None
    if not isinstance(schema, dict):
        return None
    call_schema = {key: value for key, value in schema.items() if key != GUIDANCE}
    for auto in (False, True):
        for parallel in (False, True):
            if tool_calls_grammar(call_schema, auto=auto, parallel=parallel) == grammar:
                return Framing(call_schema, auto, parallel)
    return None


@dataclass(frozen=True, slots=True)
class ToolCallsRule:
    """The output rule of a tool-call grammar (constraints/output_rule.py)."""

    framing: Framing
    _calls: tuple[str, ...] = field(default=(), compare=False)  # the shortest calls' texts, shortest first
    _growth: tuple[str, ...] = field(default=(), compare=False)  # growth_texts, read once

    @classmethod
    def of(cls, framing: Framing) -> ToolCallsRule:
        calls = tuple(JsonCloser(framing.schema).endings())
        growth = json_growth_texts(framing.schema)
        if framing.parallel:
            growth += [SEPARATOR + CALL_OPEN + call + CALL_CLOSE for call in calls[:1]]
        return cls(framing, calls, tuple(growth))

    def reader(self) -> ToolCallsReader:
        return ToolCallsReader(self)

    def blocks(self, open_from: int = 0) -> list[str]:
        """A whole block at its shortest, its open tag from character ``open_from`` on."""
        return [CALL_OPEN[open_from:] + call + CALL_CLOSE for call in self._calls]

    def growth_texts(self) -> list[str]:
        """What one free token can begin: a member or item inside a call, and with parallel calls another block."""
        return list(self._growth)


class ToolCallsReader:
    """One output of a tool-call grammar, read as it is written (constraints/output_rule.py's ``OutputReader``)."""

    def __init__(self, rule: ToolCallsRule) -> None:
        self._rule = rule
        self._state = "start"  # start | open | call | close | after | separated | text | broken
        self._at = 0  # open/close: the characters of the tag read
        self._call: JsonCloser | None = None
        self._text = ""  # the call's JSON so far
        self._seen: set[tuple[str, str]] = set()  # the calls so far (name, canonical arguments)
        self.repeated = ""  # the call that repeated an earlier one: the answer should end after it

    @property
    def done(self) -> bool:
        """Text (which may end anywhere), or the one block there may be, closed."""
        return self._state == "text" or (self._state == "after" and not self._rule.framing.parallel)

    def push(self, text: str) -> None:
        for char in text:
            if self._state != "broken":
                self._char(char)

    def _char(self, c: str) -> None:
        state = self._state
        if state == "start":
            self._state = "text" if self._rule.framing.auto and c != "<" else "open"
            if self._state == "open":
                self._tag(c, CALL_OPEN)
        elif state == "open":
            self._tag(c, CALL_OPEN)
        elif state == "call":
            assert self._call is not None
            self._call.push(c)
            self._text += c
            if self._call.done:
                self._state, self._at = "close", 0
        elif state == "close":
            self._tag(c, CALL_CLOSE)
        elif state == "after":
            self._state = "separated" if c == SEPARATOR and self._rule.framing.parallel else "broken"
        elif state == "separated":
            self._state, self._at = "open", 0
            self._tag(c, CALL_OPEN)

    def _tag(self, c: str, tag: str) -> None:
        """The next character of ``tag``; when it is whole, what follows it begins."""
        if tag[self._at] != c:
            self._state = "broken"
            return
        self._at += 1
        if self._at < len(tag):
            return
        if tag == CALL_OPEN:
            self._state, self._call, self._text = "call", JsonCloser(self._rule.framing.schema), ""
        else:
            self._state = "after"
            self._closed_call()

    def _closed_call(self) -> None:
        try:
            call = json.loads(self._text)
            key = (str(call["name"]), json.dumps(call["arguments"], sort_keys=True))
        except (ValueError, KeyError, TypeError):
            return
        if key in self._seen:
            self.repeated = f"the call of {key[0]} repeats an earlier one, arguments and all"
        self._seen.add(key)

    def endings(self) -> list[str]:
        state, rule = self._state, self._rule
        if state in ("text", "after"):
            return [""]
        if state == "start":  # auto: the model chooses text or a call; either way nothing is owed yet
            return [] if rule.framing.auto else rule.blocks()
        if state == "open":
            return rule.blocks(self._at)
        if state == "separated":
            return rule.blocks()
        if state == "close":
            return [CALL_CLOSE[self._at:]]
        if state == "call":
            assert self._call is not None
            return [ending + CALL_CLOSE for ending in self._call.endings()]
        return []

    def growth_texts(self) -> list[str]:
        """Inside a call, what the call's closer says one token can begin there; elsewhere the rule's own."""
        if self._state == "call" and self._call is not None:
            return growth_here(self._call)
        return [] if self._state in ("text", "broken") else self._rule.growth_texts()
