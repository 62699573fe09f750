"""A GGUF file's tensors as the gguf weights mode serves them: matrices as views of the memory-mapped
file (executor/gguf_linear.py), norms and biases as float32.

The header is read by models/gguf_header.py (scalars and the tensor table; the vocabulary arrays skipped,
decoded only when asked). A file whose matrices use a block type with no product here (Q2_K, Q3_K, the IQ
types, ...) is refused when opened, naming the types and a tensor of each, never served slowly through a
dequantized copy. transformers' own GGUF readers (a config or tokenizer conversion, once per file) parse it
with the ``gguf`` package (llama.cpp's own reader) through ``one_reader``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from proctor.executor.gguf_linear import BLOCK_TYPES, GgufLinear, type_name
from proctor.models.errors import ModelError
from proctor.models.gguf_header import GgufHeader, TensorInfo, read_header

# ggml types whose values gguf-py's reader hands out typed (the rest as the bytes of their blocks, a row a row)
TYPED = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


@dataclass(frozen=True)
class Tensor:
    """A tensor of the file: ``shape`` in GGUF order (``shape[0]`` a matrix's inputs), ``data`` a view of the
    map shaped as gguf-py shapes it (typed values, or each row's block bytes)."""

    name: str
    tensor_type: int
    shape: tuple[int, ...]
    data: np.ndarray


class GgufFile:
    """The tensors of one GGUF file, by their GGUF names (``blk.0.attn_q.weight``)."""

    def __init__(self, path: Path) -> None:
        path = Path(path)  # a str too, as gguf-py's reader takes
        try:
            self._header: GgufHeader = read_header(path)
            mapped = np.memmap(path, dtype=np.uint8, mode="r")
        except (ValueError, OSError) as exc:
            raise ModelError(f"{path} is not a readable GGUF file: {exc}") from exc
        self.path = path
        plain = mapped.view(np.ndarray)  # slices of a plain view cost less than memmap slices; it keeps the map
        self._map: mmap.mmap | None = getattr(mapped, "_mmap", None)
        self._base, self._size = int(plain.ctypes.data), int(plain.nbytes)
        self._tensors = {info.name: _tensor(info, plain, self._header.data_offset) for info in self._header.tensors}
        architecture = self._header.fields.get("general.architecture")
        self.architecture = architecture if isinstance(architecture, str) else "unknown"
        unsupported = self.unsupported_types()
        if unsupported:
            listed = "; ".join(f"{name} (e.g. {tensor})" for name, tensor in unsupported.items())
            supported = ", ".join(name for name, _, _ in BLOCK_TYPES.values())
            raise ModelError(f"{path.name}: block type(s) {listed} have no kernel here; supported: {supported}. "
                             f"Re-quantize the file to a supported type (e.g. Q4_K_M) or pass --weights dense")

    @property
    def metadata_bytes(self) -> int:
        """The bytes before the tensor data: the header, the metadata and the tensor table."""
        return self._header.data_offset

    def unsupported_types(self) -> dict[str, str]:
        """Block type name → one tensor using it, for the matrices whose type has no product here."""
        found: dict[str, str] = {}
        for name, tensor in self._tensors.items():
            kind = int(tensor.tensor_type)
            if len(tensor.data.shape) >= 2 and kind not in BLOCK_TYPES:
                found.setdefault(_ggml_name(kind), name)
        return found

    def has(self, name: str) -> bool:
        return name in self._tensors

    def block_types(self) -> dict[str, int]:
        """How many matrices the file holds of each block type (for the start-up log)."""
        counts: dict[str, int] = {}
        for tensor in self._tensors.values():
            if len(tensor.data.shape) >= 2:
                kind = type_name(int(tensor.tensor_type))
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def matrix(self, name: str, unpermute_heads: int | None = None) -> GgufLinear:
        """The matrix ``name`` as its blocks, rows in the file's order; ``unpermute_heads``: undo
        convert_hf_to_gguf's row permutation of Llama's q/k weights for that many heads (which makes
        rotary pairs adjacent; the slot forward rotates halves, as transformers does). Only then are the
        rows copied; otherwise the blocks stay in the file's memory map."""
        tensor = self._tensor(name)
        rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
        inputs = int(tensor.shape[0])
        with warnings.catch_warnings():  # a read-only map: the blocks are only ever read
            warnings.simplefilter("ignore", UserWarning)
            blocks = torch.from_numpy(np.asarray(tensor.data).view(np.uint8).reshape(rows, -1))
        if unpermute_heads is not None:
            blocks = unpermute_rows(blocks, unpermute_heads)
        return GgufLinear(blocks, int(tensor.tensor_type), inputs)

    def release(self, blocks: torch.Tensor) -> None:
        """Let this process's resident memory drop the file's pages behind ``blocks`` (a view of the map) once the
        matrix lives elsewhere (repacked, GgufLinear.grouped): read-only file pages, so a later read would fault
        them back from the file. Only whole pages inside the view; a tensor outside the map is left alone."""
        start = blocks.data_ptr() - self._base
        end = start + blocks.numel()
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED") or start < 0 or end > self._size:
            return
        first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)

    def vector(self, name: str, unpermute_heads: int | None = None) -> torch.Tensor:
        """A norm or bias as float32 (copied out of the map: small, and kept whole)."""
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        tensor = self._tensor(name)
        kind = GGMLQuantizationType(tensor.tensor_type)
        values = torch.from_numpy(np.array(dequantize(tensor.data, kind), dtype=np.float32).reshape(-1))
        if unpermute_heads is not None:
            values = unpermute_rows(values[:, None], unpermute_heads)[:, 0].contiguous()
        return values

    def field(self, key: str) -> Any:
        """A metadata value (a string, number or list; a one-element array as its element), or None."""
        value = self._header.value(key, self.path)
        return value[0] if isinstance(value, list) and len(value) == 1 else value

    def _tensor(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelError(f"{self.path.name} has no tensor {name!r} (architecture {self.architecture})") from None


def _tensor(info: TensorInfo, plain: np.ndarray, data_offset: int) -> Tensor:
    """``info``'s bytes in the map, shaped as gguf-py's reader shapes them."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
    except ValueError:
        raise ModelError(f"tensor {info.name}: unknown ggml type {info.ggml_type}") from None
    count = math.prod(info.dims)
    start = data_offset + info.offset
    raw = plain[start:start + count // block * size]
    if raw.size != count // block * size:
        raise ModelError(f"tensor {info.name} runs past the end of the file")
    outer = tuple(reversed(info.dims))
    if info.ggml_type in TYPED:
        data = raw.view(TYPED[info.ggml_type]).reshape(outer)
    else:
        data = raw.reshape(*outer[:-1], info.dims[0] // block * size)
    return Tensor(info.name, info.ggml_type, info.dims, data)


def unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """convert_hf_to_gguf's ``permute`` undone on whole rows (as transformers' LlamaTensorProcessor
    undoes it on values): within each head, rows (2i, 2i + 1) go back to (i, i + half)."""
    count = rows.shape[0]
    per_head = count // heads
    return rows.reshape(heads, per_head // 2, 2, -1).transpose(1, 2).reshape(count, -1).contiguous()



@functools.cache
def _reader_class() -> type:
    from gguf.gguf_reader import GGUFReader  # the class itself (one_reader replaces the package attribute)

    class FastReader(GGUFReader):
        """gguf's reader over a plain ndarray view of its memory map: it slices the map once per metadata
        value, and a ``np.memmap`` slice costs ~1.5 µs more than a plain one (3.4 s of a 135M model's 3.6 s
        load, most of it the vocabulary's strings)."""

        @property
        def data(self) -> Any:
            return self._plain

        @data.setter
        def data(self, value: Any) -> None:
            self._plain = value.view(np.ndarray)  # the view keeps the map alive

    return FastReader


@functools.lru_cache(maxsize=2)
def _reader(path: Path) -> Any:
    return _reader_class()(path, "r")


@contextlib.contextmanager
def one_reader(path: Path) -> Iterator[None]:
    """While loading ``path``: transformers' GGUF config and tokenizer readers get this module's parse of
    the file instead of parsing it again each (``gguf.GGUFReader``, which they import when called)."""
    import gguf

    original = gguf.GGUFReader

    def shared(location: Any, mode: str = "r") -> Any:
        return _reader(Path(location)) if Path(location) == path and mode == "r" else original(location, mode)  # type: ignore[arg-type]  # third-party typing

    gguf.GGUFReader = shared  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]
        _reader.cache_clear()


def _ggml_name(kind: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(kind).name
    except ValueError:
        return f"ggml type {kind}"
