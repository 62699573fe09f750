"""Watch streamed JSON text and say when the value at a path is complete (no full parse needed).

Paths are ``$`` followed by ``.key`` and ``[index]`` steps: ``$.title``, ``$.clauses[0].text``.
"""

from __future__ import annotations

import re

PathStep = str | int
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_\-]*)|\[(\d+)\]|\[\"((?:[^\"\\]|\\.)*)\"\]")


def parse_path(raw: str) -> tuple[PathStep, ...]:
    if not raw.startswith("$"):
        raise ValueError(f"a path starts with '$', got {raw!r}")
    steps: list[PathStep] = []
    position = 1
    while position < len(raw):
        match = _STEP.match(raw, position)
        if match is None:
            raise ValueError(f"bad path {raw!r} at character {position}: use .key, [\"key\"] or [index]")
        key, index, quoted = match.groups()
        steps.append(int(index) if index is not None else (key if key is not None else quoted))
        position = match.end()
    if not steps:
        raise ValueError("the path must name a value inside the document, e.g. $.title")
    return tuple(steps)


class JsonPathWatcher:
    """Feed text chunks; ``feed`` returns True once the value at ``path`` has ended."""

    def __init__(self, path: tuple[PathStep, ...]) -> None:
        self._path = path
        self._frames: list[list[object]] = []  # [kind "obj"|"arr", step, expecting_key]
        self._in_string = False
        self._escape = False
        self._is_key = False
        self._buffer: list[str] = []
        self._scalar = False
        self.done = False

    def _current_path(self) -> tuple[PathStep, ...]:
        return tuple(frame[1] for frame in self._frames)  # type: ignore[misc]

    def _value_ended(self, path: tuple[PathStep, ...]) -> None:
        if path == self._path:
            self.done = True

    def _end_scalar(self) -> None:
        if self._scalar:
            self._scalar = False
            self._value_ended(self._current_path())

    def feed(self, text: str) -> bool:
        for ch in text:
            if self.done:
                break
            if self._in_string:
                self._string_char(ch)
            else:
                self._structural_char(ch)
        return self.done

    def _string_char(self, ch: str) -> None:
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            if self._is_key:
                self._frames[-1][1] = "".join(self._buffer)
                self._frames[-1][2] = False
            else:
                self._value_ended(self._current_path())
            return
        if self._is_key:
            self._buffer.append(ch)

    def _structural_char(self, ch: str) -> None:
        top = self._frames[-1] if self._frames else None
        if ch == '"':
            self._in_string = True
            self._is_key = bool(top and top[0] == "obj" and top[2])
            self._buffer = []
        elif ch in "{[":
            self._frames.append(["obj", None, True] if ch == "{" else ["arr", 0, False])
        elif ch in "}]":
            self._end_scalar()
            if self._frames:
                self._frames.pop()
                self._value_ended(self._current_path())
        elif ch == ",":
            self._end_scalar()
            if top is not None:
                if top[0] == "obj":
                    top[2] = True
                else:
                    top[1] = int(top[1]) + 1  # type: ignore[call-overload]
        elif ch == ":" or ch.isspace():
            self._end_scalar()
        else:
            self._scalar = True
