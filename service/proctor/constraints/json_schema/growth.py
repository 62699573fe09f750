"""What one more free token can begin, and an ending must then finish: the budget rule's margin (engine/closing.py).

Per schema (``growth_texts``): each property's ``"key":value`` and each array item over every part of the schema,
and the value itself where the schema offers alternatives. Per state (``growth_here``): the members and items
still to write of the values open where the output stands (a token may close the inner ones first and begin a
member of an outer one), and of the value the next token may open (it may open it and begin its member in one),
so a row deep in a recursive schema keeps the margin of one more level there, and a row in a small corner of a
large schema is not held to the largest member anywhere. Each value is taken under each of its alternatives at its
shortest: one token may begin the costliest (``{`` of an object whose members are required, where ``null`` was the
shortest), and the ending must then finish that. The per-state texts are a part of the per-schema ones (or
shorter), so the per-schema margin bounds every state's.
"""

from __future__ import annotations

import json
from typing import Any

from proctor.constraints.json_schema.closer import JsonCloser
from proctor.constraints.json_schema.options import Schema, item_schemas
from proctor.constraints.json_schema.pattern_text import shortest_completion
from proctor.constraints.json_schema.walk import reachable


def growth_texts(schema: Schema | bool) -> list[str]:
    """The texts one free token can begin anywhere in an output of ``schema``: their longest is the most one more
    token can add to what ending an output costs."""
    closer = JsonCloser(schema)
    texts = choices(closer, closer.options(schema))
    for site in reachable(schema):
        for option in closer.options(site.node):
            texts += site_texts(closer, option)
    return texts


def growth_here(closer: JsonCloser) -> list[str]:
    """The texts one more token can begin from where ``closer``'s output stands: a member or item of any value
    open, or of the value it may open next (and that value under another of its alternatives); none once the
    output is complete."""
    if closer.done:
        return []
    texts = [text for options, written in closer.open_values() for option in options
             for text in site_texts(closer, option, written)]
    following = closer.next_options() or []
    return texts + choices(closer, following) + [text for option in following for text in site_texts(closer, option)]


def site_texts(closer: JsonCloser, option: Schema, written: tuple[str, ...] = ()) -> list[str]:
    """Each member of ``option`` (but those ``written``: the one being written has its value in the ending; a
    pattern's by its shortest name, an additional one by a made-up name) as ``"key":value`` and each of its items
    as ``value,``, under every alternative of the value."""
    texts: list[str] = []
    members = [(name, sub) for name, sub in (option.get("properties") or {}).items() if name not in written]
    for pattern, sub in (option.get("patternProperties") or {}).items():  # a pattern's shortest name
        name = shortest_completion(str(pattern))
        members += [(name, sub)] if name is not None else []
    if option.get("additionalProperties", True) is not False:  # a made-up name (one character at least)
        members.append(("a", option.get("additionalProperties", True)))
    for name, sub in members:
        key = json.dumps(name, ensure_ascii=False) + ":"
        texts += [key + value for value in branch_texts(closer, sub)]
    for sub in item_schemas(option):
        texts += [value + "," for value in branch_texts(closer, sub)]
    return texts


def choices(closer: JsonCloser, options: list[Schema]) -> list[str]:
    """A value's shortest text under each of ``options`` where it has several (with one, the ending holds it)."""
    texts = [text for text in (closer.value_text([option]) for option in options) if text is not None]
    return texts if len(texts) > 1 else []


def branch_texts(closer: JsonCloser, node: Any) -> list[str]:
    """The shortest value under each alternative of ``node``."""
    return [text for text in (closer.value_text([option]) for option in closer.options(node)) if text is not None]
