"""The slot forward's weights from a GGUF file's own blocks (``--weights gguf``), by llama.cpp's tensor names.

convert_hf_to_gguf writes transformers' weights under names of its own, and changes two things that are
undone here as transformers' GGUF loader undoes them: Llama's q/k rows are permuted so rotary pairs are
adjacent (undone on whole block rows: models/gguf_file.unpermute_rows), and Gemma's norm weights are
stored as ``1 + w`` (kept here as ``w``; the family's norm adds the 1, as for a transformers model).
The matrices stay in the file's memory map, except Q4_K ones, repacked eight rows to a group for the few-row
loop (kernels/ggml_r8.h: the same bits), whose file pages are then let go; the norms and biases are copied out.
"""

from __future__ import annotations

from typing import Any

import torch

from proctor.executor.families import Family, describe
from proctor.executor.gguf_linear import GgufLinear, GgufStack
from proctor.executor.slot_weights import LayerWeights, SlotWeights, built_from
from proctor.models.gguf_file import GgufFile

# The GGUF architectures whose q/k rows convert_hf_to_gguf permutes (its LlamaModel: Llama and Mistral).
PERMUTED_ARCHITECTURES = ("llama",)

def attach(model: Any, file: GgufFile) -> None:
    """Serve ``model`` (a skeleton without matrices) from ``file``'s blocks under ``--weights gguf``."""
    built_from(model, lambda skeleton: gguf_slot_weights(skeleton, file))


def gguf_slot_weights(model: Any, file: GgufFile) -> SlotWeights:
    family = describe(model.config)
    permuted = file.architecture in PERMUTED_ARCHITECTURES
    layers = [_layer(file, f"blk.{index}.", family, permuted) for index in range(model.config.num_hidden_layers)]
    embed = file.matrix("token_embd.weight")
    lm_head = _grouped(file, file.matrix("output.weight")) if file.has("output.weight") else embed
    return SlotWeights(mode="gguf", embed=torch.empty(0), final_norm=_norm(file, "output_norm.weight", family),
                       lm_head=lm_head, layers=layers, embed_blocks=embed)


def _grouped(file: GgufFile, matrix: GgufLinear) -> GgufLinear:
    """A layer's Q4_K matrix repacked eight rows to a group (GgufLinear.grouped: the same bits, a faster loop at one
    to four rows), its file pages let go; any other matrix as it is."""
    grouped = matrix.grouped()
    if grouped is not matrix:
        file.release(matrix.blocks)
    return grouped


def _layer(file: GgufFile, prefix: str, family: Family, permuted: bool) -> LayerWeights:
    def optional(name: str, heads: int | None = None) -> torch.Tensor | None:
        return file.vector(prefix + name, heads) if file.has(prefix + name) else None

    def norm(name: str) -> torch.Tensor | None:
        return _norm(file, prefix + name, family) if file.has(prefix + name) else None

    def matrix(name: str, heads: int | None = None) -> GgufLinear:
        return _grouped(file, file.matrix(name, heads))

    q_heads, k_heads = (family.heads, family.kv_heads) if permuted else (None, None)
    if file.has(prefix + "attn_qkv.weight"):  # Phi-3: one fused matrix
        qkv = GgufStack([matrix(prefix + "attn_qkv.weight")])
        qkv_bias = optional("attn_qkv.bias")
    else:
        qkv = GgufStack([matrix(prefix + "attn_q.weight", q_heads), matrix(prefix + "attn_k.weight", k_heads),
                         matrix(prefix + "attn_v.weight")])
        biases = [optional("attn_q.bias", q_heads), optional("attn_k.bias", k_heads), optional("attn_v.bias")]
        present = [b for b in biases if b is not None]
        qkv_bias = torch.cat(present) if len(present) == len(biases) else None
    if file.has(prefix + "ffn_gate.weight"):
        gate_up = GgufStack([matrix(prefix + "ffn_gate.weight"), matrix(prefix + "ffn_up.weight")])
        gate_up_bias = (torch.cat([file.vector(prefix + "ffn_gate.bias"), file.vector(prefix + "ffn_up.bias")])
                        if file.has(prefix + "ffn_gate.bias") else None)
    else:  # Phi-3: ffn_up holds gate and up, fused
        gate_up = GgufStack([matrix(prefix + "ffn_up.weight")])
        gate_up_bias = optional("ffn_up.bias")
    return LayerWeights(  # a missing required tensor is a ModelError naming it (GgufFile)
        in_norm=_norm(file, prefix + "attn_norm.weight", family), qkv=qkv, qkv_bias=qkv_bias,
        o=matrix(prefix + "attn_output.weight"), o_bias=optional("attn_output.bias"),
        post_norm=_norm(file, prefix + "ffn_norm.weight", family), gate_up=gate_up, gate_up_bias=gate_up_bias,
        down=matrix(prefix + "ffn_down.weight"), down_bias=optional("ffn_down.bias"),
        q_norm=norm("attn_q_norm.weight") if family.qk_norm else None,
        k_norm=norm("attn_k_norm.weight") if family.qk_norm else None,
        attn_out_norm=norm("post_attention_norm.weight") if family.sandwich else None,
        mlp_out_norm=norm("post_ffw_norm.weight") if family.sandwich else None,
    )


def _norm(file: GgufFile, name: str, family: Family) -> torch.Tensor:
    """A norm weight as transformers holds it: Gemma's file stores ``1 + w``."""
    weight = file.vector(name)
    return weight - family.norm_offset if family.norm_offset else weight

