"""Constraint engine adapters; each engine is imported only when its backend is first built.

Building a backend is the per-model tier (tokenizer tables), measured with SmolLM2-135M-Instruct
(vocab 49152, 2 CPU cores): xgrammar ~0.75 s, llguidance ~0.5 s, outlines ~0.45 s, once per model.
"""

from __future__ import annotations

from typing import Any

from proctor.constraints.backend import Backend
from proctor.constraints.engines import ENGINES


def create_backend(name: str, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> Backend:
    """Build the named engine's backend for one model (the engine module is imported here)."""
    eos = tuple(int(i) for i in eos_token_ids)
    if not eos:
        raise ValueError("at least one EOS token id is needed")
    entry = ENGINES.get(name)
    if entry is None:
        raise ValueError(f"unknown constraint backend {name!r}; expected one of {', '.join(ENGINES)}")
    backend: Backend = entry.adapter_class()(tokenizer, vocab_size, eos)
    return backend
