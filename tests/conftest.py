"""Shared fixtures: the real default model's tokenizer and a tiny random-weight model built around it.

The tiny model (2 layers, hidden 64) has the real tokenizer's vocabulary, so engine tests run the
real tokenization, detokenization and chat template in milliseconds per step. Its weights are
initialised with a larger spread than usual (``initializer_range=0.2``) so that greedy outputs are
varied and the top-2 logit margin is far above float noise (near-ties would make comparisons
between code paths flaky).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.engine import TINY_CONTEXT, tiny_settings
from helpers.requirements import missing

from proctor.config import default_model_store


@pytest.fixture(scope="session", autouse=True)
def audit_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Servers started by tests (in-process or as subprocesses) audit into a temporary database."""
    path = tmp_path_factory.mktemp("audit") / "audit.db"
    previous = os.environ.get("PROCTOR_AUDIT_DB")
    os.environ["PROCTOR_AUDIT_DB"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("PROCTOR_AUDIT_DB", None)
    else:
        os.environ["PROCTOR_AUDIT_DB"] = previous


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The installed default model, as the server itself judges an install complete (``is_installed``)."""
    from proctor.models.default_model import default_model_path, is_installed

    store = default_model_store()
    if not is_installed(store):
        missing(f"the default model is not installed at {default_model_path(store)}; run `make setup`")
    return default_model_path(store)


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The default model's GGUF as the setup extracted it (its tokenizer metadata serves the tiny GGUFs)."""
    from proctor.models.default_model import GGUF_NAME

    path = default_model_store() / "gguf" / GGUF_NAME
    if not path.is_file():
        missing(f"the default model's GGUF is not at {path}; run `make setup`")
    return path


@pytest.fixture(scope="session")
def tokenizer(default_model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir), clean_up_tokenization_spaces=False,
                                         local_files_only=True)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=TINY_CONTEXT,
        tie_word_embeddings=True, initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()
    model.requires_grad_(False)
    return model


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model, tokenizer, default_model_dir: Path):  # type: ignore[no-untyped-def]
    import torch

    from proctor.models import LoadedModel

    return LoadedModel(
        model=tiny_model, tokenizer=tokenizer, model_id="tiny", path=default_model_dir,
        weights_sha256="tiny", tokenizer_sha256="tiny", dtype=torch.float32, device=torch.device("cpu"),
        eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, context_length=TINY_CONTEXT, vocab_size=len(tokenizer),
        special_token_ids=frozenset(int(i) for i in tokenizer.all_special_ids),
    )


@pytest.fixture
def tiny_engine(tiny_loaded):  # type: ignore[no-untyped-def]
    from proctor.engine.engine import Engine

    engine = Engine(tiny_loaded, tiny_settings())
    engine.start()
    yield engine
    engine.shutdown(grace_s=1.0)


@pytest.fixture
def make_engine(tiny_loaded):  # type: ignore[no-untyped-def]
    """``make_engine(start=True, loaded=None, plan=None, **settings)`` (``plan``: an executor plan other than the
    settings'); every engine is shut down at teardown."""
    from proctor.engine.engine import Engine

    engines: list[Engine] = []

    def _make(start: bool = True, loaded=None, plan=None, **settings: object) -> Engine:  # type: ignore[no-untyped-def]
        engine = Engine(loaded or tiny_loaded, tiny_settings(**settings), plan=plan)
        engines.append(engine)
        if start:
            engine.start()
        return engine

    yield _make
    for engine in engines:
        if engine._thread.is_alive():  # an engine that was never started has nothing to stop
            engine.shutdown(grace_s=0.5)
