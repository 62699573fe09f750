"""Tool calls: the ``tools`` and ``tool_choice`` of a chat request as a constraint, and the output as calls.

- ``required`` or a named function: the output is constrained by a JSON schema to
  ``{"name": <one of the tools>, "arguments": <that tool's parameters>}``, through the same constraint service
  as any ``json_schema`` (coverage, validated fallback, the server's own validation), so every call parses
  and validates by construction.
- ``auto``: a grammar lets the model choose: text that does not begin with ``<``, or ``<tool_call>`` and
  that same constrained JSON call.
- ``none``: no constraint; the tools are still shown to the model.

The tools reach the model through its chat template when the template takes ``tools``, else as the system
message of engine/preprocess.py (README: OpenAI-compatible HTTP API).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from proctor.openai_http.errors import BodyError
from proctor_client.v1 import generation_pb2 as pb

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
CALL_TAIL = re.compile(r"\s*\}?\s*$")
CHOICES = ("none", "auto", "required")
TAIL_CHARS = 32  # the longest end of the arguments that is held back: whitespace, "}", "</tool_call>"


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The request's tools and how the model may use them (``mode``: none, auto, required or named)."""

    tools: tuple[Tool, ...]
    mode: str
    named: str = ""
    definitions: str = ""  # the tools as sent (canonical JSON), for the chat template

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema every call satisfies: one object per callable tool, told apart by its name."""
        options = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"], "additionalProperties": False}
                   for t in self.tools if self.mode != "named" or t.name == self.named]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def constrain(self, message: pb.GenerateRequest) -> bool:
        """Set this plan's constraint on ``message``; False when the output stays free (``none``)."""
        if self.mode in ("required", "named"):
            message.json_schema = json.dumps(self.call_schema())
        elif self.mode == "auto":
            message.grammar.syntax = pb.GRAMMAR_SYNTAX_LARK
            message.grammar.text = (f"start: TEXT | \"{CALL_OPEN}\" call \"{CALL_CLOSE}\"\n"
                                    f"TEXT: /[^<](?s:.)*/\ncall: %json {json.dumps(self.call_schema())}\n")
        return self.mode != "none"


def tool_plan(body: dict[str, Any]) -> ToolPlan | None:
    """The request's tools and tool_choice, checked (BodyError names the key); None without tools."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None:
        if choice not in (None, "none"):
            raise BodyError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(raw, list) or not raw:
        raise BodyError("tools must be a non-empty array of function tools", "tools")
    tools: list[Tool] = []
    for index, entry in enumerate(raw):
        where = f"tools[{index}]"
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or entry.get("type") != "function" or not isinstance(function, dict):
            raise BodyError(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise BodyError(f"{where}.function.name must be 1-64 letters, digits, _ or -", f"{where}.function.name")
        if any(t.name == name for t in tools):
            raise BodyError(f"{where}.function.name {name!r} is used twice", f"{where}.function.name")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise BodyError(f"{where}.function.parameters must be a JSON schema object",
                            f"{where}.function.parameters")
        tools.append(Tool(name, parameters))
    mode, named = _choice(choice, tools)
    return ToolPlan(tuple(tools), mode, named, json.dumps(raw, separators=(",", ":"), sort_keys=True))


def _choice(choice: object, tools: list[Tool]) -> tuple[str, str]:
    if choice is None:
        return "auto", ""
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise BodyError(f"tool_choice must be one of {', '.join(CHOICES)} or a named function", "tool_choice")
        return choice, ""
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise BodyError('tool_choice must be "none", "auto", "required" or '
                        '{"type": "function", "function": {"name": ...}}', "tool_choice")
    if all(t.name != name for t in tools):
        raise BodyError(f"tool_choice names {name!r}, which is not in tools", "tool_choice.function.name")
    return "named", name


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse_output(text: str, plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's content and tool calls: a constrained call is JSON, or ``<tool_call>`` JSON under auto."""
    body = text
    if plan.mode == "auto":
        if not text.startswith(CALL_OPEN):
            return text, []
        body = text[len(CALL_OPEN):].removesuffix(CALL_CLOSE)
    elif plan.mode == "none":
        return text, []
    try:
        call = json.loads(body)
        name, arguments = call["name"], call["arguments"]
    except (ValueError, KeyError, TypeError):  # cut short (max_tokens): what there is, as text
        return text, []
    return None, [{"id": new_call_id(), "type": "function",
                   "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]


class CallStream:
    """A streamed tool call: the name once it is known, then the arguments' text as it comes.

    The arguments are the text after ``"arguments":`` up to the call object's closing brace, which (with a
    ``</tool_call>`` under auto) is held back until the output ends."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.state = "undecided" if plan.mode == "auto" else ("text" if plan.mode == "none" else "call")
        self.call_id = ""
        self._sent = 0  # how many characters of the arguments went out

    def feed(self, piece: str) -> tuple[str, list[dict[str, Any]]]:
        """The content and tool-call deltas this piece of output releases."""
        self.text += piece
        if self.state == "undecided":
            if self.text.startswith(CALL_OPEN):
                self.state = "call"
            elif not CALL_OPEN.startswith(self.text):
                self.state = "text"
                return self.text, []
            else:
                return "", []
        if self.state == "text":
            return piece, []
        return "", self._call_deltas(final=False)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is left at the end: held-back text, or the call's last arguments."""
        if self.state == "undecided":
            self.state = "text"
            return self.text, []
        if self.state == "text":
            return "", []
        return "", self._call_deltas(final=True)

    @property
    def called(self) -> bool:
        return bool(self.call_id)

    def _call_deltas(self, *, final: bool) -> list[dict[str, Any]]:
        body = self.text[len(CALL_OPEN):] if self.plan.mode == "auto" else self.text
        if final and self.plan.mode == "auto":
            body = body.removesuffix(CALL_CLOSE)
        head = CALL_HEAD.match(body)
        if head is None:
            return []
        deltas: list[dict[str, Any]] = []
        if not self.call_id:
            self.call_id = new_call_id()
            deltas.append({"index": 0, "id": self.call_id, "type": "function",
                           "function": {"name": json.loads(f'"{head.group(1)}"'), "arguments": ""}})
        arguments = body[head.end():]
        if not final:
            arguments = arguments[:len(arguments) - len(_tail(arguments))]  # the object's end may be next
        else:
            arguments = arguments[:len(arguments) - len(CALL_TAIL.search(arguments).group(0))]  # type: ignore[union-attr]
        new = arguments[self._sent:]
        if new:
            self._sent = len(arguments)
            deltas.append({"index": 0, "function": {"arguments": new}})
        return deltas


def _tail(text: str) -> str:
    """The end of ``text`` that could still be the call object's closing (and ``</tool_call>`` under auto)."""
    for cut in range(max(0, len(text) - TAIL_CHARS), len(text)):
        rest = text[cut:]
        if re.fullmatch(r"\s*(\}\s*)?(<(/(t(o(o(l(_(c(a(l(l(>)?)?)?)?)?)?)?)?)?)?)?)?", rest):
            return rest
    return ""
