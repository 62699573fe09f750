"""Content fingerprints of a model's weights and tokenizer, recorded with every audited generation.

Two models are "the same" for audit purposes when these digests match, whatever their paths.

* Directory weights: sha256 over the sorted top-level weight files (``*.safetensors``, ``*.bin``,
  ``*.gguf``); each file contributes its name, its size and its content, so renames and reorders show.
* Directory tokenizer: the same scheme over the tokenizer files that are present (``tokenizer.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json``, vocab/merges files, chat templates).
* A ``.gguf`` file: the weights digest is the plain sha256 of the file (comparable with published
  checksums). Its tokenizer lives inside the file's metadata, so the tokenizer digest is taken from
  the tokenizer *as loaded*: ``backend_tokenizer.to_str()``, the chat template and the special-token
  map. That digest is therefore not comparable with a directory's file-based digest.

Not cached: hashing the 538 MB fp32 default model takes about 0.4 s here (page cache warm), which is
small next to loading the model, and a cache keyed on mtimes would be one more way to be wrong.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
# ``*.bin`` files that are not weights (written by HF Trainer).
_NOT_WEIGHTS = frozenset({"training_args.bin", "optimizer.bin", "scheduler.bin", "rng_state.bin"})
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
)


def file_sha256(path: Path) -> str:
    """Plain streamed sha256 of one file."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files_sha256(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.name):
        digest.update(path.name.encode("utf-8") + b"\0")
        digest.update(path.stat().st_size.to_bytes(8, "big"))
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def weight_files(model_dir: Path) -> list[Path]:
    """The top-level weight files of a model directory, sorted by name."""
    return sorted(
        p
        for p in Path(model_dir).iterdir()
        if p.is_file() and p.suffix in WEIGHT_SUFFIXES and p.name not in _NOT_WEIGHTS
    )


def tokenizer_files(model_dir: Path) -> list[Path]:
    """The tokenizer files present in a model directory, sorted by name."""
    return sorted(p for name in TOKENIZER_FILES if (p := Path(model_dir) / name).is_file())


def weights_sha256(model_path: Path) -> str:
    """Fingerprint of the weights of a model directory or of a ``.gguf`` file (see module docstring)."""
    path = Path(model_path)
    if path.is_file():
        return file_sha256(path)
    files = weight_files(path)
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) in {path}")
    return _files_sha256(files)


def tokenizer_sha256(model_path: Path, tokenizer: Any | None = None) -> str:
    """Fingerprint of a directory's tokenizer files, or of a loaded tokenizer for a ``.gguf`` file.

    For a ``.gguf`` path, pass the loaded ``tokenizer`` to avoid loading it a second time.
    """
    path = Path(model_path)
    if path.is_dir():
        files = tokenizer_files(path)
        if not files:
            raise FileNotFoundError(f"no tokenizer files in {path}")
        return _files_sha256(files)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    return loaded_tokenizer_sha256(tokenizer)


def loaded_tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of a loaded fast tokenizer: its serialized backend, chat template and special-token map."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__} has no backend_tokenizer (only fast tokenizers are supported)")
    digest = hashlib.sha256()
    digest.update(backend.to_str().encode("utf-8") + b"\0")
    template = tokenizer.chat_template
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    digest.update(template.encode("utf-8") + b"\0")
    digest.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()
