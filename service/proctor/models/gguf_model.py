"""A ``.gguf`` model loaded for ``--weights gguf``: everything from the file itself, no fp32 copy.

- The config from the ``general.*``/``<arch>.*`` metadata (what transformers' reader drops put back:
  models/gguf_config.py), the tokenizer from ``tokenizer.ggml.*`` and its
  chat template from ``tokenizer.chat_template``: transformers' own GGUF readers (the ones
  ``from_pretrained(gguf_file=...)`` uses), without its dequantization of every tensor.
- The model is transformers' class for that config built on the meta device: a skeleton that holds the
  config, the generation config and real rotary tables, but no weights. The slot forward reads the file's
  blocks (models/gguf_layers.py), so load time and resident memory track the file size.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from proctor.models.errors import ModelError
from proctor.models.gguf_config import apply_rope_freqs, complete_config
from proctor.models.gguf_file import GgufFile, one_reader
from proctor.models.gguf_tokenizer import load_gguf_config, load_gguf_tokenizer

log = logging.getLogger("proctor.models")


def load_gguf_blocks(path: Path) -> tuple[torch.nn.Module, Any, Path]:
    """The model skeleton (served from ``path``'s blocks), its tokenizer, and where that tokenizer loads
    from again (models/gguf_tokenizer.py)."""
    from transformers import AutoModelForCausalLM

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
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")  # type: ignore[no-untyped-call]  # third-party typing
    _rebuild_rotary(model)
    apply_rope_freqs(model, file)
    model.eval()
    model.requires_grad_(False)
    attach(model, file)
    types = ", ".join(f"{count} {kind}" for kind, count in sorted(file.block_types().items()))
    log.info("GGUF %s: architecture %s (%s), matrices %s, served from the file's blocks (read in %.1f s)",
             path.name, file.architecture, config.model_type, types, time.perf_counter() - started)
    return model, tokenizer, tokenizer_path


def _rebuild_rotary(model: torch.nn.Module) -> None:
    """The rotary modules again, on the CPU: built on the meta device their frequency tables hold nothing."""
    for name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RotaryEmbedding"):
            parent_name, _, attribute = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attribute, type(module)(config=module.config))
