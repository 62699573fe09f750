"""What sets one model family's forward apart from Llama's, as data read from the transformers config.

One slot forward (``slot_forward.py``) reads a ``Family``; no module is written per model. The fields
are the differences among the families served on the batched path:

- Llama 1/2/3 (every ``rope_scaling`` transformers' rotary module implements; untied heads), Mistral
  (a sliding window on every layer), Qwen2/2.5 (q/k/v biases; sliding layers when configured),
  Qwen3 (RMSNorm on each query and key head; its own ``head_dim``), Phi-3 (fused qkv and gate_up
  projections, su/longrope, a partial rotary factor, a sliding window);
- Gemma 2 and Gemma 3 text: ``(1 + w)`` RMSNorm computed in float32, GeGLU (tanh), norms before and
  after attention and the MLP ("sandwich"), embeddings scaled by √hidden, ``query_pre_attn_scalar``,
  attention and final-logit soft-capping, sliding and global layers alternating, and (Gemma 3) q/k
  norms and a rotary table per layer type (its local base).

``describe`` refuses what the forward would compute differently (another activation, a window kind it
does not know), naming it: such a model runs on transformers' own forward, row by row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# model_type -> (module names of q, k, v or the fused qkv; of gate, up or the fused gate_up)
ATTENTION_NAMES = {"phi3": ("qkv_proj",)}
MLP_NAMES = {"phi3": ("gate_up_proj",)}
SERVED = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
GEMMA = ("gemma2", "gemma3_text")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
# Rotary tables that depend on how long the sequence is: computed per position regime (slot_ops.RotaryTables).
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
# Weights modes whose C++ decode kernel computes every family described here (the q8 one: Llama's only).
EVERY_FAMILY_KERNELS = ("q4", "gguf")


class Unsupported(ValueError):
    """The slot forward does not compute this model's forward; the message says what differs."""


@dataclass(frozen=True)
class Family:
    name: str  # the config's model_type
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    activation: str  # "silu" | "gelu_tanh" (the MLP's gate)
    norm_offset: float  # 0: Llama's RMSNorm (w · x̂); 1: Gemma's ((1 + w) · x̂, in float32)
    attn_scale: float  # multiplies q·k (head_dim^-0.5, or query_pre_attn_scalar^-0.5)
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # RMSNorm over each query and key head before the rotation (Qwen3, Gemma 3)
    sandwich: bool  # norms on the attention and MLP outputs too (Gemma)
    embed_scale: float | None  # embeddings multiplied by this (Gemma: √hidden)
    attn_softcap: float | None
    final_softcap: float | None
    windows: tuple[int | None, ...]  # per layer: its sliding window in tokens (a key at distance ≥ w is unseen)
    rope_keys: tuple[str | None, ...]  # per layer: which rotary table (Gemma 3: per layer type)
    rope_type: str  # transformers' rope type ("default", "llama3", "linear", "dynamic", "yarn", "longrope", …)
    rope_original_length: int  # where a length-dependent rope changes regime
    rotary_fraction: float  # of each head's dims that rotate (Phi's partial_rotary_factor)
    fused_names: tuple[tuple[str, ...], tuple[str, ...]]  # module names (see ATTENTION_NAMES, MLP_NAMES)

    @property
    def scale_override(self) -> float | None:
        """The attention scale where it is not head_dim^-0.5 (None: the default, left to SDPA and the kernel,
        so Llama's bits stay those of the default)."""
        return None if self.attn_scale == self.head_dim ** -0.5 else self.attn_scale

    @property
    def plain(self) -> bool:
        """Llama's arithmetic exactly: what q8's smoothing (the norm folded into the next product) assumes."""
        return (self.activation == "silu" and not (self.norm_offset or self.sandwich or self.qkv_bias
                or self.o_bias or self.mlp_bias or self.qk_norm) and self.rotary_fraction == 1.0
                and self.attn_softcap is None and self.final_softcap is None
                and len(set(self.rope_keys)) == 1 and self.embed_scale is None
                and not any(self.windows) and self.scale_override is None
                and self.fused_names == (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")))


def describe(config: Any) -> Family:
    """The family of a transformers config; ``Unsupported`` naming what the slot forward would miss."""
    kind = getattr(config, "model_type", "?")
    if kind not in SERVED:
        raise Unsupported(f"architecture {kind!r} is not one of {', '.join(SERVED)}")
    act_name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    activation = ACTIVATIONS.get(str(act_name))
    if activation is None:
        raise Unsupported(f"activation {act_name!r}")
    if getattr(config, "pretraining_tp", 1) != 1:
        raise Unsupported("pretraining_tp > 1")
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = config.num_hidden_layers
    gemma = kind in GEMMA
    rope = _rope_parameters(config)
    return Family(
        name=kind, heads=heads, kv_heads=kv_heads, head_dim=head_dim, eps=float(config.rms_norm_eps),
        activation=activation, norm_offset=1.0 if gemma else 0.0,
        attn_scale=float(config.query_pre_attn_scalar) ** -0.5 if gemma else head_dim ** -0.5,
        qkv_bias=kind == "qwen2" or bool(getattr(config, "attention_bias", False)),
        o_bias=kind != "qwen2" and bool(getattr(config, "attention_bias", False)),
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        qk_norm=kind in ("qwen3", "gemma3_text"), sandwich=gemma,
        embed_scale=float(config.hidden_size) ** 0.5 if gemma else None,
        attn_softcap=getattr(config, "attn_logit_softcapping", None) if gemma else None,
        final_softcap=getattr(config, "final_logit_softcapping", None) if gemma else None,
        windows=_windows(config, kind, layers),
        rope_keys=tuple(config.layer_types) if kind == "gemma3_text" else (None,) * layers,
        rope_type=str(rope.get("rope_type") or rope.get("type") or "default"),
        rope_original_length=int(rope.get("original_max_position_embeddings")
                                 or getattr(config, "original_max_position_embeddings", 0)
                                 or config.max_position_embeddings),
        rotary_fraction=float(rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", 1.0)
                              or 1.0),
        fused_names=(ATTENTION_NAMES.get(kind, ("q_proj", "k_proj", "v_proj")),
                     MLP_NAMES.get(kind, ("gate_proj", "up_proj"))))


def _rope_parameters(config: Any) -> dict[str, Any]:
    """The rope settings of the (global) layers, in transformers 5's ``rope_parameters`` or the older form."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if "full_attention" in parameters:  # Gemma 3: one set per layer type
        parameters = parameters["full_attention"]
    return dict(parameters)


def _windows(config: Any, kind: str, layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, as transformers masks it (None: the whole prefix)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window:
        return (None,) * layers
    if types is not None:
        unknown = set(types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise Unsupported(f"layer types {sorted(unknown)}")
        return tuple(int(window) if t == "sliding_attention" else None for t in types)
    if kind in ("mistral", "phi3"):  # every layer (their modeling masks all layers with the window)
        return (int(window),) * layers
    return (None,) * layers


def decodes_fused(family: Family, weights: str) -> bool:
    """Whether the C++ decode kernels run this family. q4's computes every family described here (biases,
    q/k norms, partial rotation, windows, soft-capping, Gemma's norms and GeGLU: kernels/layer_step.h,
    LayerExtras); q8's Llama's arithmetic only (its smoothing). Both take head sizes in multiples of 8 and
    up to 8 query heads a key head."""
    computes = weights in EVERY_FAMILY_KERNELS or (weights == "q8" and family.plain)
    return computes and family.head_dim % 8 == 0 and family.heads // family.kv_heads <= 8


def weights_problem(family: Family, weights: str) -> str | None:
    """Why ``weights`` cannot serve ``family`` on the slot forward (None when it can)."""
    if weights == "q8" and not family.plain:
        return (f"--weights q8 is built for Llama's arithmetic only; {family.name} differs "
                "(use --weights q4, fp16 or dense)")
    return None


def unsupported_reason(model: Any) -> str | None:
    """Why this model cannot use the slot forward (None when it can)."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "the model has no config"
    try:
        describe(cfg)
    except Unsupported as exc:
        return str(exc)
    return None
