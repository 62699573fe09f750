"""models/rotary.py against each family's own rotary module: the same cos and sin, bit for bit.

A GGUF skeleton's rotary tables come from ``Rotary`` (models/gguf_model.py), not transformers' classes, so
every family and rope kind the slot forward serves must give exactly the tables those classes give, at
short positions, past a length-dependent kind's switch (longrope, dynamic), and back again.
"""

from __future__ import annotations

import pytest
import torch
from test_families import FAMILIES, build

from proctor.models.rotary import Rotary

# Position spans in the order they are asked for: short, past the switches (512: BASE's context), short again.
SPANS = (range(0, 40), range(0, 300), range(200, 1100), range(0, 64))


def _tables(rotary: torch.nn.Module, layer_type: str | None, dtype: torch.dtype) -> list[torch.Tensor]:
    x = torch.zeros(1, dtype=dtype)
    out = []
    for span in SPANS:
        positions = torch.tensor([list(span)])
        cos, sin = rotary(x, positions) if layer_type is None else rotary(x, positions, layer_type)
        out += [cos, sin]
    return out


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tables_are_the_familys_own(name: str, dtype: torch.dtype) -> None:
    model = build(name)
    theirs = model.model.rotary_emb
    ours = Rotary(model.config)
    types = sorted(set(model.config.layer_types)) if isinstance(ours.rope_type, dict) else [None]
    for layer_type in types:
        expected, got = _tables(theirs, layer_type, dtype), _tables(ours, layer_type, dtype)
        for index, (a, b) in enumerate(zip(expected, got, strict=True)):
            assert a.dtype == b.dtype and torch.equal(a, b), (name, layer_type, index)


def test_a_partial_rotation_rotates_only_its_share() -> None:
    """Phi-3 rotates half of each head here (``partial_rotary_factor`` 0.5): a table of half the head's width."""
    config = build("phi3").config
    cos, _ = Rotary(config)(torch.zeros(1), torch.tensor([[0, 1]]))
    assert cos.shape[-1] == int(config.hidden_size // config.num_attention_heads * 0.5)
