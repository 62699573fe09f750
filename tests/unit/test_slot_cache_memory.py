"""The slot cache's memory follows the tokens its slots hold (executor/slot_cache.py, ``lazy_zeros``).

Read from the kernel's own account of the cache's mapping (/proc/self/smaps), not the process's RSS, so
what else the test process allocates does not blur it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.requirements import missing

from proctor.executor.slot_cache import SlotCache, lazy_zeros

SMAPS = Path("/proc/self/smaps")
PAGE = 4096


def resident_bytes(tensors: list[torch.Tensor]) -> int:
    """Resident bytes of the mappings that hold ``tensors`` (neighbouring maps of the same kind may be merged
    into one by the kernel, so the tensors are counted together)."""
    addresses = [tensor.data_ptr() for tensor in tensors]
    total, inside = 0, False
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = any(start <= address < end for address in addresses)
        elif inside and head == "Rss:":
            total += int(line.split()[1]) * 1024
    return total


@pytest.fixture(autouse=True)
def linux_only() -> None:
    if not SMAPS.exists():
        missing("no /proc/self/smaps here (Linux only): the cache's mappings cannot be read")


def test_a_grown_cache_keeps_resident_only_what_its_slots_hold() -> None:
    layers, rows, heads, head_dim = 2, 16, 2, 64
    cache = SlotCache(layers, rows, heads, head_dim, torch.float16, torch.device("cpu"))
    cache.reserve(rows, 4096)  # 16 slots of 4,096 tokens: 16 MB a layer's keys
    held = [10 * (slot + 1) for slot in range(rows)]  # 10 … 160 tokens
    for slot, length in enumerate(held):
        keys = torch.ones(layers, heads, length, head_dim, dtype=torch.float16)
        cache.write_span(slot, 0, keys, keys * 2)
    tensors = cache._keys + cache._values
    extent = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    # whole pages per (slot, head) run, and a page at each run's end and each mapping's edges to spare
    written = len(tensors) * sum(heads * (-(-length * head_dim * 2 // PAGE) + 1) * PAGE for length in held)
    assert resident_bytes(tensors) <= written + 8 * PAGE < extent // 10
    # Let the old mappings go with the growth: held here, one the kernel placed beside a new one would be merged
    # with it into one mapping and counted with it (anonymous mappings with the same flags merge).
    del tensors
    cache.reserve(rows, 8192)  # growth copies what is held, not the extent
    grown = cache._keys[0]
    assert resident_bytes(cache._keys + cache._values) <= written + 8 * PAGE
    for slot, length in enumerate(held):
        assert torch.equal(grown[slot, :, :length], torch.ones(heads, length, head_dim, dtype=torch.float16))
        assert torch.equal(cache._values[1][slot, :, :length], torch.full((heads, length, head_dim), 2.0,
                                                                         dtype=torch.float16))
        assert not grown[slot, :, length:].any()  # zeros past what is held


def test_a_freed_or_refilled_slot_hands_its_pages_back() -> None:
    """Resident memory follows the tokens held now, not the longest each slot once held."""
    layers, rows, heads, head_dim = 2, 4, 2, 64
    cache = SlotCache(layers, rows, heads, head_dim, torch.float16, torch.device("cpu"))
    cache.reserve(rows, 4096)
    for slot in range(rows):
        keys = torch.full((layers, heads, 4000, head_dim), float(slot + 1), dtype=torch.float16)
        cache.write_span(slot, 0, keys, keys)
    tensors = cache._keys + cache._values
    full = resident_bytes(tensors)
    assert full >= len(tensors) * rows * heads * 4000 * head_dim * 2
    cache.free(1)
    short = torch.full((layers, heads, 100, head_dim), 9.0, dtype=torch.float16)
    cache.free(2)
    cache.write_span(2, 0, short, short)  # slot 2 refilled with 100 tokens
    cache.move(3, 0)  # slot 0 takes slot 3's 4,000 tokens; slot 3 is freed
    per_slot = len(tensors) * heads * 4000 * head_dim * 2
    assert resident_bytes(tensors) <= full - 2 * per_slot - 0.9 * per_slot + 8 * PAGE * len(tensors) * heads
    assert cache.lengths[:4] == [4000, 0, 100, 0]
    assert torch.equal(cache._keys[1][0, :, :4000], torch.full((heads, 4000, head_dim), 4.0, dtype=torch.float16))
    assert torch.equal(cache._values[0][2, :, :100], short[0])
    assert not cache._keys[0][1].any() and not cache._keys[0][2, :, 100:].any()  # released pages read as zeros


def test_lazy_zeros_are_zeros_on_every_device() -> None:
    tensor, memory = lazy_zeros((3, 5, 7), torch.float32, torch.device("cpu"))
    assert memory is not None and tensor.shape == (3, 5, 7) and not tensor.any()
    tensor[1, 2, 3] = 4.0  # writable, and its own memory
    assert float(tensor.sum()) == 4.0 and not lazy_zeros((3, 5, 7), torch.float32, torch.device("cpu"))[0].any()
    empty, none = lazy_zeros((0, 4), torch.float16, torch.device("cpu"))
    assert empty.shape == (0, 4) and none is None


def test_admission_counts_what_the_rows_hold_and_bounds_the_resident_cache() -> None:
    """``bytes_for`` (engine/batch.py's ``fits`` under --kv-cache-mb) on the CPU: each row's own tokens, not rows
    times the longest, and never less than what the cache then keeps resident."""
    layers, rows, heads, head_dim = 2, 4, 2, 64
    cache = SlotCache(layers, rows, heads, head_dim, torch.float16, torch.device("cpu"))
    lengths = [4000, 30, 300, 7]
    assert cache.bytes_for(lengths) < cache.bytes_for([max(lengths)] * rows) / 2
    cache.reserve(rows, max(lengths))
    for slot, length in enumerate(lengths):
        keys = torch.ones(layers, heads, length, head_dim, dtype=torch.float16)
        cache.write_span(slot, 0, keys, keys)
    assert resident_bytes(cache._keys + cache._values) <= cache.bytes_for(lengths)
