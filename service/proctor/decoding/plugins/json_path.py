"""Watch streamed JSON text and say when the value at a path is complete (no full parse needed).

Paths are ``$`` followed by ``.key`` and ``[index]`` steps: ``$.title``, ``$.clauses[0].text``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


@dataclass(slots=True)
class _Frame:
    """An open object or array: the step inside it now (a key, None before the first; an index)."""

    is_object: bool
    step: PathStep | None
    expecting_key: bool


class JsonPathWatcher:
    """Feed text chunks; ``feed`` returns True once the value at ``path`` has ended."""

    def __init__(self, path: tuple[PathStep, ...]) -> None:
        self._path = path
        self._frames: list[_Frame] = []
        self._in_string = False
        self._escape = False
        self._is_key = False
        self._buffer: list[str] = []
        self._scalar = False
        self.done = False

    def _current_path(self) -> tuple[PathStep | None, ...]:
        return tuple(frame.step for frame in self._frames)

    def _value_ended(self, path: tuple[PathStep | None, ...]) -> None:
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
                self._frames[-1].step = "".join(self._buffer)
                self._frames[-1].expecting_key = False
            else:
                self._value_ended(self._current_path())
            return
        if self._is_key:
            self._buffer.append(ch)

    def _structural_char(self, ch: str) -> None:
        top = self._frames[-1] if self._frames else None
        if ch == '"':
            self._in_string = True
            self._is_key = top is not None and top.is_object and top.expecting_key
            self._buffer = []
        elif ch in "{[":
            self._frames.append(_Frame(True, None, True) if ch == "{" else _Frame(False, 0, False))
        elif ch in "}]":
            self._end_scalar()
            if self._frames:
                self._frames.pop()
                self._value_ended(self._current_path())
        elif ch == ",":
            self._end_scalar()
            if top is not None:
                if top.is_object:
                    top.expecting_key = True
                elif isinstance(top.step, int):
                    top.step += 1
        elif ch == ":" or ch.isspace():
            self._end_scalar()
        else:
            self._scalar = True
