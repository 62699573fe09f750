"""Constraint engine adapters; each engine is imported only when its backend is first built.

Building a backend is the per-model tier (tokenizer tables), measured with SmolLM2-135M-Instruct
(vocab 49152, 2 CPU cores): xgrammar ~0.75 s, llguidance ~0.5 s, outlines ~0.45 s, once per model.
"""

from __future__ import annotations

from typing import Any

from proctor.constraints.backend import Backend


def create_backend(name: str, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> Backend:
    """Build the named engine's backend for one model (the engine module is imported here)."""
    eos = tuple(int(i) for i in eos_token_ids)
    if not eos:
        raise ValueError("at least one EOS token id is needed")
    if name == "xgrammar":
        from proctor.constraints.backends.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, eos)
    if name == "llguidance":
        from proctor.constraints.backends.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(tokenizer, vocab_size, eos)
    if name == "outlines":
        from proctor.constraints.backends.outlines_backend import OutlinesBackend

        return OutlinesBackend(tokenizer, vocab_size, eos)
    raise ValueError(f"unknown constraint backend {name!r}; expected one of xgrammar, llguidance, outlines")
