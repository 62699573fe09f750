"""The shortest text that completes a string under a JSON Schema ``pattern`` (issue 45's closer).

A ``pattern`` matches anywhere in the string (ECMA-262 ``search``, as JSON Schema says and llguidance does), so
the pattern is read as ``.*P.*`` with its own ``^``/``$`` anchors taking the place of the ``.*``. interegular
turns it into a finite automaton; a breadth-first search from the state the written text reaches finds the
fewest characters to an accepting state, each transition spelled by a plain character (a letter or digit where
the class has one: nothing a JSON string must escape). Patterns interegular cannot read (lookarounds,
backreferences) give None: the closer says it does not cover them.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any

MAX_STATES = 5_000  # an automaton larger than this is not searched (a pattern with huge repetition counts)
PREFERRED = "a0A_-. "  # the first character of a transition's class found here spells it


def shortest_completion(pattern: str, written: str = "") -> str | None:
    """The fewest characters ``t`` such that ``written + t`` matches ``pattern`` (None: none, or not covered)."""
    automaton = _automaton(pattern)
    if automaton is None:
        return None
    fsm, spell, anything_else = automaton
    state = fsm.initial
    for char in written:
        symbol = fsm.alphabet[char] if char in fsm.alphabet else fsm.alphabet[anything_else]
        state = fsm.map.get(state, {}).get(symbol)
        if state is None:
            return None
    return _search(fsm, spell, state)


def _search(fsm: Any, spell: dict[Any, str], start: Any) -> str | None:
    previous: dict[Any, tuple[Any, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if state in fsm.finals:
            path: list[str] = []
            while previous[state] is not None:
                state, char = previous[state]  # type: ignore[misc]
                path.append(char)
            return "".join(reversed(path))
        # By spelling, not the automaton's symbol numbers (built from sets of characters: hash-seed order).
        moves = [(spell[symbol], target) for symbol, target in fsm.map.get(state, {}).items() if symbol in spell]
        for char, target in sorted(moves, key=lambda move: move[0]):
            if target not in previous:
                previous[target] = (state, char)
                queue.append(target)
    return None


def finite_names(pattern: str, limit: int) -> list[str] | None:
    """Every string ``pattern`` matches, sorted, when they are at most ``limit`` (None: more, infinitely many, or a
    pattern interegular cannot read). An unanchored pattern matches infinitely many."""
    automaton = _automaton(pattern)
    if automaton is None:
        return None
    fsm, _, anything_else = automaton
    members: dict[Any, list[str]] = {}
    for char, symbol in fsm.alphabet.items():
        if char is not anything_else:
            members.setdefault(symbol, []).append(char)
    if anything_else in fsm.alphabet:  # every character the pattern does not name: too many to list
        members[fsm.alphabet[anything_else]] = []
    live = _live_states(fsm)
    names: list[str] = []

    def walk(state: Any, text: str, path: frozenset[Any]) -> bool:
        if state in fsm.finals:
            names.append(text)
            if len(names) > limit:
                return False
        for symbol, target in fsm.map.get(state, {}).items():
            if target not in live:
                continue
            if target in path or not members.get(symbol):  # a loop: infinitely many; a class too large to list
                return False
            for char in sorted(members[symbol]):
                if not walk(target, text + char, path | {target}):
                    return False
        return True

    if fsm.initial not in live:
        return []
    return sorted(names) if walk(fsm.initial, "", frozenset({fsm.initial})) else None  # (symbol numbers: hash order)


def _live_states(fsm: Any) -> set[Any]:
    """The states from which a final state can be reached."""
    live = set(fsm.finals)
    changed = True
    while changed:
        changed = False
        for state, moves in fsm.map.items():
            if state not in live and any(target in live for target in moves.values()):
                live.add(state)
                changed = True
    return live


@functools.lru_cache(maxsize=512)
def _automaton(pattern: str) -> tuple[Any, dict[Any, str], Any] | None:
    try:
        import interegular
        from interegular.fsm import anything_else
    except ImportError:  # pragma: no cover - a pinned dependency
        return None
    body = pattern
    anchored_start, anchored_end = body.startswith("^"), body.endswith("$") and not body.endswith("\\$")
    body = body[1 if anchored_start else 0:len(body) - 1 if anchored_end else len(body)]
    full = ("" if anchored_start else ".*") + "(" + body + ")" + ("" if anchored_end else ".*")
    try:
        fsm = interegular.parse_pattern(full).to_fsm()
    except Exception:  # interegular's own errors (unsupported syntax), and a recursion on a huge pattern
        return None
    if len(fsm.states) > MAX_STATES:
        return None
    return fsm, _spellings(fsm.alphabet, anything_else), anything_else


def _spellings(alphabet: Any, anything_else: Any) -> dict[Any, str]:
    """A plain character for each symbol class (none for a class of only characters a JSON string escapes)."""
    members: dict[Any, list[str]] = {}
    for char, symbol in alphabet.items():
        if char is not anything_else and isinstance(char, str) and char.isprintable() and char not in '"\\':
            members.setdefault(symbol, []).append(char)
    spell: dict[Any, str] = {}
    for symbol, chars in members.items():
        plain = next((c for c in PREFERRED if c in chars), None)
        spell[symbol] = plain or min(chars, key=lambda c: (not c.isalnum(), c))
    if anything_else in alphabet:  # a character the pattern never names: the first plain one it does not list
        other = next((c for c in "abcdefghijklmnopqrstuvwxyz0123456789" if c not in alphabet), None)
        if other is not None:
            spell[alphabet[anything_else]] = other
    return spell
