"""The q4 weights mode on the real default model: its weights are exactly the GGUF's, and its outputs
stay close to the dense reference.

The default model ships as a Q4_1 GGUF (an 8-bit Q8_0 embedding table, tied to the LM head); setup
dequantizes it to fp32 (the dense reference). q4 quantizes those fp32 weights back with ggml's own
reference rounding, which must give back the file's blocks byte for byte: q4 then multiplies by the
very weights the file holds, and its only approximation is the per-block int8 rounding of
activations (as llama.cpp's own CPU kernels do).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from helpers.requirements import missing
from helpers.weight_quality import agreement, perplexity

from proctor.config import Settings, default_model_store
from proctor.executor.slot_weights import slot_weights
from proctor.executor.weights import BlockLinear, fbgemm_available
from proctor.models import load_model
from proctor.models.default_model import GGUF_NAME

pytestmark = [pytest.mark.real_model,
              pytest.mark.skipif(not fbgemm_available(), reason="the q4 kernel needs an x86 CPU with AVX2")]
HF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}


@pytest.fixture(scope="module")
def dense_loaded(model_dir: Any) -> Any:
    """A private copy of the model (the session server released its own dense weights)."""
    return load_model(Settings.load({"device": "cpu", "dtype": "float32", "weights": "dense", "warmup": False},
                                    environ={}))


def sorted_rows(blocks: np.ndarray) -> list[bytes]:
    """A matrix's block rows as a sorted list (the GGUF stores q and k rows permuted for its rotary layout)."""
    return sorted(bytes(row) for row in blocks)


def test_q4_blocks_are_the_gguf_files_blocks(dense_loaded: Any) -> None:
    path = default_model_store() / "gguf" / GGUF_NAME
    if not path.is_file():
        missing(f"the default model's GGUF ({path}); run `make setup`")
    model = dense_loaded.model
    with torch.inference_mode():
        # Each matrix on its own (the slot weights fuse q/k/v and gate/up; blocks run along the inputs,
        # so fusing stacks rows and changes no block).
        compared = 0
        for tensor in GGUFReader(path).tensors:
            name = tensor.name
            if name == "token_embd.weight":
                ours = BlockLinear(model.lm_head.weight, "q8_0").ggml_blocks().numpy()
            elif name.startswith("blk.") and name.split(".")[2] in HF_NAMES:
                index, kind = int(name.split(".")[1]), name.split(".")[2]
                module = model.model.layers[index].get_submodule(HF_NAMES[kind])
                ours = BlockLinear(module.weight, "q4_1").ggml_blocks().numpy()
            else:
                continue
            theirs = np.asarray(tensor.data).reshape(ours.shape)
            if name.split(".")[-2] in ("attn_q", "attn_k"):
                assert sorted_rows(ours) == sorted_rows(theirs), name
            else:
                assert np.array_equal(ours, theirs), name
            compared += 1
    assert compared == 1 + 7 * model.config.num_hidden_layers


def test_q4_stays_close_to_dense(dense_loaded: Any) -> None:
    model, tokenizer = dense_loaded.model, dense_loaded.tokenizer
    weights = slot_weights(model, "q4")
    assert weights.embed.numel() == 0  # tokens are looked up in the LM head's blocks: the same values
    dense, q4 = perplexity(model, tokenizer, "dense"), perplexity(model, tokenizer, "q4")
    assert abs(q4 - dense) / dense < 0.03, (dense, q4)
    result = agreement(model, tokenizer, "q4", tokens=32)
    assert result.mean_tokens_until_divergence >= 8, result
