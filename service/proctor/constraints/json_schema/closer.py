"""Where a JSON output stands against its schema, and the shortest texts that end it validly (issue 45).

``JsonCloser`` reads the output as it is written, a character at a time, keeping a stack of what is open: the
objects (their schema, the members written, the key being written), the arrays (their item count), the string,
number or literal being written. ``endings()`` then says how to finish from there, shortest first: complete the
open scalar (an escape, an enum member or ``const`` begun, a ``minLength``, a number's missing digits, the rest
of ``true``), then, container by container outwards, give each missing required property the shortest value its
schema allows (constraints/json_schema/shortest.py), add items up to ``minItems``, and close.

A closer is a guess the matcher checks: the engine tokenizes each ending and keeps the first the constraint
accepts to the end (engine/closing.py), so a schema read differently here than by the engine costs a candidate,
never a wrong output. Where the closer cannot tell (a pattern with lookarounds, a ``format`` without a simple
pattern, ``not``, a triggered schema dependency) it offers nothing, and the row runs on as without the rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proctor.constraints.json_schema.options import (
    DependentSchema,
    Schema,
    branches,
    item_schema,
    member_schema,
    members_to_write,
    of_type,
)
from proctor.constraints.json_schema.pattern_text import shortest_completion
from proctor.constraints.json_schema.shortest import FORMAT_PATTERNS, number_fits, shortest_text

LITERALS = ("true", "false", "null")
NUMBER_CHARS = frozenset("0123456789+-.eE")
WHITESPACE = frozenset(" \t\n\r")
MAX_ENDINGS = 6  # candidates offered, shortest first (each costs the engine a tokenization and a matcher walk)


@dataclass(slots=True)
class _Frame:
    kind: str  # object | array | string | number | literal
    options: list[Schema]  # the schemas the value may be under (anyOf/oneOf branches of its type)
    state: str = "start"  # object: start key colon value after next; array: start value after
    keys: list[str] = field(default_factory=list)  # object: members written (the one being written included)
    count: int = 0  # array: items written
    raw: str = ""  # string/key: the text after the opening quote; number/literal: the text so far


def shortest_first(texts: Iterable[str]) -> list[str]:
    """Distinct ``texts``, shortest first, ties in code-point order: never a set's iteration order, which follows
    the process's string hash seed, so a replay in another process is offered the same endings in the same order."""
    return sorted(set(texts), key=lambda text: (len(text), text))


class JsonCloser:
    """The output so far against ``schema`` (a JSON Schema, its local ``$ref``s resolved against it)."""

    def __init__(self, schema: Schema | bool) -> None:
        self._root: Any = schema
        self._stack: list[_Frame] = []
        self._done = False  # the top-level value is complete
        self._broken = False  # the text left JSON (cannot happen under a JSON constraint): no endings
        self._options: dict[int, tuple[Any, list[Schema]]] = {}
        self._shortest: dict[int, tuple[Schema, str | None]] = {}

    @property
    def done(self) -> bool:
        return self._done

    def push(self, text: str) -> None:
        for char in text:
            if not self._broken:
                self._char(char)

    # --- reading -------------------------------------------------------------------------------
    def _char(self, c: str) -> None:
        if not self._stack:
            if self._done or c in WHITESPACE:
                return
            self._open(c, self.options(self._root))
            return
        top = self._stack[-1]
        handler = getattr(self, "_in_" + top.kind)
        handler(top, c)

    def _open(self, c: str, options: list[Schema]) -> None:
        kind = {"{": "object", "[": "array", '"': "string"}.get(c)
        if kind is None:
            kind = "number" if c in "-0123456789" else "literal" if c in "tfn" else ""
        if not kind:
            self._broken = True
            return
        frame = _Frame(kind, of_type(options, kind))
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

    def _in_string(self, top: _Frame, c: str) -> None:
        if c == '"' and not _escaping(top.raw):
            self._close()
        else:
            top.raw += c

    def _in_number(self, top: _Frame, c: str) -> None:
        if c in NUMBER_CHARS:
            top.raw += c
            return
        self._close()
        self._char(c)

    def _in_literal(self, top: _Frame, c: str) -> None:
        top.raw += c
        if top.raw in LITERALS:
            self._close()
        elif not any(word.startswith(top.raw) for word in LITERALS):
            self._broken = True

    def _in_array(self, top: _Frame, c: str) -> None:
        if c in WHITESPACE:
            return
        if c == "]":
            self._close()
        elif c == ",":
            top.state = "value"
        else:
            self._open(c, self.options(item_schema(top.options, top.count)))

    def _in_object(self, top: _Frame, c: str) -> None:
        state = top.state
        if state == "key":
            if c == '"' and not _escaping(top.raw):
                top.keys.append(_decode(top.raw))
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

    # --- ending --------------------------------------------------------------------------------
    def endings(self) -> list[str]:
        """The texts that would end the output validly from here, shortest first ([] when the closer cannot
        tell; [""] when it is complete)."""
        if self._broken:
            return []
        if self._done:
            return [""]
        if not self._stack:
            text = self.value_text(self.options(self._root))
            return [text] if text is not None else []
        tails: list[str] = [""]
        for depth in range(len(self._stack) - 1, -1, -1):
            frame = self._stack[depth]
            inner_open = depth < len(self._stack) - 1  # a child value is being written (its ending is in tails)
            finishes = self._finish(frame, inner_open)
            tails = shortest_first({tail + finish for tail in tails for finish in finishes})[:MAX_ENDINGS]
            if not tails:
                return []
        return tails

    def _finish(self, frame: _Frame, inner_open: bool) -> list[str]:
        finish: list[str] = getattr(self, "_finish_" + frame.kind)(frame, inner_open)
        return finish

    def _finish_literal(self, frame: _Frame, inner_open: bool) -> list[str]:
        return [word[len(frame.raw):] for word in LITERALS if word.startswith(frame.raw)][:1]

    def _finish_number(self, frame: _Frame, inner_open: bool) -> list[str]:
        text = frame.raw + ("0" if frame.raw[-1] in "-+.eE" else "")
        for extra in ("", "0", "00", "000", "1", "5", "9"):
            candidate = text + extra
            if any(_number_fits(candidate, option) for option in frame.options or [{}]):
                return [candidate[len(frame.raw):]]
        return []

    def _finish_string(self, frame: _Frame, inner_open: bool) -> list[str]:
        raw = frame.raw + _escape_rest(frame.raw)
        found: list[str] = []
        for option in frame.options or [{}]:
            ending = _string_rest(raw, option, self._shortest_of(option))
            if ending is not None:
                found.append(raw[len(frame.raw):] + ending)
        return shortest_first(found)

    def _finish_array(self, frame: _Frame, inner_open: bool) -> list[str]:
        found: list[str] = []
        for option in frame.options or [{}]:
            count, text = frame.count, ""
            if inner_open:
                count += 1
            elif frame.state == "value":  # after a comma: an item must follow
                item = self.value_text(self.options(item_schema([option], count)))
                if item is None:
                    continue
                text, count = item, count + 1
            needed = int(option.get("minItems", 0))
            while count < needed:
                item = self.value_text(self.options(item_schema([option], count)))
                if item is None:
                    break
                text += ("," if count else "") + item
                count += 1
            else:
                found.append(text + "]")
        return shortest_first(found)

    def _finish_object(self, frame: _Frame, inner_open: bool) -> list[str]:
        found: list[str] = []
        for option in frame.options or [{}]:
            for head, keys in self._member_heads(frame, option, inner_open):
                rest = self._missing_members(option, keys)
                if rest is not None:
                    found.append(head + rest + "}")
        return shortest_first(found)[:MAX_ENDINGS]

    def _member_heads(self, frame: _Frame, option: Schema, inner_open: bool) -> list[tuple[str, list[str]]]:
        """Ways to finish the member being written: (its text, the keys written after it)."""
        keys, state = list(frame.keys), frame.state
        if inner_open or state in ("start", "after"):
            return [("", keys)]
        if state in ("colon", "value"):
            value = self.value_text(self.options(member_schema([option], keys[-1])))
            return [] if value is None else [((":" if state == "colon" else "") + value, keys)]
        prefix = '"' + frame.raw if state == "key" else ""  # "next": after a comma, a member must follow
        heads = []
        for name in self._key_choices(option, keys, prefix):
            value = self.value_text(self.options(member_schema([option], name)))
            if value is not None:
                text = json.dumps(name, ensure_ascii=False)
                heads.append(((text[len(prefix):] if state == "key" else text) + ":" + value, [*keys, name]))
        return heads

    def _key_choices(self, option: Schema, keys: list[str], prefix: str) -> list[str]:
        """Member names that may follow, beginning with ``prefix`` (the key's JSON text so far): the engines write
        members in ``properties``' order, so the properties after the last one written, up to the first required
        one (the cheapest: it must be written anyway) first; then the key as written completed by a
        ``patternProperties`` pattern, or as it stands where additional properties are allowed."""
        properties = list(option.get("properties", {}))
        required = option.get("required", [])
        after = max((properties.index(name) + 1 for name in keys if name in properties), default=0)
        following = [name for name in properties[after:] if name not in keys]
        following += [name for name in required if name not in properties and name not in keys]
        ahead = [name for name in following if json.dumps(name, ensure_ascii=False).startswith(prefix)]
        first_required = [name for name in ahead if name in required][:1]
        choices = first_required + [name for name in ahead if name not in first_required][:2]
        if not prefix or _escaping(prefix[1:]):
            return choices
        written = _decode(prefix[1:])
        for pattern in option.get("patternProperties", {}):  # a key its pattern completes
            rest = shortest_completion(str(pattern), written)
            if rest is not None and written + rest not in keys and written + rest not in choices:
                choices.append(written + rest)
        if option.get("additionalProperties", True) is not False and written not in keys and written not in choices:
            choices.append(written)
        return choices

    def _missing_members(self, option: Schema, keys: list[str]) -> str | None:
        """The required members not yet written (in the engines' order: ``properties``' first), then optional
        ones up to ``minProperties``; each after a comma where a member precedes it."""
        try:
            order = members_to_write(option, keys)
        except DependentSchema:
            return None
        text, count = "", len(keys)
        for name in order:
            value = self.value_text(self.options(member_schema([option], name)))
            if value is None:
                return None
            text += ("," if count else "") + json.dumps(name, ensure_ascii=False) + ":" + value
            count += 1
        return text

    def open_values(self) -> list[tuple[list[Schema], tuple[str, ...]]]:
        """Each value open, outermost first: its alternatives and the members it has (read by growth.py)."""
        return [] if self._broken else [(frame.options, tuple(frame.keys)) for frame in self._stack]

    def next_options(self) -> list[Schema] | None:
        """The alternatives of the value the next character may begin (the root before the output begins, a
        member's value after its key, an array's next item); None where no value begins next."""
        if self._broken or self._done:
            return None
        if not self._stack:
            return self.options(self._root)
        top = self._stack[-1]
        if top.kind == "object" and top.state in ("colon", "value"):
            return self.options(member_schema(top.options, top.keys[-1]))
        if top.kind == "array" and top.state in ("start", "value"):
            return self.options(item_schema(top.options, top.count))
        return None

    # --- schemas -------------------------------------------------------------------------------
    def options(self, node: Any) -> list[Schema]:
        """``node``'s alternatives (constraints/json_schema/options.py), built once per node: each cache entry holds its
        node, so an id is never reused while its entry lives (a merged branch is a new object)."""
        found = self._options.get(id(node))
        if found is None or found[0] is not node:
            found = (node, branches(node, self._root))
            self._options[id(node)] = found
        return found[1]

    def value_text(self, options: list[Schema]) -> str | None:
        """The shortest value's text under any of ``options``."""
        texts = [text for text in (self._shortest_of(option) for option in options) if text is not None]
        return min(texts, key=len) if texts else None

    def _shortest_of(self, option: Schema) -> str | None:
        found = self._shortest.get(id(option))
        if found is None or found[0] is not option:
            found = (option, shortest_text(option, self._root))
            self._shortest[id(option)] = found
        return found[1]


# --- helpers (pure) -----------------------------------------------------------------------------
def _escaping(raw: str) -> bool:
    """Whether the string text ``raw`` ends inside an escape (an odd run of backslashes, or ``\\u`` unfinished)."""
    run = len(raw) - len(raw.rstrip("\\"))
    return run % 2 == 1 or _unicode_left(raw) > 0


def _unicode_left(raw: str) -> int:
    match = re.search(r"(?<!\\)(?:\\\\)*\\u([0-9a-fA-F]{0,3})$", raw)
    return 4 - len(match.group(1)) if match else 0


def _escape_rest(raw: str) -> str:
    """What finishes an escape ``raw`` ends inside (``n`` after a lone backslash, zeros for ``\\u``)."""
    left = _unicode_left(raw)
    if left:
        return "0" * left
    run = len(raw) - len(raw.rstrip("\\"))
    return "n" if run % 2 == 1 else ""


def _decode(raw: str) -> str:
    try:
        return str(json.loads('"' + raw + '"'))
    except ValueError:
        return raw


def _string_rest(raw: str, option: Schema, shortest: str | None) -> str | None:
    """The rest of a string whose text so far is ``raw`` (escapes complete): an enum member or ``const`` it
    begins, its ``format``'s or pattern's shortest value where it begins that, else the shortest completion of
    its pattern or of a common format's (``FORMAT_PATTERNS``), else padding to ``minLength``."""
    written = '"' + raw
    members = option["enum"] if "enum" in option else [option["const"]] if "const" in option else None
    if members is not None:
        texts = [json.dumps(m, ensure_ascii=False) for m in members if isinstance(m, str)]
        fits = [text[len(written):] for text in texts if text.startswith(written)]
        return min(fits, key=len) if fits else None
    if "format" in option or "pattern" in option:
        if shortest is not None and shortest.startswith(written):
            return shortest[len(written):]
        pattern = option.get("pattern") if "format" not in option else FORMAT_PATTERNS.get(option["format"])
        if pattern is None or ("pattern" in option and "format" in option):  # both: not covered
            return None
        rest = shortest_completion(str(pattern), _decode(raw))
        return None if rest is None else rest + '"'
    length = len(_decode(raw))
    return "a" * max(0, int(option.get("minLength", 0)) - length) + '"'


def _number_fits(text: str, option: Schema) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return number_fits(value, option, option.get("type") == "integer")
