"""A ``.gguf`` model loaded for ``--weights gguf``: everything from the file itself, no fp32 copy.

- The config from the ``general.*``/``<arch>.*`` metadata (what transformers' reader drops put back:
  models/gguf_config.py), the tokenizer from ``tokenizer.ggml.*`` and its
  chat template from ``tokenizer.chat_template``: transformers' own GGUF readers (the ones
  ``from_pretrained(gguf_file=...)`` uses), without its dequantization of every tensor.
- The model is a skeleton that holds the config, the generation config and the rotary tables
  (models/rotary.py: transformers' tables without importing its modeling module), and no weights. The slot
  forward reads the file's blocks (models/gguf_layers.py), so load time and resident memory track the file
  size. transformers' own forward cannot run on it: ``--weights gguf`` serves the families the slot forward
  describes (executor/families.py), and refuses the others at start-up, naming what differs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from proctor.executor.families import SERVED
from proctor.models.errors import ModelError
from proctor.models.gguf_config import apply_rope_freqs, complete_config
from proctor.models.gguf_file import GgufFile, one_reader
from proctor.models.gguf_tokenizer import load_gguf_config, load_gguf_tokenizer
from proctor.models.rotary import Rotary

log = logging.getLogger("proctor.models")


def load_gguf_blocks(path: Path) -> tuple[torch.nn.Module, Any, Path]:
    """The model skeleton (served from ``path``'s blocks), its tokenizer, and where that tokenizer loads
    from again (models/gguf_tokenizer.py)."""
    from proctor.models.gguf_layers import attach

    started = time.perf_counter()
    path = path.resolve()
    file = GgufFile(path)  # refuses a block type with no kernel, naming it
    with one_reader(path):  # the file parsed whole only if the tokenizer or the config is not cached
        try:
            tokenizer, tokenizer_path = load_gguf_tokenizer(path, file.metadata_bytes)
            config = load_gguf_config(path, file.metadata_bytes)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"could not read the model described in {path.name} (GGUF architecture "
                             f"{file.architecture!r}): {exc}") from exc
    complete_config(config, file)
    model = GgufSkeleton(config)
    if model.model.rotary_emb is not None:
        apply_rope_freqs(model.model.rotary_emb, file)
    attach(model, file)
    types = ", ".join(f"{count} {kind}" for kind, count in sorted(file.block_types().items()))
    log.info("GGUF %s: architecture %s (%s), matrices %s, served from the file's blocks (read in %.1f s)",
             path.name, file.architecture, config.model_type, types, time.perf_counter() - started)
    return model, tokenizer, tokenizer_path


class GgufSkeleton(torch.nn.Module):
    """What the slot forward and the loader read of a model, without its matrices: ``config``,
    ``generation_config`` and ``model.rotary_emb`` (None for a family the slot forward does not serve)."""

    def __init__(self, config: Any) -> None:
        from transformers import GenerationConfig

        super().__init__()
        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)
        self.model = _Body(Rotary(config) if config.model_type in SERVED else None)
        self.eval()
        self.requires_grad_(False)


class _Body(torch.nn.Module):
    """Where transformers' classes keep the rotary module (``model.model.rotary_emb``)."""

    def __init__(self, rotary: Rotary | None) -> None:
        super().__init__()
        self.rotary_emb = rotary
