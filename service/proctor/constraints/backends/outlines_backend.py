"""outlines-core adapter: JSON Schema (via its regex translation), regex and choice; no grammars.

Notes from checking it against the real tokenizer:

* ``Vocabulary(eos_id, {token_bytes: [ids]})`` wants the bytes a token stands for, not the
  vocabulary strings: given ``"Ġ2024"`` it would match the characters ``Ġ2024``. Bytes come from
  ``vocab.token_bytes`` (special tokens and EOS left out; outlines-core refuses EOS in the map).
* One EOS id only: the first of ``eos_token_ids``; the others are added to the mask, and accepted
  by ``advance``, wherever the first is.
* The index allows EOS in final states, but ``Guide.advance(eos)`` raises; the matcher keeps its
  own "ended" flag instead of advancing the guide with EOS.
* ``build_regex_from_schema(schema, "")`` gives compact JSON; the default whitespace pattern
  (flexible) is ``[ ]?``: one optional space, no newlines.
* Compile time is the index build over the vocabulary: tens of ms for a small schema, but
  seconds to minutes for open-ended ones (``{"type": ["array", "object"]}`` took 96 s).
* ``Guide.write_mask_into`` writes our int32 layout directly (zeroing the row first).
* Serialized as ``Index``'s own binary form (what its pickle support uses), no pickle.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from proctor.constraints.backend import bitmask_words
from proctor.constraints.backends.common import check_row, checked_schema, eos_row, reason
from proctor.constraints.backends.vocab import token_bytes
from proctor.constraints.engines import OUTLINES
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintKind, ConstraintSpec, choice_regex

NAME = OUTLINES


class OutlinesMatcher:
    def __init__(self, compiled: OutlinesCompiled, guide: Any) -> None:
        self._compiled = compiled
        self._guide = guide
        self._ended = False  # an EOS token was accepted

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        target = check_row(bitmask, row)
        if self._ended:
            target.copy_(self._compiled.eos)
            return
        self._guide.write_mask_into(target.data_ptr(), target.numel(), target.element_size())
        if self._compiled.extra_eos and self._guide.is_finished():
            target |= self._compiled.eos

    def advance(self, token_id: int) -> bool:
        if self._ended:
            return False
        if token_id in self._compiled.eos_ids:
            self._ended = bool(self._guide.is_finished())
            return self._ended
        try:
            self._guide.advance(token_id, False)
        except ValueError:
            return False  # no transition: the token was not allowed
        return True

    def can_end(self) -> bool:
        return self._ended or bool(self._guide.is_finished())

    def rollback(self, tokens: int) -> None:
        if self._ended:  # the EOS token was accepted without moving the guide
            self._ended = False
            tokens -= 1
        if tokens:
            self._guide.rollback_state(tokens)

    def must_end(self) -> bool:
        return self._ended or (bool(self._guide.is_finished()) and self._compiled.only_eos(self._guide.get_state()))


class OutlinesCompiled:
    backend = NAME

    def __init__(self, spec: ConstraintSpec, index: Any, eos_ids: tuple[int, ...], words: int) -> None:
        self.spec = spec
        self.index = index
        self.eos_ids = frozenset(eos_ids)
        self.extra_eos = len(self.eos_ids) > 1
        self.eos = eos_row(eos_ids, words)
        self._primary_eos = eos_ids[0]
        self._only_eos: dict[int, bool] = {}  # per state; shared by matchers, filled lazily
        self._size: int | None = None

    def only_eos(self, state: int) -> bool:
        if state not in self._only_eos:
            self._only_eos[state] = set(self.index.get_allowed_tokens(state)) <= {self._primary_eos}
        return self._only_eos[state]

    def new_matcher(self) -> OutlinesMatcher:
        from outlines_core import Guide

        return OutlinesMatcher(self, Guide(self.index))

    def to_bytes(self) -> bytes:
        _, (data,) = self.index.__reduce__()  # (Index.from_binary, (bytes,))
        return bytes(data)

    def memory_bytes(self) -> int:
        if self._size is None:
            self._size = len(self.to_bytes())
        return self._size


class OutlinesBackend:
    """Holds the outlines-core Vocabulary built from the tokenizer (no hub access)."""

    name = NAME

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        import outlines_core

        self._oc = outlines_core
        self._eos_ids = tuple(eos_token_ids)
        self._words = bitmask_words(vocab_size)
        tokens: dict[bytes, list[int]] = {}
        for index, piece in enumerate(token_bytes(tokenizer, vocab_size)):
            if piece is not None and index not in self._eos_ids:
                tokens.setdefault(piece, []).append(index)
        self._vocabulary = outlines_core.Vocabulary(self._eos_ids[0], tokens)

    def compile(self, spec: ConstraintSpec) -> OutlinesCompiled:
        if spec.kind is ConstraintKind.GRAMMAR:
            raise ConstraintError("outlines-core supports no context-free grammars", NAME)
        if spec.kind is ConstraintKind.CHOICE and not spec.options:
            raise ConstraintError("a choice needs at least one option", NAME)
        try:
            index = self._oc.Index(self._regex(spec), self._vocabulary)
        except ConstraintError:
            raise
        except Exception as exc:  # ValueError with the reason (unsupported structure, bad regex)
            raise ConstraintError(reason(exc), NAME) from exc
        return OutlinesCompiled(spec, index, self._eos_ids, self._words)

    def _regex(self, spec: ConstraintSpec) -> str:
        if spec.kind is ConstraintKind.JSON_SCHEMA:
            schema = checked_schema(spec, NAME)
            from outlines_core.json_schema import build_regex_from_schema

            regex = build_regex_from_schema(schema) if spec.flexible_whitespace else build_regex_from_schema(schema, "")
            return cast(str, regex)
        if spec.kind is ConstraintKind.REGEX:
            return spec.text
        if spec.kind is ConstraintKind.CHOICE:
            return choice_regex(spec.options)
        raise ConstraintError(f"unknown constraint kind {spec.kind!r}", NAME)

    def load(self, spec: ConstraintSpec, data: bytes) -> OutlinesCompiled:
        try:
            index = self._oc.Index.from_binary(data)
        except Exception as exc:
            raise ConstraintError(f"cannot load the compiled index: {reason(exc)}", NAME) from exc
        return OutlinesCompiled(spec, index, self._eos_ids, self._words)
