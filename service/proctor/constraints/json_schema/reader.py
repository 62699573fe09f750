"""One incremental reader of JSON output, shared by the closer (issue 45) and the key memory (issue 56).

``JsonReader`` reads the output as it is written, a character at a time, keeping a stack of what is open: the
objects (their schemas, the members written, the key being written), the arrays (their item count), the string,
number or literal being written. The closer asks it how to end the output from here; the key memory asks it which
keys each open object already has. Reading JSON one way in one place means the two never disagree about where an
output stands.

A reader can be saved and restored (``save``/``restore``): the key memory keeps one saved state per token so a
constraint matcher's rollback undoes its reading too. Frames hold tuples, so a saved state is a shallow copy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from proctor.constraints.json_schema.options import Schema, branches, item_schema, member_schema, of_type

LITERALS = ("true", "false", "null")
NUMBER_CHARS = frozenset("0123456789+-.eE")
WHITESPACE = frozenset(" \t\n\r")
OPENERS = {"{": "object", "[": "array", '"': "string"}


@dataclass(slots=True)
class Frame:
    kind: str  # object | array | string | number | literal
    options: list[Schema]  # the schemas the value may be under (anyOf/oneOf branches of its type)
    state: str = "start"  # object: start key colon value after next; array: start value after
    keys: tuple[str, ...] = ()  # object: members written (the one being written included)
    count: int = 0  # array: items written
    raw: str = ""  # string/key: the text after the opening quote; number/literal: the text so far
    marked: bool = False  # object: a reader's own mark (the key memory's: a token could write one of its keys whole)

    def copy(self) -> Frame:
        return Frame(self.kind, self.options, self.state, self.keys, self.count, self.raw, self.marked)


Saved = tuple[tuple[Frame, ...], bool, bool]  # (the stack, done, broken)


class JsonReader:
    """The output so far against ``schema`` (a JSON Schema, its local ``$ref``s resolved against it)."""

    def __init__(self, schema: Schema | bool) -> None:
        self._root: Any = schema
        self._stack: list[Frame] = []
        self._done = False  # the top-level value is complete
        self._broken = False  # the text left JSON (cannot happen under a JSON constraint)
        self._options: dict[int, tuple[Any, list[Schema]]] = {}

    @property
    def done(self) -> bool:
        return self._done

    @property
    def broken(self) -> bool:
        return self._broken

    @property
    def stack(self) -> list[Frame]:
        """The open values, outermost first (read only: the reader owns them)."""
        return self._stack

    def push(self, text: str) -> None:
        stack = self._stack
        if stack and '"' not in text and "\\" not in text:  # inside a string or key, a piece of it: read at once
            top = stack[-1]
            if top.kind == "string" or (top.kind == "object" and top.state == "key"):
                top.raw += text
                return
        for char in text:
            if self._broken:
                return
            self._char(char)

    def save(self) -> Saved:
        return tuple(frame.copy() for frame in self._stack), self._done, self._broken

    def restore(self, saved: Saved) -> None:
        stack, self._done, self._broken = saved
        self._stack = [frame.copy() for frame in stack]

    # --- hooks -----------------------------------------------------------------------------------
    def key_written(self, frame: Frame, key: str) -> None:
        """A key was completed in ``frame`` (before it joins ``frame.keys``): the key memory checks it here."""

    # --- reading ---------------------------------------------------------------------------------
    def _char(self, c: str) -> None:
        if not self._stack:
            if self._done or c in WHITESPACE:
                return
            self._open(c, self.options(self._root))
            return
        top = self._stack[-1]
        kind = top.kind
        if kind == "object":
            self._in_object(top, c)
        elif kind == "string":
            self._in_string(top, c)
        elif kind == "array":
            self._in_array(top, c)
        elif kind == "number":
            self._in_number(top, c)
        else:
            self._in_literal(top, c)

    def _open(self, c: str, options: list[Schema]) -> None:
        kind = OPENERS.get(c)
        if kind is None:
            kind = "number" if c in "-0123456789" else "literal" if c in "tfn" else ""
        if not kind:
            self._broken = True
            return
        frame = Frame(kind, of_type(options, kind))
        if kind in ("number", "literal"):
            frame.raw = c
        self._stack.append(frame)

    def _close(self) -> None:
        """The top value is complete: its parent takes it."""
        self._stack.pop()
        if not self._stack:
            self._done = True
            return
        parent = self._stack[-1]
        parent.state = "after"
        if parent.kind == "array":
            parent.count += 1

    def _in_string(self, top: Frame, c: str) -> None:
        if c == '"' and not escaping(top.raw):
            self._close()
        else:
            top.raw += c

    def _in_number(self, top: Frame, c: str) -> None:
        if c in NUMBER_CHARS:
            top.raw += c
            return
        self._close()
        self._char(c)

    def _in_literal(self, top: Frame, c: str) -> None:
        top.raw += c
        if top.raw in LITERALS:
            self._close()
        elif not any(word.startswith(top.raw) for word in LITERALS):
            self._broken = True

    def _in_array(self, top: Frame, c: str) -> None:
        if c in WHITESPACE:
            return
        if c == "]":
            self._close()
        elif c == ",":
            top.state = "value"
        else:
            self._open(c, self.options(item_schema(top.options, top.count)))

    def _in_object(self, top: Frame, c: str) -> None:
        state = top.state
        if state == "key":
            if c == '"' and not escaping(top.raw):
                key = decode(top.raw)
                self.key_written(top, key)
                top.keys = (*top.keys, key)
                top.state, top.raw = "colon", ""
            else:
                top.raw += c
            return
        if c in WHITESPACE:
            return
        if c == "}":
            self._close()
        elif c == '"' and state in ("start", "next"):
            top.state, top.raw = "key", ""
        elif c == ":" and state == "colon":
            top.state = "value"
        elif c == "," and state == "after":
            top.state = "next"
        elif state == "value":
            self._open(c, self.options(member_schema(top.options, top.keys[-1])))
        else:
            self._broken = True

    # --- schemas ---------------------------------------------------------------------------------
    def options(self, node: Any) -> list[Schema]:
        """``node``'s alternatives (constraints/json_schema/options.py), built once per node: each cache entry holds its
        node, so an id is never reused while its entry lives (a merged branch is a new object)."""
        found = self._options.get(id(node))
        if found is None or found[0] is not node:
            found = (node, branches(node, self._root))
            self._options[id(node)] = found
        return found[1]


# --- helpers (pure) -----------------------------------------------------------------------------
def escaping(raw: str) -> bool:
    """Whether the string text ``raw`` ends inside an escape (an odd run of backslashes, or ``\\u`` unfinished)."""
    if not raw or ("\\" not in raw[-6:]):
        return False
    run = len(raw) - len(raw.rstrip("\\"))
    return run % 2 == 1 or unicode_left(raw) > 0


def unicode_left(raw: str) -> int:
    match = re.search(r"(?<!\\)(?:\\\\)*\\u([0-9a-fA-F]{0,3})$", raw)
    return 4 - len(match.group(1)) if match else 0


def decode(raw: str) -> str:
    """A string's JSON text (without quotes) as the value it spells; bytes of a character cut by a token (carried
    as surrogate escapes) are joined first."""
    if "\\" not in raw:
        text = raw
    else:
        try:
            text = str(json.loads('"' + raw + '"'))
        except ValueError:
            text = raw
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8")
    except UnicodeError:
        return text
