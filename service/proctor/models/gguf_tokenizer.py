"""A GGUF file's tokenizer and transformers config, converted once and then read back from disk.

transformers builds a ``.gguf`` file's tokenizer from its ``tokenizer.ggml.*`` metadata, a conversion of
every token and merge that takes 5–8 s at 128k–152k tokens; and each constraint compile worker, a process
of its own, did it again at start-up. The converted tokenizer is saved (``save_pretrained``) under the
tokenizer cache, keyed by a digest of the file's bytes before its tensor data (the header, the metadata the
tokenizer comes from, the tensor table) and of the converting libraries' versions, and read back from there
(a ``tokenizer.json`` load, a fraction of a second) by the server and its workers. The cached tokenizer is
the converted one serialised: the same backend, chat template and special tokens, so the same fingerprint
(models/fingerprint.py; tests/unit/test_gguf_tokenizer.py). The config transformers reads from the same
metadata (another parse of the whole file, ~1 s at 152k tokens) is kept in the entry beside it (``config.json``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from proctor.config import default_tokenizer_cache

log = logging.getLogger("proctor.models")
CACHE_FORMAT = 1  # bump when what is saved changes
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "config.json"


def cache_key(path: Path, metadata_bytes: int) -> str:
    """Digest of the file's first ``metadata_bytes`` (everything before the tensor data) and the versions of
    the libraries that convert and load it."""
    import tokenizers
    import transformers

    digest = hashlib.sha256(f"{CACHE_FORMAT}\0{transformers.__version__}\0{tokenizers.__version__}\0".encode())
    with path.open("rb") as handle:
        remaining = metadata_bytes
        while remaining > 0:
            chunk = handle.read(min(remaining, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()[:32]


def load_gguf_tokenizer(path: Path, metadata_bytes: int, cache: Path | None = None) -> tuple[Any, Path]:
    """``path``'s tokenizer and where it can be loaded from again (the cache entry; the file itself when the
    cache cannot be written). Call within ``gguf_file.one_reader(path)`` so a conversion reuses the parse."""
    from transformers import AutoTokenizer

    root = cache if cache is not None else default_tokenizer_cache()
    entry = root / cache_key(path, metadata_bytes)
    if (entry / TOKENIZER_FILE).is_file():
        try:
            return load_saved(entry), entry
        except (OSError, ValueError) as exc:  # a damaged entry: converted again and replaced
            log.warning("tokenizer cache entry %s unreadable (%s): converting %s again", entry, exc, path.name)
            shutil.rmtree(entry, ignore_errors=True)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, clean_up_tokenization_spaces=False,
                                              local_files_only=True)
    converted_s = time.perf_counter() - started
    if _save(tokenizer, root, entry):
        log.info("tokenizer of %s converted in %.1f s and cached in %s", path.name, converted_s, entry)
        # read back, as every later start and the compile workers will: the saved tokenizer's class rebuilds its
        # normalizer and pre-tokenizer (Qwen2's NFC and split regex, which the converted object lacks), so the
        # first start would otherwise tokenize, and fingerprint, differently from the ones after it
        return load_saved(entry), entry
    return tokenizer, path


def load_gguf_config(path: Path, metadata_bytes: int, cache: Path | None = None) -> Any:
    """transformers' config of ``path`` (``AutoConfig.from_pretrained(..., gguf_file=...)``), read back from the
    tokenizer's cache entry when it is there and saved into it when not (call after ``load_gguf_tokenizer``,
    which makes the entry, and within ``gguf_file.one_reader(path)``)."""
    from transformers import AutoConfig

    entry = (cache if cache is not None else default_tokenizer_cache()) / cache_key(path, metadata_bytes)
    saved = entry / CONFIG_FILE
    if saved.is_file():
        try:
            return AutoConfig.from_pretrained(str(entry), local_files_only=True)
        except (OSError, ValueError) as exc:  # a damaged file: converted again and replaced
            log.warning("config cache entry %s unreadable (%s): converting %s again", saved, exc, path.name)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    if entry.is_dir():
        try:
            handle, staging = tempfile.mkstemp(prefix=".staging-", suffix=".json", dir=entry)
            os.close(handle)
            config.to_json_file(staging)
            os.replace(staging, saved)
        except OSError as exc:
            log.warning("config cache %s not writable (%s): each start converts the config again", entry, exc)
    return config


def load_saved(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, clean_up_tokenization_spaces=False)


def _save(tokenizer: Any, root: Path, entry: Path) -> bool:
    """Write the entry whole or not at all (a temporary directory renamed into place); False if it cannot."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
        tokenizer.save_pretrained(str(staging))
        try:
            os.replace(staging, entry)
        except OSError:  # another process saved the same entry first: keep that one
            shutil.rmtree(staging, ignore_errors=True)
        return (entry / TOKENIZER_FILE).is_file()
    except OSError as exc:
        log.warning("tokenizer cache %s not writable (%s): each start converts the tokenizer again", root, exc)
        return False
