"""transformers' rotary tables for the families the slot forward serves, without their modeling modules.

A GGUF model's skeleton used to be transformers' class for its config, built on the meta device. Importing
that class's module costs ~1.6 s and ~90 MB at start-up (it pulls in torch.distributed's tensors and the
dynamo compiler), and the slot forward reads nothing of it but the config and the rotary tables.
``Rotary`` computes those tables as each family's ``*RotaryEmbedding`` does: the same inverse frequencies
(the default rope here, every other kind from transformers' ``ROPE_INIT_FUNCTIONS``), the same float
operations, transformers' own ``dynamic_rope_update`` for the length-dependent kinds, and the same
attribute names, which that decorator reads. tests/unit/test_rotary.py holds it to the classes themselves,
bit for bit, for every family and rope kind.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update

# Families whose default rope rotates only ``partial_rotary_factor`` of each head (the others ignore it).
PARTIAL_ROTARY_FAMILIES = ("phi3",)
# Families with one set of rope parameters per layer type (``rope_parameters[layer_type]``).
PER_LAYER_TYPE_FAMILIES = ("gemma3_text",)


class Rotary(torch.nn.Module):
    """cos and sin for positions: ``rotary(x, position_ids)``, or ``rotary(x, position_ids, layer_type)`` for a
    family with a table per layer type; each of ``x``'s dtype."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.max_seq_len_cached = config.max_position_embeddings
        self.original_max_seq_len = config.max_position_embeddings
        self.config = config
        if config.model_type in PER_LAYER_TYPE_FAMILIES:
            self.rope_type: Any = {}
            for layer_type in sorted(set(config.layer_types)):
                parameters = config.rope_parameters[layer_type]
                if parameters is None:
                    continue
                self.rope_type[layer_type] = parameters["rope_type"]
                inv_freq, scaling = self._initial(parameters["rope_type"], layer_type)
                setattr(self, f"{layer_type}_inv_freq", torch.nn.Buffer(inv_freq, persistent=False))
                setattr(self, f"{layer_type}_original_inv_freq", torch.nn.Buffer(inv_freq.clone(), persistent=False))
                setattr(self, f"{layer_type}_attention_scaling", scaling)
        else:
            self.rope_type = config.rope_parameters["rope_type"]
            inv_freq, self.attention_scaling = self._initial(self.rope_type, None)
            self.inv_freq = torch.nn.Buffer(inv_freq, persistent=False)
            self.original_inv_freq = torch.nn.Buffer(inv_freq.clone(), persistent=False)

    def _initial(self, rope_type: str, layer_type: str | None) -> tuple[torch.Tensor, float]:
        if rope_type != "default":
            keywords = {"layer_type": layer_type} if layer_type is not None else {}
            return ROPE_INIT_FUNCTIONS[rope_type](self.config, None, **keywords)
        parameters = self.config.rope_parameters if layer_type is None else self.config.rope_parameters[layer_type]
        head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        dim = head_dim
        if self.config.model_type in PARTIAL_ROTARY_FAMILIES:
            dim = int(head_dim * parameters.get("partial_rotary_factor", 1.0))
        base = parameters["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0

    @dynamic_rope_update  # type: ignore[untyped-decorator]  # third-party typing
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        prefix = "" if layer_type is None else f"{layer_type}_"
        inv_freq: torch.Tensor = getattr(self, f"{prefix}inv_freq")
        scaling: float = getattr(self, f"{prefix}attention_scaling")
        freqs = position_ids[..., None].float() * inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * scaling
        sin = emb.sin() * scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
