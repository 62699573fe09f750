"""A model ready for the engine: what ``models/`` loads and the engine, the constraints and the audit read.

It lives on the engine's side of the line: ``models/`` builds it (models/loader.py), the engine runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference plus the facts about it that requests and audit records need."""

    model: torch.nn.Module
    tokenizer: Any
    model_id: str
    path: Path
    weights_sha256: str
    tokenizer_sha256: str
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    bos_token_id: int | None
    context_length: int
    vocab_size: int
    special_token_ids: frozenset[int]
    weights: str = "dense"  # how the slot forward runs the linear layers (executor/weights.py)
    tokenizer_path: Path | None = None  # where the tokenizer loads from again (a GGUF's: its cache entry); else path

    @property
    def tokenizer_source(self) -> Path:
        return self.tokenizer_path or self.path
