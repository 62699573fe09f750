"""A transformers model written as a GGUF file the way llama.cpp's convert_hf_to_gguf writes it, for tests.

The conventions a reader must undo are the converter's: tensor names from gguf's own TensorNameMap,
Llama's q/k rows permuted so rotary pairs are adjacent, Gemma's norm weights stored as ``1 + w``, and
the config under ``<arch>.*`` keys. The tokenizer's metadata is copied from the default model's GGUF
(the tiny models share its vocabulary). Matrices are written as ``matrix_type`` (gguf's own quantizer:
F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1); norms and biases as F32, as the converter does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from helpers.ggml_blocks import random_blocks

ARCHITECTURES = {"llama": "LLAMA", "mistral": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "gemma2": "GEMMA2",
                 "gemma3_text": "GEMMA3", "phi3": "PHI3"}
PERMUTED = ("llama", "mistral")
GEMMA = ("gemma2", "gemma3_text")


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(model: Any, tokenizer_gguf: Path, out: Path, matrix_type: str = "F32") -> Path:
    """``model`` as a GGUF with its matrices of ``matrix_type`` (the K types as random blocks: gguf-py has no
    quantizer for them, and the tests that use them check bits, not values)."""
    import gguf

    config = model.config
    kind = config.model_type
    arch = getattr(gguf.MODEL_ARCH, ARCHITECTURES[kind])
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    writer = gguf.GGUFWriter(str(out), arch_name)
    writer.add_name(f"tiny-{kind}")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = getattr(config, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    fraction = float(rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", 1.0) or 1.0)
    writer.add_rope_dimension_count(int(head_dim * fraction))
    if getattr(config, "sliding_window", None):
        writer.add_sliding_window(int(config.sliding_window))
    _write_rope(writer, model, rope, head_dim)
    if kind == "gemma2":
        writer.add_attn_logit_softcapping(float(config.attn_logit_softcapping))
        writer.add_final_logit_softcapping(float(config.final_logit_softcapping))
    _copy_tokenizer(writer, tokenizer_gguf)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    quant = getattr(gguf.GGMLQuantizationType, matrix_type)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"no GGUF name for {hf_name}"
        values = tensor.detach().float().numpy()
        if kind in PERMUTED and (".attn_q." in name or ".attn_k." in name):
            values = permute(values, heads if ".attn_q." in name else kv_heads)
        if kind in GEMMA and name.endswith("norm.weight"):
            values = values + 1.0
        if values.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
            try:
                blocks = gguf.quants.quantize(values, quant)
            except NotImplementedError:  # gguf-py cannot quantize the K types: random blocks of the type
                blocks = random_blocks(int(quant), *values.shape, seed=len(name))
            writer.add_tensor(name, blocks, raw_dtype=quant)
        else:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out



def _write_rope(writer: Any, model: Any, rope: dict[str, Any], head_dim: int) -> None:
    """Rope scaling as convert_hf_to_gguf writes it: keys for linear and yarn, Llama 3's frequency
    divisors as the ``rope_freqs`` tensor, Phi-3's longrope factors as tensors."""
    import gguf

    kind = rope.get("rope_type", "default")
    if kind in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR if kind == "linear" else gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        if rope.get("original_max_position_embeddings"):
            writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    elif kind == "llama3":
        base, factor = float(rope["rope_theta"]), float(rope["factor"])
        low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old = float(rope["original_max_position_embeddings"])
        freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        factors = []
        for freq in freqs.tolist():
            wavelen = 2 * math.pi / freq
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        writer.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    elif kind == "longrope":
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))


def write_raw_tensor_gguf(tokenizer_gguf: Path, out: Path, ggml_type: int, shape: tuple[int, int]) -> Path:
    """A Llama GGUF with one matrix of block type ``ggml_type`` (random bytes): the refusal tests."""
    import gguf

    writer = gguf.GGUFWriter(str(out), "llama")
    _copy_tokenizer(writer, tokenizer_gguf)
    kind = gguf.GGMLQuantizationType(ggml_type)
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    raw = np.random.default_rng(0).integers(0, 256, (shape[0], shape[1] // per_block * block_bytes), dtype=np.uint8)
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _copy_tokenizer(writer: Any, source: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(source)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            item = field.types[-1]
            values = [field.parts[i] for i in field.data]
            if item == gguf.GGUFValueType.STRING:
                writer.add_array(key, [bytes(v).decode("utf-8", errors="surrogateescape") for v in values])
            else:
                writer.add_array(key, [v.tolist()[0] for v in values])
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, bytes(field.parts[field.data[0]]).decode())
        else:
            writer.add_key_value(key, field.parts[field.data[0]].tolist()[0], kind)


def tiny_loaded_from_gguf(path: Path) -> Any:
    """The skeleton model served from ``path``'s blocks (models/gguf_model.py)."""
    from proctor.models.gguf_model import load_gguf_blocks

    model, _, _ = load_gguf_blocks(path)
    return model

