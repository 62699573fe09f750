"""The KV cache of the slot forward as slots (executor/slot_forward.py): one preallocated cache per layer, row ``i``
of each the keys and values of slot ``i``, each slot with its own length.

Its memory is mapped page by page as positions are written (``lazy_zeros``), and a slot's pages past what it
holds go back to the system when it is freed or refilled: resident memory follows the tokens the slots hold,
not the rows times the longest slot.

What changes a slot without a forward lives here: growing the cache, moving a finished request's last row
into its hole, copying and reordering beams, taking back rejected draft positions, and the spans the
prefix cache keeps and puts back (engine/prefix_cache.py).
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import torch

KV_GROWTH_TOKENS = 256  # the cache's length grows in steps of this many tokens


class SlotCache:
    def __init__(self, layers: int, max_slots: int, kv_heads: int, head_dim: int, cache_dtype: torch.dtype,
                 device: torch.device) -> None:
        self.max_slots = max_slots
        self.cache_dtype = cache_dtype
        self._position_bytes = head_dim * torch.empty(0, dtype=cache_dtype).element_size()  # one head's position
        self.bytes_per_token = layers * 2 * kv_heads * self._position_bytes
        self._layer_count, self._kv_heads, self._head_dim, self.device = layers, kv_heads, head_dim, device
        self._capacity = 0  # tokens per slot
        self._rows = 0  # slots allocated (grows in powers of two up to max_slots)
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._maps: list[mmap.mmap] = []  # on the CPU: the memory under the keys, then the values (lazy_zeros)
        self.lengths = [0] * max_slots  # tokens held per slot

    def bytes_for(self, lengths: Sequence[int]) -> int:
        """Resident cache bytes once the slots hold ``lengths`` tokens: on the CPU what they hold (and a page per
        layer, head and slot of rounding), since pages are committed as written and handed back when freed;
        elsewhere every slot sized for the longest."""
        if self.device.type == "cpu":
            rounding = len(lengths) * self._layer_count * 2 * self._kv_heads * mmap.PAGESIZE
            return sum(lengths) * self.bytes_per_token + rounding
        longest = max(lengths, default=0)
        return self._round_rows(max(len(lengths), self._rows)) * round_up(max(longest, self._capacity)) \
            * self.bytes_per_token

    def reserve(self, rows: int, length: int) -> None:
        """Grow the cache to at least ``rows`` slots of ``length`` tokens (copying what is there)."""
        if rows <= self._rows and length <= self._capacity:
            return
        new_rows, capacity = self._round_rows(max(rows, self._rows)), round_up(max(length, self._capacity))
        shape = (new_rows, self._kv_heads, capacity, self._head_dim)
        maps: list[mmap.mmap] = []
        for caches in (self._keys, self._values):
            for index in range(self._layer_count):  # one layer at a time: the old and new caches never coexist whole
                new, memory = lazy_zeros(shape, self.cache_dtype, self.device)
                maps += [memory] if memory is not None else []
                if index < len(caches):
                    for slot, length in enumerate(self.lengths[:self._rows]):  # what is held, not the whole extent
                        if length:
                            new[slot, :, :length].copy_(caches[index][slot, :, :length])
                    caches[index] = new
                else:
                    caches.append(new)
        self._rows, self._capacity, self._maps = new_rows, capacity, maps

    @property
    def capacity(self) -> int:
        """Positions each slot has room for now (the cache's length; it grows in steps of ``KV_GROWTH_TOKENS``)."""
        return self._capacity

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values [slots, KV heads, capacity, D], written and read in place by a step's
        kernels (they are new tensors once the cache grows)."""
        return self._keys[index], self._values[index]

    def storage(self) -> tuple[int, ...]:
        """The cache's shape and addresses: a captured CUDA graph holds them (graph_step.py), so it is captured
        again when they change."""
        return (self._capacity, self._rows, *(cache.data_ptr() for cache in self._keys + self._values))

    def _round_rows(self, rows: int) -> int:
        return min(self.max_slots, 1 << max(0, rows - 1).bit_length())

    def move(self, source: int, target: int) -> None:
        """Move slot ``source`` into slot ``target`` (a finished request's slot is reused)."""
        n = self.lengths[source]
        for cache in self._keys + self._values:
            cache[target, :, :n].copy_(cache[source, :, :n])
        self.lengths[target] = n
        self.free(source)
        self._release(target, n)

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._release(slot, 0)

    def _release(self, slot: int, keep: int) -> None:
        """Hand the pages of ``slot`` past its first ``keep`` positions back to the system (they read as zeros
        again), so the cache's resident memory follows the tokens held, not what each slot once held."""
        if slot >= self._rows or not self._maps:
            return
        position = self._position_bytes
        run = self._capacity * position  # one (slot, head)'s positions, contiguous
        for memory in self._maps:
            for head in range(self._kv_heads):
                base = (slot * self._kv_heads + head) * run
                start = -(-(base + keep * position) // mmap.PAGESIZE) * mmap.PAGESIZE
                end = (base + run) // mmap.PAGESIZE * mmap.PAGESIZE
                if end > start:
                    memory.madvise(mmap.MADV_DONTNEED, start, end - start)

    def reorder(self, slots: Sequence[int], parents: Sequence[int]) -> None:
        """Slot ``slots[i]`` takes the cache of slot ``slots[parents[i]]`` (beam search: the beams that run on
        follow their parents; all parents 0: every beam starts from the prompt in the first slot)."""
        sources = [slots[parent] for parent in parents]
        if sources == list(slots):
            return
        lengths = [self.lengths[source] for source in sources]
        n = max(lengths)
        self.reserve(max(slots) + 1, n + 1)
        index = torch.tensor(sources, dtype=torch.long, device=self.device)
        target = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        for cache in self._keys + self._values:
            cache[target, :, :n] = cache[index, :, :n]  # the right side is gathered first: a permutation is safe
        for slot, length in zip(slots, lengths, strict=True):
            self.lengths[slot] = length

    def trim(self, slot: int, length: int) -> None:
        """Keep the first ``length`` positions of ``slot`` (what follows is overwritten by later feeds)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} tokens, cannot keep {length}")
        self.lengths[slot] = length

    def read_span(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of ``slot``'s keys and values at positions ``start … end``, [layers, KV heads, end - start, D]
        (the prefix cache keeps a prompt's chunk)."""
        return (torch.stack([keys[slot, :, start:end] for keys in self._keys]),
                torch.stack([values[slot, :, start:end] for values in self._values]))

    def write_span(self, slot: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put ``read_span``'s keys and values back at ``start`` of ``slot``, which then holds ``start`` + their
        length tokens (a prefix taken from the cache instead of prefilled)."""
        if self.lengths[slot] != start:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} tokens, not {start}")
        end = start + keys.shape[2]
        self.reserve(slot + 1, end + 1)
        for layer, (cached_keys, cached_values) in enumerate(zip(keys, values, strict=True)):
            self._keys[layer][slot, :, start:end].copy_(cached_keys)
            self._values[layer][slot, :, start:end].copy_(cached_values)
        self.lengths[slot] = end


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
               ) -> tuple[torch.Tensor, mmap.mmap | None]:
    """Zeros whose memory is committed page by page as it is first written, and the map under them. On the CPU an
    anonymous private map: a cache sized for its longest slot keeps resident only the positions its slots have
    reached, since each (slot, head)'s positions are contiguous. Zeros, not empty, on every device: the torch-op
    path multiplies masked positions by 0 in attention, and 0 * NaN is NaN."""
    count = math.prod(shape)
    if device.type != "cpu" or count == 0:
        return torch.zeros(shape, dtype=dtype, device=device), None
    size = count * torch.empty(0, dtype=dtype).element_size()
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: not shared with a fork
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # a 2 MB page would commit the positions of many slots at one write
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(memory, dtype=dtype, count=count).view(shape), memory


def round_up(length: int) -> int:
    """``length`` rounded up to the cache's growth step."""
    return -(-length // KV_GROWTH_TOKENS) * KV_GROWTH_TOKENS
