"""The Llama weights as the slot forward uses them (fused, packed or quantized), built once per model and mode.

Why a cache on the model: packing or quantizing takes seconds and a second copy of the weights, and
several runners may be built on one loaded model (tests; a rebuilt engine). Why ``release_dense``:
once the slot forward has its own copy, the model's projection weights are dead memory (0.4 GB of
fp32 for the default model); the server drops them after warm-up. The embedding table stays: token
lookup reads it (and with tied embeddings it is also the dense LM head).
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from proctor.executor.families import describe
from proctor.executor.resident import page_out, paged_out_after_forward, returning_freed_memory
from proctor.executor.smoothing import expand_to_heads, input_peaks, shared_by_kv_head, smoothing_scales
from proctor.executor.weights import BlockLinear, Linear, make_linear


@dataclass(frozen=True)
class LayerWeights:
    in_norm: torch.Tensor
    qkv: Linear  # [(H + 2·KVH)·D, hidden]
    o: Linear
    post_norm: torch.Tensor  # the norm before the MLP (Gemma's pre_feedforward_layernorm)
    gate_up: Linear  # [2·I, hidden]
    down: Linear
    # What other families add (executor/families.py); None where the family has none.
    qkv_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # over each head (head_dim)
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # Gemma's post_attention_layernorm, on the attention's output
    mlp_out_norm: torch.Tensor | None = None  # Gemma's post_feedforward_layernorm


@dataclass(frozen=True)
class SlotWeights:
    mode: str
    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: Linear
    layers: list[LayerWeights]
    embed_blocks: Any = None  # gguf: the file's token_embd blocks (executor/gguf_linear.GgufLinear)

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of tokens ``ids`` ([N] → [N, hidden]); from the file's blocks (gguf), or the LM
        head's when the table is not kept (q4 with tied embeddings)."""
        if self.embed_blocks is not None:
            return cast(torch.Tensor, self.embed_blocks.rows(ids))
        if self.embed.numel():
            return torch.nn.functional.embedding(ids, self.embed)
        head = self.lm_head
        assert isinstance(head, BlockLinear)  # no table kept: the tied head is a block matrix (q4)
        return head.rows(ids)

    @property
    def thread_invariant(self) -> bool:
        """Every product gives a row the same bits at any thread count and batch (see weights.py)."""
        return bool(getattr(self.lm_head, "thread_invariant", False)) and all(
            getattr(layer.qkv, "thread_invariant", False) for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes of matrix weights streamed per decode step (the LM head included)."""
        linears = [self.lm_head] + [f for layer in self.layers for f in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return sum(int(getattr(f, "nbytes", 0)) for f in linears)


@dataclass
class _Built:
    """What was built for one model (kept beside it, not on it: a deep copy must not copy packed tensors)."""

    modes: dict[str, SlotWeights] = field(default_factory=dict)
    dense_released: bool = False
    gguf: Callable[[Any], SlotWeights] | None = None  # builds mode gguf from the file the model was loaded from


_BUILT: weakref.WeakKeyDictionary[Any, _Built] = weakref.WeakKeyDictionary()


def built_from(model: Any, build: Callable[[Any], SlotWeights]) -> None:
    """Serve ``model``'s mode ``gguf`` with ``build(model)`` (models/gguf_layers.py: a GGUF file's own blocks)."""
    _BUILT.setdefault(model, _Built()).gguf = build


def slot_weights(model: Any, mode: str, calibration_ids: list[int] | None = None) -> SlotWeights:
    """The model's weights for the slot forward in ``mode`` (built on first use, then cached).

    ``q8`` needs ``calibration_ids`` (the calibration text in the model's tokens, smoothing.py) the
    first time it is built."""
    built = _BUILT.setdefault(model, _Built())
    if mode not in built.modes:
        if built.dense_released:
            raise RuntimeError(f"the model's dense weights were released; weights mode {mode!r} cannot be built "
                               f"(built: {', '.join(built.modes)})")
        if mode == "q8" and not calibration_ids:
            raise ValueError("weights mode q8 needs calibration token ids (smoothing.CALIBRATION_TEXT)")
        with returning_freed_memory():  # resident.py: the build's peak memory
            if mode == "gguf":
                if built.gguf is None:
                    raise ValueError("--weights gguf serves a .gguf file's own blocks; this model was not loaded "
                                     "from one (pass --model FILE.gguf, or another --weights mode)")
                built.modes[mode] = built.gguf(model)
            elif mode == "q8":
                with paged_out_after_forward(model.model.layers):
                    assert calibration_ids  # checked above
                    peaks = input_peaks(model, calibration_ids)
                built.modes[mode] = _build_smoothed(model, mode, peaks)
            else:
                built.modes[mode] = _build(model, mode)
    return built.modes[mode]


def release_dense(model: Any) -> int:
    """Drop the model's own projection weights (the slot forward holds its copies); returns bytes freed.

    Only once some slot weights are built; the model cannot run its own forward afterwards."""
    built = _BUILT.get(model)
    if built is None or not built.modes or built.dense_released:
        return 0
    if "gguf" in built.modes:  # the model never held dense matrices (a skeleton beside the file's blocks)
        built.dense_released = True
        return 0
    freed = 0
    embed = model.model.embed_tokens.weight
    attention_names, mlp_names = describe(model.config).fused_names
    for layer in model.model.layers:
        for linear in (*(getattr(layer.self_attn, name) for name in (*attention_names, "o_proj")),
                       *(getattr(layer.mlp, name) for name in (*mlp_names, "down_proj"))):
            freed += linear.weight.numel() * linear.weight.element_size()
            linear.weight = torch.nn.Parameter(linear.weight.new_empty(0), requires_grad=False)
    if model.lm_head.weight.data_ptr() != embed.data_ptr():
        freed += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.new_empty(0), requires_grad=False)
    # The embedding (and a tied LM head) now points at the slot weights' own copy of it.
    own = torch.nn.Parameter(next(iter(built.modes.values())).embed, requires_grad=False)
    tied = model.lm_head.weight.data_ptr() == embed.data_ptr()
    model.model.embed_tokens.weight = own
    if tied:
        model.lm_head.weight = own
    for parameter in model.parameters():  # the norms: small, but each would keep the whole map alive
        if parameter is not own and parameter.numel():
            parameter.data = parameter.data.clone()
    built.dense_released = True
    _return_free_memory()
    return freed


def _return_free_memory() -> None:
    """Hand freed heap pages back to the system (glibc keeps them otherwise: the released weights were
    freed in pieces of a few MB, below the allocator's adaptive mmap threshold by then)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _own_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in memory of our own: the loaded tensor may live in the model file's memory map, which
    stays mapped (and resident) while any tensor from it does — so the release can unmap it."""
    return tensor.detach().clone()


def _build_smoothed(model: Any, mode: str, peaks: dict[str, torch.Tensor]) -> SlotWeights:
    """Like ``_build``, with each linear layer's input smoothed into its weight (smoothing.py)."""
    cfg, inner = model.config, model.model
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    layers = []
    for index, layer in enumerate(inner.layers):
        prefix = f"model.layers.{index}."
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).float()
        s_qkv = smoothing_scales(peaks[prefix + "self_attn.q_proj"], qkv)
        s_v = shared_by_kv_head(smoothing_scales(peaks[prefix + "self_attn.o_proj"], attn.o_proj.weight),
                                heads, kv_heads, head_dim)
        qkv = qkv * s_qkv[None, :]
        qkv[-kv_heads * head_dim:] /= s_v[:, None]
        o = attn.o_proj.weight.float() * expand_to_heads(s_v, heads, kv_heads, head_dim)[None, :]
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).float()
        s_gate_up = smoothing_scales(peaks[prefix + "mlp.gate_proj"], gate_up)
        s_down = smoothing_scales(peaks[prefix + "mlp.down_proj"], mlp.down_proj.weight)
        gate_up = gate_up * s_gate_up[None, :]
        gate_up[mlp.gate_proj.weight.shape[0]:] /= s_down[:, None]
        layers.append(LayerWeights(
            in_norm=layer.input_layernorm.weight / s_qkv, qkv=make_linear(qkv, mode),
            o=make_linear(o, mode), post_norm=layer.post_attention_layernorm.weight / s_gate_up,
            gate_up=make_linear(gate_up, mode),
            down=make_linear(mlp.down_proj.weight, mode, column_scale=s_down)))
        del qkv, o, gate_up
        page_out(layer.parameters())  # this layer's file-mapped fp32 weights are no longer needed resident
    s_head = smoothing_scales(peaks["lm_head"], model.lm_head.weight)
    # The embedding table in fp16 (57 MB instead of 113 for the default model): q8 is approximate anyway,
    # and a token's row is only read, once per step.
    embed = inner.embed_tokens.weight.detach().to(torch.float16)
    return SlotWeights(mode=mode, embed=embed, final_norm=inner.norm.weight / s_head,
                       lm_head=make_linear(model.lm_head.weight, mode, column_scale=s_head), layers=layers)


def _build(model: Any, mode: str) -> SlotWeights:
    family = describe(model.config)
    inner = model.model
    # q4 keeps the LM head in 8-bit blocks and, with tied embeddings, looks tokens up in those blocks
    # (BlockLinear.dequantized_rows: the same values) instead of holding a second table.
    lm_head = make_linear(model.lm_head.weight, mode, head=True)
    tied = model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
    embed = (torch.empty(0) if mode == "q4" and tied and _exact_rows(lm_head, inner.embed_tokens.weight)
             else _own_copy(inner.embed_tokens.weight))

    attention_names, mlp_names = family.fused_names

    def fused(module: Any, names: tuple[str, ...]) -> tuple[Linear, torch.Tensor | None]:
        linears = [getattr(module, name) for name in names]
        biases = [linear.bias for linear in linears if linear.bias is not None]
        return (make_linear(torch.cat([linear.weight for linear in linears]), mode),
                _own_copy(torch.cat(biases)) if biases else None)

    def bias(linear: Any) -> torch.Tensor | None:
        return None if linear.bias is None else _own_copy(linear.bias)

    def built(layer: Any) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        (qkv, qkv_bias), (gate_up, gate_up_bias) = fused(attn, attention_names), fused(mlp, mlp_names)
        sandwich = family.sandwich
        weights = LayerWeights(
            in_norm=layer.input_layernorm.weight, qkv=qkv, qkv_bias=qkv_bias,
            o=make_linear(attn.o_proj.weight, mode), o_bias=bias(attn.o_proj),
            post_norm=(layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm).weight,
            gate_up=gate_up, gate_up_bias=gate_up_bias,
            down=make_linear(mlp.down_proj.weight, mode), down_bias=bias(mlp.down_proj),
            q_norm=attn.q_norm.weight if family.qk_norm else None,
            k_norm=attn.k_norm.weight if family.qk_norm else None,
            attn_out_norm=layer.post_attention_layernorm.weight if sandwich else None,
            mlp_out_norm=layer.post_feedforward_layernorm.weight if sandwich else None,
        )
        page_out(layer.parameters())  # resident.py: faulted back in from the file if read again
        return weights

    return SlotWeights(mode=mode, embed=embed, final_norm=inner.norm.weight, lm_head=lm_head,
                       layers=[built(layer) for layer in inner.layers])


def _exact_rows(head: Any, embedding: torch.Tensor) -> bool:
    """Whether the head's blocks hold the embedding table exactly (a GGUF's Q8_0 table does; a model
    with weights of its own does not, and then keeps its table)."""
    every = torch.arange(embedding.shape[0])
    return all(torch.equal(head.rows(ids), embedding[ids].float()) for ids in every.split(4096))  # type: ignore[no-untyped-call]  # third-party typing
