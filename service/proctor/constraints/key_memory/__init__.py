"""Objects whose keys the mask remembers (issue 56): a layer over any engine's JSON-schema matcher that never lets
an object take a key it already has. ``keyed`` wraps a compiled constraint; the rest is inside: the memory itself
in Python (layer.py, the reference) and compiled (keys.cpp through native.py, what serves where it builds)."""

from __future__ import annotations

from typing import Any

from proctor.constraints.backend import CompiledConstraint
from proctor.constraints.key_memory.layer import KeyMemory
from proctor.constraints.key_memory.matcher import KeyedCompiled, KeyedFastMatcher, KeyedMatcher
from proctor.constraints.key_memory.vocabulary import KeyVocabulary, key_vocabulary
from proctor.constraints.spec import ConstraintKind

__all__ = ["KeyMemory", "KeyVocabulary", "KeyedCompiled", "KeyedFastMatcher", "KeyedMatcher", "key_vocabulary",
           "keyed"]


def keyed(compiled: CompiledConstraint, tokenizer: Any, vocab_size: int) -> CompiledConstraint:
    """``compiled`` with the key memory over its matchers when it is a JSON schema (other kinds as they are)."""
    if compiled.spec.kind is not ConstraintKind.JSON_SCHEMA or isinstance(compiled, KeyedCompiled):
        return compiled
    from proctor.constraints.key_memory.native import native_memory  # (here: `python -m` builds it, warning-free)

    native = native_memory(tokenizer, vocab_size)
    if native is not None:
        return KeyedCompiled(compiled, native)
    vocab = key_vocabulary(tokenizer, vocab_size)
    cache: dict[Any, tuple[int, ...]] = {}  # the Python memory's answers, shared by the rows of this constraint
    return KeyedCompiled(compiled, lambda: KeyMemory(vocab, cache))
