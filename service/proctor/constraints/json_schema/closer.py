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
from collections.abc import Iterable

from proctor.constraints.json_schema.options import (
    DependentSchema,
    Schema,
    item_schema,
    member_schema,
    members_to_write,
)
from proctor.constraints.json_schema.pattern_text import shortest_completion
from proctor.constraints.json_schema.reader import LITERALS, Frame, JsonReader, decode, escaping, unicode_left
from proctor.constraints.json_schema.shortest import FORMAT_PATTERNS, number_fits, shortest_text

MAX_ENDINGS = 6  # candidates offered, shortest first (each costs the engine a tokenization and a matcher walk)


def shortest_first(texts: Iterable[str]) -> list[str]:
    """Distinct ``texts``, shortest first, ties in code-point order: never a set's iteration order, which follows
    the process's string hash seed, so a replay in another process is offered the same endings in the same order."""
    return sorted(set(texts), key=lambda text: (len(text), text))


class JsonCloser(JsonReader):
    """The output so far against ``schema`` (a JSON Schema, its local ``$ref``s resolved against it); the reading
    is ``JsonReader``'s (constraints/json_schema/reader.py), the endings are the closer's."""

    def __init__(self, schema: Schema | bool) -> None:
        super().__init__(schema)
        self._shortest: dict[int, tuple[Schema, str | None]] = {}

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

    def _finish(self, frame: Frame, inner_open: bool) -> list[str]:
        finish: list[str] = getattr(self, "_finish_" + frame.kind)(frame, inner_open)
        return finish

    def _finish_literal(self, frame: Frame, inner_open: bool) -> list[str]:
        return [word[len(frame.raw):] for word in LITERALS if word.startswith(frame.raw)][:1]

    def _finish_number(self, frame: Frame, inner_open: bool) -> list[str]:
        text = frame.raw + ("0" if frame.raw[-1] in "-+.eE" else "")
        for extra in ("", "0", "00", "000", "1", "5", "9"):
            candidate = text + extra
            if any(_number_fits(candidate, option) for option in frame.options or [{}]):
                return [candidate[len(frame.raw):]]
        return []

    def _finish_string(self, frame: Frame, inner_open: bool) -> list[str]:
        raw = frame.raw + _escape_rest(frame.raw)
        found: list[str] = []
        for option in frame.options or [{}]:
            ending = _string_rest(raw, option, self._shortest_of(option))
            if ending is not None:
                found.append(raw[len(frame.raw):] + ending)
        return shortest_first(found)

    def _finish_array(self, frame: Frame, inner_open: bool) -> list[str]:
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

    def _finish_object(self, frame: Frame, inner_open: bool) -> list[str]:
        found: list[str] = []
        for option in frame.options or [{}]:
            for head, keys in self._member_heads(frame, option, inner_open):
                rest = self._missing_members(option, keys)
                if rest is not None:
                    found.append(head + rest + "}")
        return shortest_first(found)[:MAX_ENDINGS]

    def _member_heads(self, frame: Frame, option: Schema, inner_open: bool) -> list[tuple[str, list[str]]]:
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
        if not prefix or escaping(prefix[1:]):
            return choices
        written = decode(prefix[1:])
        # The key as written completed by a pattern, or as it stands; where that key is written already (the key
        # memory refuses it again), the same with one more character.
        listed = len(choices)
        for begun in (written, *(written + char for char in "abcdefghijklmnopqrstuvwxyz0123456789")):
            for pattern in option.get("patternProperties", {}):
                rest = shortest_completion(str(pattern), begun)
                if rest is not None and begun + rest not in keys and begun + rest not in choices:
                    choices.append(begun + rest)
            if option.get("additionalProperties", True) is not False and begun not in keys and begun not in choices:
                choices.append(begun)
            if len(choices) > listed:
                break
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
def _escape_rest(raw: str) -> str:
    """What finishes an escape ``raw`` ends inside (``n`` after a lone backslash, zeros for ``\\u``)."""
    left = unicode_left(raw)
    if left:
        return "0" * left
    run = len(raw) - len(raw.rstrip("\\"))
    return "n" if run % 2 == 1 else ""


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
        rest = shortest_completion(str(pattern), decode(raw))
        return None if rest is None else rest + '"'
    length = len(decode(raw))
    return "a" * max(0, int(option.get("minLength", 0)) - length) + '"'


def _number_fits(text: str, option: Schema) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return number_fits(value, option, option.get("type") == "integer")
