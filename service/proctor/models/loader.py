"""Load the configured model and tokenizer once, with everything the engine and the audit need to know about them.

``settings.model`` decides the source:

* empty → the converted default model in ``settings.model_store`` (installed by ``make setup``);
* an existing directory → a Hugging Face model directory;
* a path ending in ``.gguf`` → a GGUF file: served from its own blocks (``--weights gguf``, the default on
  CPU: models/gguf_model.py), or dequantized on load for the other modes (slow: ~25 s for 135M);
* anything else → a Hugging Face hub id, only when the hub is allowed (``HF_HUB_OFFLINE`` unset);
  its files are fetched into the hub cache first so that it can be fingerprinted like a directory.

Placement rules (``dtype=auto`` → fp32 on CPU, bf16 on CUDA) live in :mod:`proctor.models.placement`.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from proctor.config import Settings
from proctor.engine.loaded_model import LoadedModel
from proctor.models.default_model import default_model_path, is_installed
from proctor.models.errors import ModelError
from proctor.models.fingerprint import loaded_tokenizer_sha256, tokenizer_sha256, weight_files, weights_sha256
from proctor.models.gguf_model import load_gguf_blocks
from proctor.models.placement import apply_threads, resolve_device, resolve_dtype, resolve_weights
from proctor.offline import hub_allowed, offline

log = logging.getLogger("proctor.models")

SourceKind = Literal["dir", "gguf", "hub"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, resolved from ``settings.model`` before anything heavy is imported."""

    kind: SourceKind
    path: Path  # the directory or .gguf file (for "hub": the downloaded snapshot, filled in on load)
    model_id: str


def resolve_source(settings: Settings) -> ModelSource:
    """Map ``settings.model`` to a source, with an actionable error for each way it can be wrong."""
    spec = settings.model.strip()
    if not spec:
        store = Path(settings.model_store)
        path = default_model_path(store)
        if not is_installed(store):
            raise ModelError(
                f"the default model is not installed in {store}; run `make setup` "
                "(or `python -m proctor.models.default_model`), or pass --model DIR|FILE.gguf"
            )
        return ModelSource("dir", path, path.name)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model directory (no config.json)")
        return ModelSource("dir", path.resolve(), path.resolve().name)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist")
        return ModelSource("gguf", path.resolve(), path.stem)
    if path.exists():
        raise ModelError(f"{path} is neither a model directory nor a .gguf file")
    if not _HUB_ID.match(spec):
        raise ModelError(f"model path {spec} does not exist")
    if not hub_allowed():
        raise ModelError(
            f"{spec!r} is not an existing directory or .gguf file, and hub ids are disabled "
            "(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set)"
        )
    return ModelSource("hub", Path(spec), spec)


def load_model(settings: Settings) -> LoadedModel:
    """Load the model named by ``settings`` onto its device, in eval mode with gradients off."""
    source = resolve_source(settings)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    weights_mode = resolve_weights(settings.weights, device, dtype, gguf_file=source.kind == "gguf")
    apply_threads(settings.threads)
    if device.type == "cpu" and dtype == torch.float16:
        log.warning("float16 on CPU is slow and less accurate than float32; consider --dtype float32")
    started = time.perf_counter()
    tokenizer_path = None
    # The weights' digest is read beside the load (hashlib lets go of the GIL while it hashes): a 4.7 GB file
    # takes seconds, which a start would otherwise wait for after the model is ready.
    with ThreadPoolExecutor(1, thread_name_prefix="weights-digest") as pool:
        digest = pool.submit(weights_sha256, source.path) if source.kind != "hub" else None
        if source.kind == "hub":
            source = ModelSource("dir", _download_snapshot(source.model_id), source.model_id)
            model, tokenizer = _load_hf(source, dtype, device)
        elif weights_mode == "gguf":
            with offline():
                model, tokenizer, tokenizer_path = load_gguf_blocks(source.path)
        else:
            with offline():
                model, tokenizer = _load_hf(source, dtype, device)
        load_s = time.perf_counter() - started

        started = time.perf_counter()
        weights = digest.result() if digest is not None else weights_sha256(source.path)
    # A GGUF keeps its tokenizer in metadata, so it is fingerprinted as loaded (see fingerprint.py).
    tok_digest = loaded_tokenizer_sha256(tokenizer) if source.kind == "gguf" else tokenizer_sha256(source.path)
    fingerprint_s = time.perf_counter() - started

    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=source.model_id,
        path=source.path,
        weights_sha256=weights,
        tokenizer_sha256=tok_digest,
        dtype=dtype,
        device=device,
        eos_token_ids=_eos_token_ids(model, tokenizer),
        pad_token_id=_first_id(tokenizer.pad_token_id, _gen(model, "pad_token_id")),
        bos_token_id=_first_id(tokenizer.bos_token_id, _gen(model, "bos_token_id")),
        context_length=_context_length(model.config),
        vocab_size=_vocab_size(model),
        special_token_ids=frozenset(int(i) for i in tokenizer.all_special_ids),
        weights=weights_mode,
        tokenizer_path=tokenizer_path,
    )
    log.info(
        "loaded model %s from %s (%s) on %s as %s (weights %s) in %.1f s (then %.1f s for the fingerprints): "
        "vocab %d, context %d, eos %s, weights sha256 %s, tokenizer sha256 %s",
        loaded.model_id,
        loaded.path,
        source.kind,
        device,
        str(dtype).removeprefix("torch."),
        weights_mode,
        load_s,
        fingerprint_s,
        loaded.vocab_size,
        loaded.context_length,
        list(loaded.eos_token_ids),
        weights[:12],
        tok_digest[:12],
    )
    return loaded


def _load_hf(source: ModelSource, dtype: torch.dtype, device: torch.device) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoTokenizer

    if source.kind == "gguf":
        location, extra = str(source.path.parent), {"gguf_file": source.path.name}
    else:
        location, extra = str(source.path), {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            location, clean_up_tokenization_spaces=False, local_files_only=True, **extra
        )
        model = _from_pretrained(location, dtype, extra)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"could not load {source.kind} model from {source.path}: {exc}") from exc
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def _download_snapshot(repo_id: str) -> Path:
    """Fetch a hub repo's config, tokenizer and safetensors weights into the hub cache; return the snapshot dir."""
    from huggingface_hub import snapshot_download

    log.info("downloading %s from the Hugging Face hub", repo_id)
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:  # the hub client raises many unrelated types
        raise ModelError(f"could not download {repo_id!r} from the Hugging Face hub: {exc}") from exc
    if not weight_files(path):
        raise ModelError(f"hub repo {repo_id!r} has no safetensors weights; download it and pass the directory")
    return path


def _gen(model: torch.nn.Module, name: str) -> Any:
    config = getattr(model, "generation_config", None)
    value = getattr(config, name, None) if config is not None else None
    return value if value is not None else getattr(model.config, name, None)


def _first_id(*candidates: Any) -> int | None:
    for value in candidates:
        if isinstance(value, int):
            return value
        if isinstance(value, (list, tuple)) and value:
            return int(value[0])
    return None


def _eos_token_ids(model: torch.nn.Module, tokenizer: Any) -> tuple[int, ...]:
    """Union of ``generation_config.eos_token_id`` (int or list) and the tokenizer's eos, in that order."""
    ids: list[int] = []
    configured = _gen(model, "eos_token_id")
    for value in [*(configured if isinstance(configured, (list, tuple)) else [configured]), tokenizer.eos_token_id]:
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    if not ids:
        raise ModelError("the model defines no end-of-sequence token (generation_config and tokenizer)")
    return tuple(ids)


def _context_length(config: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ModelError(f"cannot tell the context length of {type(config).__name__} (no max_position_embeddings)")


def _vocab_size(model: torch.nn.Module) -> int:
    """The width of the logits: the output embedding's rows (``config.vocab_size`` for sane models)."""
    configured = getattr(model.config, "vocab_size", None)
    head: Any = getattr(model, "get_output_embeddings", lambda: None)()
    rows = int(head.weight.shape[0]) if head is not None else None
    if rows is not None and configured is not None and rows != configured:
        log.warning("config.vocab_size=%s but the output layer has %s rows; using the latter", configured, rows)
    size = rows if rows is not None else configured
    if size is None:
        raise ModelError("cannot tell the vocabulary size (no config.vocab_size and no output embeddings)")
    return int(size)


def _from_pretrained(location: str, dtype: torch.dtype, extra: dict[str, str]) -> Any:
    """The model with SDPA attention, or eager where the architecture has no SDPA path (Gemma 2's soft-capping):
    the slot forward computes attention itself, so this only matters on transformers' own forward."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(location, dtype=dtype, attn_implementation="sdpa",
                                                    local_files_only=True, **extra)
    except ValueError as exc:
        if "scaled_dot_product_attention" not in str(exc):
            raise
        return AutoModelForCausalLM.from_pretrained(location, dtype=dtype, attn_implementation="eager",
                                                    local_files_only=True, **extra)
