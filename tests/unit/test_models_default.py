"""The installed default model: loads, has the expected special tokens and template, matches its GGUF source."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from helpers.requirements import missing

from proctor.config import Settings, default_model_store
from proctor.models import LoadedModel, install_default_model, load_model
from proctor.models.default_model import GGUF_NAME, GGUF_SHA256, MARKER_NAME, default_model_path, is_installed

pytestmark = pytest.mark.real_model

STORE = default_model_store()
HEX64 = re.compile(r"^[0-9a-f]{64}$")

if not is_installed(STORE):
    missing(f"default model not installed at {default_model_path(STORE)}; run `make setup`")


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(Settings(model_store=STORE, device="cpu", dtype="auto"))


def test_loads_ready_for_inference(loaded: LoadedModel) -> None:
    assert loaded.model_id == "SmolLM2-135M-Instruct"
    assert loaded.path == default_model_path(STORE)
    assert loaded.device == torch.device("cpu")
    assert loaded.dtype == torch.float32
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert next(loaded.model.parameters()).dtype == torch.float32


def test_special_tokens_and_sizes(loaded: LoadedModel) -> None:
    assert 2 in loaded.eos_token_ids
    assert loaded.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert loaded.bos_token_id == 1
    assert loaded.pad_token_id == 2
    assert {0, 1, 2} <= loaded.special_token_ids
    assert loaded.vocab_size == 49152 == len(loaded.tokenizer)
    assert loaded.context_length == 8192
    assert loaded.tokenizer.clean_up_tokenization_spaces is False


def test_chat_template(loaded: LoadedModel) -> None:
    tok = loaded.tokenizer
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_fingerprints_match_the_install_record(loaded: LoadedModel) -> None:
    assert HEX64.match(loaded.weights_sha256)
    assert HEX64.match(loaded.tokenizer_sha256)
    marker = json.loads((loaded.path / MARKER_NAME).read_text())
    assert marker["source"]["gguf_sha256"] == GGUF_SHA256
    assert loaded.weights_sha256 == marker["weights_sha256"]
    assert loaded.tokenizer_sha256 == marker["tokenizer_sha256"]


def test_install_is_idempotent_and_fast() -> None:
    started = time.perf_counter()
    assert install_default_model(STORE) == default_model_path(STORE)
    assert time.perf_counter() - started < 1.0


def test_logits_equal_the_gguf_model(loaded: LoadedModel) -> None:
    gguf: Path = STORE / "gguf" / GGUF_NAME
    if not gguf.is_file():
        missing(f"{gguf} is missing (only the converted model is installed)")
    # transformers' own read of the file (dequantized), not the gguf mode's blocks
    reference = load_model(Settings(model=str(gguf), device="cpu", dtype="float32", weights="dense"))
    assert reference.weights_sha256 == GGUF_SHA256
    prompt = "<|im_start|>user\nName a primary colour.<|im_end|>\n<|im_start|>assistant\n"
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
    assert torch.equal(ids, reference.tokenizer(prompt, return_tensors="pt").input_ids)
    with torch.inference_mode():
        actual = loaded.model(ids).logits
        expected = reference.model(ids).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4)
