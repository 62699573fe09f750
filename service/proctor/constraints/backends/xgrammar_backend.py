"""xgrammar adapter: JSON Schema, regex, choice and EBNF grammars (no Lark).

Notes from checking it against the real tokenizer:

* The vocabulary is given to xgrammar as decoded bytes (``VocabType.RAW``) with special tokens
  blanked: built with ``TokenizerInfo.from_huggingface`` it treats ``<|im_start|>``,
  ``<repo_name>`` and the like as literal text and lets ``.*`` or ``<[a-z_]+>`` pick them, while
  the detokenizer drops them from the output.
* ``any_whitespace=False`` alone gives ``", "`` and ``": "`` separators; compact output needs
  ``separators=(",", ":")`` as well.
* ``strict_mode=True`` closes objects and arrays that do not say otherwise (a restriction, sound).
  Schema keywords it does not enforce are refused beforehand by the soundness guard (json_schema/support.py).
* ``is_completed()`` says the stop token is allowed now; "only the stop token" has no direct
  query, so ``must_end`` computes the mask, but only when completed, and keeps it for the next
  ``fill_bitmask`` of the same state (no extra work in the common case).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from proctor.constraints.backend import bitmask_words
from proctor.constraints.backends.common import allows_other_than, check_row, checked_schema, eos_row, reason
from proctor.constraints.backends.vocab import token_bytes
from proctor.constraints.engines import XGRAMMAR
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import MAX_JSON_WHITESPACE, ConstraintKind, ConstraintSpec, GrammarSyntax, choice_regex

NAME = XGRAMMAR
COMPILE_THREADS = 2


class XGrammarMatcher:
    """One request's state: a GrammarMatcher plus the mask that ``must_end`` may have computed."""

    def __init__(self, matcher: Any, eos: torch.Tensor) -> None:
        self._matcher = matcher
        self._eos = eos
        self._mask: torch.Tensor | None = None  # the current state's mask, when already computed

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._matcher.is_terminated():
            check_row(bitmask, row).copy_(self._eos)
        elif self._mask is not None:
            check_row(bitmask, row).copy_(self._mask)
        else:
            self._matcher.fill_next_token_bitmask(bitmask, row)

    def advance(self, token_id: int) -> bool:
        self._mask = None
        return bool(self._matcher.accept_token(token_id))

    def can_end(self) -> bool:
        return bool(self._matcher.is_terminated() or self._matcher.is_completed())

    def rollback(self, tokens: int) -> None:
        self._mask = None
        self._matcher.rollback(tokens)

    def must_end(self) -> bool:
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        if self._mask is None:
            scratch = torch.empty((1, self._eos.numel()), dtype=torch.int32)
            self._matcher.fill_next_token_bitmask(scratch, 0)
            self._mask = scratch[0]
        return not allows_other_than(self._mask, self._eos)


class XGrammarCompiled:
    backend = NAME

    def __init__(self, spec: ConstraintSpec, compiled: Any, eos: torch.Tensor) -> None:
        self.spec = spec
        self._compiled = compiled
        self._eos = eos

    def new_matcher(self) -> XGrammarMatcher:
        import xgrammar

        return XGrammarMatcher(xgrammar.GrammarMatcher(self._compiled), self._eos)

    def to_bytes(self) -> bytes:
        return cast(bytes, self._compiled.serialize_json().encode("utf-8"))

    def memory_bytes(self) -> int:
        return int(self._compiled.memory_size_bytes)


class XGrammarBackend:
    """Holds the xgrammar TokenizerInfo and a compiler (its cache off: the service caches)."""

    name = NAME

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        import xgrammar

        self._xgr = xgrammar
        vocab = [piece if piece is not None else b"" for piece in token_bytes(tokenizer, vocab_size)]
        self._info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=vocab_size,
                                            stop_token_ids=list(eos_token_ids))
        self._compiler = xgrammar.GrammarCompiler(self._info, max_threads=COMPILE_THREADS, cache_enabled=False)
        self._eos = eos_row(eos_token_ids, bitmask_words(vocab_size))

    def compile(self, spec: ConstraintSpec) -> XGrammarCompiled:
        if spec.kind is ConstraintKind.GRAMMAR and spec.syntax is not GrammarSyntax.EBNF:
            raise ConstraintError("xgrammar does not support Lark grammars; use EBNF or another backend", NAME)
        if spec.kind is ConstraintKind.CHOICE and not spec.options:
            raise ConstraintError("a choice needs at least one option", NAME)
        schema = checked_schema(spec, NAME) if spec.kind is ConstraintKind.JSON_SCHEMA else ""
        try:
            compiled = self._compile(spec, schema)
        except ConstraintError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses with the reason
            raise ConstraintError(reason(exc), NAME) from exc
        return XGrammarCompiled(spec, compiled, self._eos)

    def _compile(self, spec: ConstraintSpec, schema: str) -> Any:
        if spec.kind is ConstraintKind.JSON_SCHEMA:
            if spec.flexible_whitespace:
                return self._compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=True,
                                                          max_whitespace_cnt=MAX_JSON_WHITESPACE)
            return self._compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"),
                                                      strict_mode=True)
        if spec.kind is ConstraintKind.REGEX:
            return self._compiler.compile_regex(spec.text)
        if spec.kind is ConstraintKind.CHOICE:
            return self._compiler.compile_regex(choice_regex(spec.options))
        if spec.kind is ConstraintKind.GRAMMAR:
            return self._compiler.compile_grammar(spec.text)
        raise ConstraintError(f"unknown constraint kind {spec.kind!r}", NAME)

    def load(self, spec: ConstraintSpec, data: bytes) -> XGrammarCompiled:
        try:
            compiled = self._xgr.CompiledGrammar.deserialize_json(data.decode("utf-8"), self._info)
        except Exception as exc:
            raise ConstraintError(f"cannot load the compiled grammar: {reason(exc)}", NAME) from exc
        return XGrammarCompiled(spec, compiled, self._eos)
