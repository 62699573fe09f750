"""llguidance adapter: JSON Schema, regex, choice, Lark and EBNF (via ``gbnf_to_lark``) grammars.

Notes from checking it against the real tokenizer:

* ``llguidance.hf.from_tokenizer`` takes the EOS ids (``eos_token``) and knows the special
  tokens itself: none of them is ever allowed, EOS only where the grammar may end.
* JSON options are passed as ``overrides``, so a schema's own ``"x-guidance"`` block cannot
  loosen them (the guard refuses that key anyway): ``lenient`` off (unimplemented keywords are
  errors, not ignored), ``coerce_one_of`` off, separators ``,`` and ``:``, whitespace per spec.
* ``json_allowed_escapes`` drops ``\\u`` escapes: with them a key such as ``"\\u0061"`` is taken
  as an additional property while it means ``"a"`` (found with ``additionalProperties`` open),
  so one string had two spellings and only one was checked. Without ``\\u`` each string has one
  spelling; characters below U+0020 without a short escape cannot be written (a restriction).
* ``is_accepting()`` = EOS allowed now; ``is_stopped()`` = nothing but EOS is allowed any more
  (it is also true after an error, which ``advance`` has already reported as False).
* A root schema ``true`` is compiled as ``{}`` (options need an object schema); ``false`` is refused.
* A compiled constraint is the grammar text; matchers are ``deep_copy`` of one template
  matcher (a few µs, against ~0.7 ms to build one).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from proctor.constraints.backends.common import check_row, checked_schema, reason
from proctor.constraints.engines import LLGUIDANCE
from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema import json_options
from proctor.constraints.spec import ConstraintKind, ConstraintSpec, GrammarSyntax, choice_regex

NAME = LLGUIDANCE
MATCHER_OVERHEAD_BYTES = 64 * 1024  # rough size of a built lexer/parser beyond the grammar text


@functools.cache
def _executor() -> Any:
    """llguidance's own thread pool (one thread per usable CPU): a batch's masks computed in parallel,
    outside the GIL."""
    import llguidance

    from proctor.cpus import cpu_budget

    return llguidance.LLExecutor(cpu_budget())


class LLGuidanceMatcher:
    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        target = check_row(bitmask, row)
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * target.element_size())

    @staticmethod
    def fill_together(bitmask: torch.Tensor, pairs: list[tuple[LLGuidanceMatcher, int]]) -> None:
        """Several rows' masks at once, on llguidance's threads (the same masks as one by one)."""
        if len(pairs) == 1:
            pairs[0][0].fill_bitmask(bitmask, pairs[0][1])
            return
        for _, row in pairs:
            check_row(bitmask, row)
        if not bitmask.is_contiguous():
            raise ValueError("the bitmask must be contiguous")
        _executor().unsafe_compute_mask_ptr([(matcher._matcher, row) for matcher, row in pairs], bitmask.data_ptr(),
                                            bitmask.shape[1] * bitmask.element_size(), bitmask.shape[0])

    def advance(self, token_id: int) -> bool:
        return bool(self._matcher.consume_token(token_id))

    def can_end(self) -> bool:
        return bool(self._matcher.is_accepting())

    def must_end(self) -> bool:
        return bool(self._matcher.is_stopped())

    def rollback(self, tokens: int) -> None:
        self._matcher.rollback(tokens)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar accepts from here, the state unchanged (a rejected ``advance``
        would leave llguidance's matcher in its error state, which no rollback undoes)."""
        return int(self._matcher.validate_tokens(tokens))

    def forced_tokens(self, limit: int) -> list[int]:
        """The tokens the grammar forces from here (llguidance's own fast-forward; the state is unchanged)."""
        return list(self._matcher.compute_ff_tokens())[:limit]

    def fork(self) -> LLGuidanceMatcher:
        """An independent copy at the same position (beam search: each beam keeps its own state)."""
        return LLGuidanceMatcher(self._matcher.deep_copy())


class LLGuidanceCompiled:
    backend = NAME

    def __init__(self, spec: ConstraintSpec, grammar: str, template: Any) -> None:
        self.spec = spec
        self._grammar = grammar
        self._template = template  # never advanced; each request gets a deep copy

    def new_matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._template.deep_copy())

    def to_bytes(self) -> bytes:
        return self._grammar.encode("utf-8")

    def memory_bytes(self) -> int:
        return len(self._grammar) + MATCHER_OVERHEAD_BYTES


class LLGuidanceBackend:
    """Holds the LLTokenizer (the per-model tier); compiles specs into llguidance grammar text."""

    name = NAME

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        import llguidance
        import llguidance.hf
        from llguidance.gbnf_to_lark import gbnf_to_lark

        self._llg = llguidance
        self._gbnf_to_lark = gbnf_to_lark
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids))

    def compile(self, spec: ConstraintSpec) -> LLGuidanceCompiled:
        if spec.kind is ConstraintKind.CHOICE and not spec.options:
            raise ConstraintError("a choice needs at least one option", NAME)
        schema = checked_schema(spec, NAME) if spec.kind is ConstraintKind.JSON_SCHEMA else ""
        if schema == "false":
            raise ConstraintError("the schema `false` admits no value", NAME)
        if schema == "true":
            schema = "{}"  # llguidance applies its options to an object schema only; `true` means `{}`
        try:
            grammar = self._grammar(spec, schema)
        except ConstraintError:
            raise
        except Exception as exc:  # gbnf_to_lark and the grammar_from_* helpers raise ValueError
            raise ConstraintError(reason(exc), NAME) from exc
        return self._build(spec, grammar)

    def _grammar(self, spec: ConstraintSpec, schema: str) -> str:
        matcher = self._llg.LLMatcher
        if spec.kind is ConstraintKind.JSON_SCHEMA:
            return matcher.grammar_from_json_schema(schema, overrides=json_options(spec.flexible_whitespace))  # type: ignore[arg-type]  # third-party typing
        if spec.kind is ConstraintKind.REGEX:
            return matcher.grammar_from_regex(spec.text)
        if spec.kind is ConstraintKind.CHOICE:
            return matcher.grammar_from_regex(choice_regex(spec.options))
        if spec.kind is ConstraintKind.GRAMMAR:
            text = spec.text if spec.syntax is GrammarSyntax.LARK else self._gbnf_to_lark(spec.text)
            return matcher.grammar_from_lark(text)
        raise ConstraintError(f"unknown constraint kind {spec.kind!r}", NAME)

    def _build(self, spec: ConstraintSpec, grammar: str) -> LLGuidanceCompiled:
        """Validate the grammar and build the template matcher; warnings count as errors for JSON."""
        matcher = self._llg.LLMatcher
        is_error, messages = matcher.validate_grammar_with_warnings(grammar, self._tokenizer)
        if is_error or (messages and spec.kind is ConstraintKind.JSON_SCHEMA):
            raise ConstraintError(reason(Exception("; ".join(messages))), NAME)
        template = matcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            raise ConstraintError(reason(Exception(template.get_error())), NAME)
        return LLGuidanceCompiled(spec, grammar, template)

    def load(self, spec: ConstraintSpec, data: bytes) -> LLGuidanceCompiled:
        try:
            grammar = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConstraintError(f"cannot load the compiled grammar: {exc}", NAME) from exc
        return self._build(spec, grammar)
