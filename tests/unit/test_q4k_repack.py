"""Q4_K weights repacked eight rows to a group (kernels/ggml_r8.h, ``repack_q4_k``; issue 57's lever for one row):
every product is the file layout's bits, at every row count (the few-row loop reads the groups, more rows the
many-row loops' Blocks made straight from them, ggml_r8_blocks.h), in both loops, alone or in a stack of types, and
at the integers' edges (every code 15 against activations of ±127: the int16 sums' largest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.ggml_blocks import random_blocks
from helpers.gguf_writer import tiny_loaded_from_gguf, write_gguf
from helpers.requirements import hardware_lacks, missing
from test_families import build

from proctor.executor import fused_decode
from proctor.executor.gguf_linear import Q4_K_R8, GgufLinear
from proctor.executor.protocol import Feed
from proctor.executor.slot_forward import SlotForward

Q4_K, Q6_K, Q8_0 = 12, 14, 8
OUT, INPUTS = 64, 1024


@pytest.fixture(scope="module", autouse=True)
def kernel_ready() -> None:
    problem = fused_decode.load_problem()
    if problem is not None:
        missing(f"the decode kernels: {problem}")


def product(x: torch.Tensor, weights: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    return torch.ops.proctor.ggml_linear(x, [w for w, _ in weights], [t for _, t in weights])


def use_loops(chosen: str) -> None:
    """The AVX2 loops, or the VNNI ones (skipped, saying so, on a CPU without them)."""
    if chosen == "vnni" and torch.ops.proctor.q4_loops("") != "avx512-vnni":
        hardware_lacks("skipped: no AVX-512 VNNI here, so only the AVX2 loops are checked")
    torch.ops.proctor.q4_loops("auto" if chosen == "vnni" else chosen)


@pytest.mark.parametrize("chosen", ["avx2", "vnni"])
@pytest.mark.parametrize(("seed", "out"), [(0, 64), (1, 72)])
def test_every_row_count_gives_the_file_layouts_bits(chosen: str, seed: int, out: int) -> None:
    """72 rows: the VNNI loops' last sixteen-row item holds one group, the other half zero."""
    blocks = torch.from_numpy(np.ascontiguousarray(random_blocks(Q4_K, out, INPUTS, seed=seed)))
    grouped = torch.ops.proctor.repack_q4_k(blocks, INPUTS)
    assert tuple(grouped.shape) == (out // 8, 8 * blocks.shape[1])
    generator = torch.Generator().manual_seed(seed)
    try:
        use_loops(chosen)
        for rows in (1, 2, 3, 4, 5, 8, 9, 16, 17, 40):
            x = torch.randn(rows, INPUTS, generator=generator) * 4
            assert torch.equal(product(x, [(grouped, Q4_K_R8)]), product(x, [(blocks, Q4_K)])), rows
    finally:
        torch.ops.proctor.q4_loops("auto")


def test_a_stack_with_a_grouped_part_is_its_parts_side_by_side() -> None:
    parts = [(torch.from_numpy(np.ascontiguousarray(random_blocks(t, OUT, INPUTS, seed=3))), t)
             for t in (Q6_K, Q4_K, Q8_0)]
    grouped = [(torch.ops.proctor.repack_q4_k(w, INPUTS), Q4_K_R8) if t == Q4_K else (w, t) for w, t in parts]
    for rows in (1, 4, 12):
        x = torch.randn(rows, INPUTS, generator=torch.Generator().manual_seed(rows))
        stacked = product(x, grouped)
        assert stacked.shape == (rows, 3 * OUT)
        assert torch.equal(stacked, product(x, parts))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_integer_sums_are_exact(sign: float) -> None:
    """Every code 15 (bytes 0xFF) and every activation at the Q8_K extreme: each sub-block's int16 pair sums reach
    16·15·127 in the grouped loop; the result is the file layout's, and finite."""
    raw = random_blocks(Q4_K, OUT, INPUTS, seed=4).copy()
    per_row = raw.reshape(OUT, INPUTS // 256, 144)
    per_row[:, :, 16:] = 0xFF
    blocks = torch.from_numpy(np.ascontiguousarray(raw))
    x = torch.full((3, INPUTS), sign)
    grouped = product(x, [(torch.ops.proctor.repack_q4_k(blocks, INPUTS), Q4_K_R8)])
    assert torch.isfinite(grouped).all() and torch.equal(grouped, product(x, [(blocks, Q4_K)]))


def test_rows_not_in_eights_and_lookups_of_groups_are_refused() -> None:
    blocks = torch.from_numpy(np.ascontiguousarray(random_blocks(Q4_K, 12, INPUTS)))
    with pytest.raises(RuntimeError, match="eight rows"):
        torch.ops.proctor.repack_q4_k(blocks, INPUTS)
    grouped = torch.ops.proctor.repack_q4_k(blocks[:8].contiguous(), INPUTS)
    with pytest.raises(RuntimeError, match="not read back"):
        torch.ops.proctor.ggml_rows(grouped, Q4_K_R8, INPUTS, torch.tensor([0]))


def test_a_q4_k_model_serves_grouped_layers_with_the_file_layouts_logits(
        default_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the slot forward (models/gguf_layers.py): the layers' Q4_K matrices are served grouped, and a prompt
    and decode steps give the logits of the same file served on its rows (grouping turned off)."""
    model = build("llama", hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    path = write_gguf(model, default_gguf, tmp_path / "q4k.gguf", matrix_type="Q4_K")
    ids = torch.randint(3, model.config.vocab_size, (30,), generator=torch.Generator().manual_seed(2)).tolist()

    def served() -> tuple[torch.Tensor, list[int]]:
        slots = SlotForward(tiny_loaded_from_gguf(path), 2, torch.device("cpu"), "gguf")
        layer = slots.weights.layers[0]
        kinds = [*layer.qkv.types, layer.o.ggml_type, *layer.gate_up.types, layer.down.ggml_type]
        with torch.inference_mode():
            logits = [slots.forward([Feed(0, ids, 1)]), slots.forward([Feed(1, ids[:9], 1)])]
            for step in range(3):
                logits.append(slots.forward([Feed(0, [ids[step]], 1), Feed(1, [ids[step + 1]], 1)]))
        return torch.cat(logits), kinds

    grouped, kinds = served()
    assert set(kinds) == {Q4_K_R8}
    monkeypatch.setattr(GgufLinear, "grouped", lambda self: self)
    rows, file_kinds = served()
    assert set(file_kinds) == {Q4_K} and torch.equal(grouped, rows)
