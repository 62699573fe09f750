"""What a GGUF file says about its model that transformers' GGUF config reader drops, put back.

transformers maps only a few ``<arch>.*`` keys per architecture (transformers/integrations/ggml.py). A
model built from that alone is a different model: Qwen3's own head size, Gemma 2's soft-capping, Phi-3's
window and partial rotation, every rope scaling, and biases are lost. Read here from the file, as
llama.cpp reads them:

- ``attention.key_length`` → ``head_dim``; ``rope.dimension_count`` below it → ``partial_rotary_factor``;
- ``attention.sliding_window`` (Phi-3, Gemma); ``attn_logit_softcapping``/``final_logit_softcapping``;
- ``rope.scaling.type``/``factor``/``original_context_length`` (linear, yarn); Phi-3's
  ``rope_factors_long``/``rope_factors_short`` tensors (longrope); Llama 3's ``rope_freqs`` tensor
  (applied to the rotary tables by ``apply_rope_freqs``);
- q/k/v, output and MLP biases from the tensors present;
- Gemma's attention scale: llama.cpp's 1/√head_dim (``query_pre_attn_scalar`` is not stored).

What a GGUF cannot carry, neither llama.cpp nor this applies: Mistral's and Qwen2's sliding windows
under the ``llama``/``qwen2`` architectures, and dynamic (NTK) rope scaling.
"""

from __future__ import annotations

from typing import Any

from proctor.models.gguf_file import GgufFile


def complete_config(config: Any, file: GgufFile) -> None:
    """Set on ``config`` what the file's metadata and tensors say and transformers' reader left out."""
    arch = file.architecture

    def key(name: str) -> Any:
        return file.field(f"{arch}.{name}")

    head_dim = key("attention.key_length") or getattr(config, "head_dim", None) \
        or config.hidden_size // config.num_attention_heads
    config.head_dim = int(head_dim)
    rotated = key("rope.dimension_count")
    if rotated and int(rotated) < config.head_dim:
        config.partial_rotary_factor = int(rotated) / config.head_dim
    window = key("attention.sliding_window")
    if window and hasattr(config, "sliding_window"):
        config.sliding_window = int(window)
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if key(name) is not None:
            setattr(config, name, float(key(name)))
    if config.model_type in ("gemma2", "gemma3_text"):
        config.query_pre_attn_scalar = config.head_dim
    if file.has("blk.0.attn_q.bias") and hasattr(config, "attention_bias"):
        config.attention_bias = True
    if file.has("blk.0.ffn_down.bias") and hasattr(config, "mlp_bias"):
        config.mlp_bias = True
    _rope(config, file, key)


def _rope(config: Any, file: GgufFile, key: Any) -> None:
    parameters = dict(getattr(config, "rope_parameters", None) or {})
    if "full_attention" in parameters:  # Gemma 3: the global layers' set is the one the file's keys describe
        _rope_per_layer_type(config, key)
        return
    parameters.setdefault("rope_theta", float(key("rope.freq_base") or 10000.0))
    scaling, factor = key("rope.scaling.type"), key("rope.scaling.factor")
    original = key("rope.scaling.original_context_length")
    if file.has("rope_factors_long.weight"):  # Phi-3's su/longrope
        parameters.update(rope_type="longrope", long_factor=file.vector("rope_factors_long.weight").tolist(),
                          short_factor=file.vector("rope_factors_short.weight").tolist())
        if original:
            parameters["original_max_position_embeddings"] = int(original)
            config.original_max_position_embeddings = int(original)
    elif scaling in ("linear", "yarn") and factor:
        parameters.update(rope_type=scaling, factor=float(factor))
        if original:
            parameters["original_max_position_embeddings"] = int(original)
    if getattr(config, "partial_rotary_factor", None):
        parameters["partial_rotary_factor"] = config.partial_rotary_factor
    config.rope_parameters = parameters


def _rope_per_layer_type(config: Any, key: Any) -> None:
    scaling, factor = key("rope.scaling.type"), key("rope.scaling.factor")
    if scaling == "linear" and factor:
        config.rope_parameters["full_attention"].update(rope_type="linear", factor=float(factor))


def apply_rope_freqs(rotary: Any, file: GgufFile) -> None:
    """Llama 3's rope: convert_hf_to_gguf stores its frequency divisors as ``rope_freqs``; each rotary
    frequency is the default one divided by its factor (llama.cpp's ``freq_factors``)."""
    if not file.has("rope_freqs.weight") or not hasattr(rotary, "inv_freq"):
        return
    factors = file.vector("rope_freqs.weight")
    divided = rotary.inv_freq / factors.to(rotary.inv_freq.dtype)
    rotary.inv_freq = divided
    rotary.original_inv_freq = divided.clone()

