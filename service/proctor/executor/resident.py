"""Keeping the process's resident memory down while the slot weights are built (peak RSS, issue 13).

Why: the model's weights are a private memory map of its safetensors file; every page that a
calibration forward or a quantization reads stays resident until the whole map is unmapped, so
building q8 weights used to hold all 538 MB of fp32 weights *and* the new copies at once (peak
1.7 GB for a server that then runs in 0.8 GB). Two levers, both safe to use at any time:

- ``page_out``: ``madvise(MADV_DONTNEED)`` on the whole pages inside a tensor *that lie in a
  read-from-file mapping* (never anonymous memory, where it would zero data): the process drops
  them, the page cache keeps them, and a later read faults them back in from the file unchanged
  (the weights are never written in place).
- ``returning_freed_memory``: while it is active, allocations above 256 KB are their own mappings,
  so the temporaries of a layer's quantization go back to the system when freed instead of staying
  in glibc's heap; afterwards large allocations come from the heap again (no page faults per step).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

MADV_DONTNEED = 4
M_MMAP_THRESHOLD = -3
BUILD_MMAP_THRESHOLD = 256 * 1024  # bytes: above this, an allocation is its own mapping while building
STEADY_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's own upper bound for its adaptive threshold


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return None


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings backed by a regular file (``/proc/self/maps``)."""
    spans = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and fields[4] != "0":  # inode 0: anonymous
                start, end = (int(value, 16) for value in fields[0].split("-"))
                spans.append((start, end))
    return spans


def page_out(tensors: Iterable[torch.Tensor]) -> int:
    """Drop the resident pages of ``tensors`` that a file mapping backs; returns the bytes dropped."""
    libc = _libc()
    if libc is None:
        return 0
    spans = _file_mappings()
    page = mmap.PAGESIZE
    dropped = 0
    for tensor in tensors:
        if tensor.device.type != "cpu" or not tensor.numel() or not tensor.is_contiguous():
            continue
        begin = tensor.data_ptr()
        end = begin + tensor.numel() * tensor.element_size()
        if not any(start <= begin and end <= stop for start, stop in spans):
            continue  # not (wholly) in a file mapping: leave it alone
        first, last = -(-begin // page) * page, end // page * page
        if last > first and libc.madvise(first, last - first, MADV_DONTNEED) == 0:
            dropped += last - first
    return dropped


@contextlib.contextmanager
def paged_out_after_forward(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Each module's parameters are paged out right after its forward (a calibration pass then never
    holds more than one layer of the model's weights resident)."""
    def after(module: torch.nn.Module, _args: object, _output: object) -> None:  # None: the output stands
        page_out(module.parameters())

    handles = [module.register_forward_hook(after) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def returning_freed_memory() -> Iterator[None]:
    """Large allocations made inside go back to the system when freed (see the module docstring)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, BUILD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD)
            libc.malloc_trim(0)
