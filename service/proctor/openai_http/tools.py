"""Tool calls: the ``tools`` and ``tool_choice`` of a chat request as a constraint, and the output as calls.

- A named function, or ``required`` with ``parallel_tool_calls: false``: the output is one call, constrained by
  a JSON schema to ``{"name": <one of the tools>, "arguments": <that tool's parameters>}``, through the same
  constraint service as any ``json_schema`` (coverage, validated fallback, the server's own validation).
- ``required`` with parallel calls allowed (OpenAI's default): a grammar of one or more
  ``<tool_call>`` call ``</tool_call>`` blocks, a newline apart; the model decides how many.
- ``auto``: a grammar lets the model choose: text that does not begin with ``<``, or those call blocks (one
  block when parallel calls are off). The arguments of a call it starts are held to that tool's schema.
- ``none``: no constraint; the tools are still shown to the model.

The grammar is constraints/tool_calls.py's, which gives it an output rule: like a JSON schema's output, a call
running short of ``max_tokens`` is ended as a complete, valid call (the engine's budget rule, issue 56), and a
call the same as an earlier one ends the answer; the answer's finish is then ``tool_calls``. Only a budget the
rule cannot serve (``close_at_budget`` off, or in ``auto`` mode below one whole call) can still cut a call short:
it is returned as it stands, with ``finish_reason: "length"``, as OpenAI does.

Every tool's parameters are served with their objects closed (constraints/json_schema/closing.py); a ``strict``
tool is also served exactly or refused (no validated fallback).

The tools reach the model through its chat template when the template takes ``tools``, else as the system
message of engine/preprocess.py (README: OpenAI-compatible HTTP API).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from proctor.constraints.json_schema import DATA_KEYWORDS, InvalidSchemaError, check_json_schema, close_objects
from proctor.constraints.tool_calls import CALL_CLOSE, CALL_OPEN, tool_calls_grammar
from proctor.openai_http.draft import Draft
from proctor.openai_http.errors import BodyError
from proctor.openai_http.json_form import ENUMS

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
NAME_SO_FAR = re.compile(r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]*)"?\s*(,\s*("[a-z]*"?\s*:?\s*)?)?$')
CALL_START = '{"name":"'
CALL_END = re.compile(r"\s*\}\s*$")
CLOSE_SO_FAR = r"<(/(t(o(o(l(_(c(a(l(l(>)?)?)?)?)?)?)?)?)?)?)?"  # a </tool_call> cut short, or whole
PARTIAL_CLOSE = re.compile(rf"\s*{CLOSE_SO_FAR}$")
CALL_TAIL = re.compile(rf"\s*(\}}\s*)?({CLOSE_SO_FAR})?")
CHOICES = ("none", "auto", "required")
TAIL_CHARS = 32  # the longest end of the arguments that is held back: whitespace, "}", "</tool_call>"


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    parameters: dict[str, Any]  # objects closed
    strict: bool = False
    closed: tuple[str, ...] = ()  # the JSON pointers of the objects closed in its parameters


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The request's tools and how the model may use them (``mode``: none, auto, required or named)."""

    tools: tuple[Tool, ...]
    mode: str
    named: str = ""
    definitions: str = ""  # the tools as sent (canonical JSON), for the chat template
    parallel: bool = True

    @property
    def blocks(self) -> bool:
        """Whether calls come in ``<tool_call>`` blocks (auto, or required with parallel calls), not bare JSON."""
        return self.mode == "auto" or (self.mode == "required" and self.parallel)

    @property
    def callable(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.mode != "named" or t.name == self.named)

    @property
    def strict(self) -> bool:
        return any(t.strict for t in self.callable)

    def call_schema(self) -> dict[str, Any]:
        """The JSON schema every call satisfies: one object per callable tool, told apart by its name (each
        tool's local ``$ref``s rebased to where its parameters sit in it)."""
        tools = self.callable
        places = ["#/properties/arguments"] if len(tools) == 1 else [f"#/anyOf/{i}/properties/arguments"
                                                                     for i in range(len(tools))]
        options = [{"type": "object", "properties": {"name": {"const": t.name},
                                                     "arguments": rebased(t.parameters, place)},
                    "required": ["name", "arguments"], "additionalProperties": False}
                   for t, place in zip(tools, places, strict=True)]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def closed(self) -> tuple[str, ...]:
        """The objects closed in the callable tools' parameters, as ``tools/<name>#/pointer``."""
        return tuple(f"tools/{t.name}{path}" for t in self.callable for path in t.closed)

    def constrain(self, draft: Draft) -> bool:
        """Set this plan's constraint on ``draft``; False when the output stays free (``none``)."""
        if self.mode == "none":
            return False
        draft.values["constraint_exact_only"] = self.strict
        if not self.blocks:
            schema = self.call_schema()
            draft.set_constraint("json_schema", json.dumps(schema), (schema,))
            return True
        text = tool_calls_grammar(self.call_schema(), auto=self.mode == "auto", parallel=self.parallel)
        draft.set_constraint("grammar", {"syntax": ENUMS["GrammarSyntax"].read("lark"), "text": text})
        return True


def tool_plan(body: dict[str, Any]) -> ToolPlan | None:
    """The request's tools and tool_choice, checked (BodyError names the key); None without tools."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool | None):
        raise BodyError("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if raw is None:
        if choice not in (None, "none"):
            raise BodyError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(raw, list) or not raw:
        raise BodyError("tools must be a non-empty array of function tools", "tools")
    tools: list[Tool] = []
    for index, entry in enumerate(raw):
        tools.append(_tool(entry, f"tools[{index}]", tools))
    mode, named = _choice(choice, tools)
    return ToolPlan(tuple(tools), mode, named, json.dumps(raw, separators=(",", ":"), sort_keys=True),
                    parallel is not False)


def _tool(entry: object, where: str, earlier: list[Tool]) -> Tool:
    function = entry.get("function") if isinstance(entry, dict) else None
    if not isinstance(entry, dict) or entry.get("type") != "function" or not isinstance(function, dict):
        raise BodyError(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise BodyError(f"{where}.function.name must be 1-64 letters, digits, _ or -", f"{where}.function.name")
    if any(t.name == name for t in earlier):
        raise BodyError(f"{where}.function.name {name!r} is used twice", f"{where}.function.name")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise BodyError(f"{where}.function.parameters must be a JSON schema object", f"{where}.function.parameters")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise BodyError(f"{where}.function.strict must be a boolean", f"{where}.function.strict")
    _check_parameters(parameters, f"{where}.function.parameters")
    closed = close_objects(parameters)
    return Tool(name, closed.schema, bool(strict), closed.closed)


def _check_parameters(parameters: dict[str, Any], where: str) -> None:
    """A tool's parameters are a usable schema (as any request schema: its local ``$ref``s point somewhere)."""
    try:
        check_json_schema(parameters)
    except InvalidSchemaError as exc:
        raise BodyError(f"{where}: {exc}", where) from None


def rebased(schema: Any, place: str) -> Any:
    """``schema`` with its local ``$ref``s pointing into ``place`` (a JSON pointer), where it is embedded."""
    if isinstance(schema, list):
        return [rebased(item, place) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value if key in DATA_KEYWORDS else rebased(value, place) for key, value in schema.items()}
    if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
        out["$ref"] = place + schema["$ref"][1:]
    return out


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


def call_bodies(text: str, plan: ToolPlan) -> list[tuple[str, bool]] | None:
    """Each call's JSON text and whether its block was closed; None when the output is text, not calls."""
    if plan.mode == "none":
        return None
    if not plan.blocks:
        return [(text, False)]
    if not text.startswith(CALL_OPEN):
        return None
    bodies = []
    for piece in text.split(CALL_OPEN)[1:]:
        body, closed, _ = piece.partition(CALL_CLOSE)
        bodies.append((body, bool(closed)))
    return bodies


def call_arguments(body: str) -> tuple[str, str] | None:
    """A call's name and the text of its arguments (as far as it goes); None before the name is known."""
    head = CALL_HEAD.match(body)
    if head is None:
        return None
    name = json.loads(f'"{head.group(1)}"')
    rest = PARTIAL_CLOSE.sub("", body[head.end():])  # a </tool_call> cut short is not part of the call
    try:
        json.loads(body[:head.end()] + rest)
    except ValueError:  # cut short: the arguments as far as they go
        return name, rest.rstrip()
    return name, rest[:CALL_END.search(rest).start()]  # type: ignore[union-attr]


def cut_call(body: str, plan: ToolPlan) -> tuple[str, str] | None:
    """A call cut short before its arguments: the one tool its name so far can be, with no arguments yet."""
    named = NAME_SO_FAR.match(body)
    if named is None and not CALL_START.startswith(re.sub(r"\s", "", body)):
        return None
    prefix = named.group(1) if named is not None else ""
    names = [t.name for t in plan.callable if t.name.startswith(prefix)]
    return (names[0], "") if len(names) == 1 else None


def parse_output(text: str, plan: ToolPlan, cut: bool = False) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's content and tool calls; a call ``cut`` short (max_tokens) is returned as far as it goes."""
    bodies = call_bodies(text, plan)
    calls: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for body, _ in bodies or ():
        found = call_arguments(body) or (cut_call(body, plan) if cut else None)
        if found is not None and not repeated(found, seen):
            calls.append({"id": new_call_id(), "type": "function",
                          "function": {"name": found[0], "arguments": found[1]}})
    return (None, calls) if calls else (text, [])


def repeated(call: tuple[str, str], seen: set[tuple[str, str]]) -> bool:
    """Whether a complete call is the same as an earlier one of the answer (a weak model's loop: it would do the
    same work twice, so it is left out); ``seen`` gains it otherwise."""
    try:
        key = (call[0], json.dumps(json.loads(call[1]), sort_keys=True))
    except ValueError:
        return False  # cut short: not comparable, kept
    if key in seen:
        return True
    seen.add(key)
    return False


class CallStream:
    """Streamed tool calls: each call's name once it is known, then its arguments' text as it comes.

    A call's arguments are the text after ``"arguments":`` up to the call object's closing brace, which (with a
    ``</tool_call>``) is held back until the call's block closes or the output ends."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.state = "undecided" if plan.mode == "auto" else ("text" if plan.mode == "none" else "call")
        self.call_ids: list[str] = []
        self._sent: list[int] = []  # per call: how many characters of its arguments went out
        self._index: dict[int, int] = {}  # output block → the call index it went out as
        self._finished: set[int] = set()  # blocks closed and dealt with (sent whole, or left out as a repeat)
        self._seen: set[tuple[str, str]] = set()  # the complete calls so far (name, canonical arguments)

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
        """What is left at the end: held-back text, or the calls' last arguments."""
        if self.state == "undecided":
            self.state = "text"
            return self.text, []
        if self.state == "text":
            return "", []
        return "", self._call_deltas(final=True)

    @property
    def called(self) -> bool:
        return bool(self.call_ids)

    def _call_deltas(self, *, final: bool) -> list[dict[str, Any]]:
        """Deltas of each call: the first as it comes, later ones whole once their block closes (a repeat of an
        earlier call is then left out, as in the unary answer). A closed block is read once."""
        deltas: list[dict[str, Any]] = []
        for block, (body, closed) in enumerate(call_bodies(self.text, self.plan) or ()):
            done = final or closed
            if block in self._finished or (block > 0 and not done):
                continue
            found = call_arguments(body) if done else _open_arguments(body)
            if found is None:
                continue
            if done:
                self._finished.add(block)
                if repeated(found, self._seen) and block not in self._index:
                    continue  # a later call the same as an earlier one: left out
            if block not in self._index:
                self._index[block] = len(self.call_ids)
                self.call_ids.append(new_call_id())
                self._sent.append(0)
                deltas.append({"index": self._index[block], "id": self.call_ids[-1], "type": "function",
                               "function": {"name": found[0], "arguments": ""}})
            index = self._index[block]
            new = found[1][self._sent[index]:]
            if new:
                self._sent[index] = len(found[1])
                deltas.append({"index": index, "function": {"arguments": new}})
        return deltas


def _open_arguments(body: str) -> tuple[str, str] | None:
    """A call still coming: its name and its arguments so far, less an end that may be the object's closing."""
    head = CALL_HEAD.match(body)
    if head is None:
        return None
    arguments = body[head.end():]
    return json.loads(f'"{head.group(1)}"'), arguments[:len(arguments) - len(_tail(arguments))]


def _tail(text: str) -> str:
    """The end of ``text`` that could still be the call object's closing (and ``</tool_call>``)."""
    for cut in range(max(0, len(text) - TAIL_CHARS), len(text)):
        rest = text[cut:]
        if CALL_TAIL.fullmatch(rest):
            return rest
    return ""
