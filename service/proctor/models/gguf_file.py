"""A GGUF file's tensors as the gguf weights mode serves them: matrices as views of the memory-mapped
file (executor/gguf_linear.py), norms and biases as float32.

Read with the ``gguf`` package (llama.cpp's own reader). A file whose matrices use a block type with no
product here (Q2_K, Q3_K, the IQ types, ...) is refused when opened, naming the types and a tensor of
each, never served slowly through a dequantized copy.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from proctor.executor.gguf_linear import BLOCK_TYPES, GgufLinear, type_name
from proctor.models.errors import ModelError


class GgufFile:
    """The tensors of one GGUF file, by their GGUF names (``blk.0.attn_q.weight``)."""

    def __init__(self, path: Path) -> None:
        try:
            self._reader = _reader(path)
        except (ValueError, OSError) as exc:
            raise ModelError(f"{path} is not a readable GGUF file: {exc}") from exc
        self.path = path
        self._tensors = {tensor.name: tensor for tensor in self._reader.tensors}
        architecture = self._reader.fields.get("general.architecture")
        self.architecture = bytes(architecture.parts[-1]).decode() if architecture is not None else "unknown"
        unsupported = self.unsupported_types()
        if unsupported:
            listed = "; ".join(f"{name} (e.g. {tensor})" for name, tensor in unsupported.items())
            supported = ", ".join(name for name, _, _ in BLOCK_TYPES.values())
            raise ModelError(f"{path.name}: block type(s) {listed} have no kernel here; supported: {supported}. "
                             f"Re-quantize the file to a supported type (e.g. Q4_K_M) or pass --weights dense")

    @property
    def metadata_bytes(self) -> int:
        """The bytes before the tensor data: the header, the metadata and the tensor table."""
        return int(self._reader.data_offset)

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

    def vector(self, name: str, unpermute_heads: int | None = None) -> torch.Tensor:
        """A norm or bias as float32 (copied out of the map: small, and kept whole)."""
        from gguf.quants import dequantize

        tensor = self._tensor(name)
        values = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(-1))
        if unpermute_heads is not None:
            values = unpermute_rows(values[:, None], unpermute_heads)[:, 0].contiguous()
        return values

    def field(self, key: str) -> Any:
        """A metadata value (a string, number or list), or None."""
        field = self._reader.fields.get(key)
        if field is None:
            return None
        values = [field.parts[index] for index in field.data]
        decoded = [bytes(v).decode() if v.dtype == np.uint8 else v.tolist() for v in values]
        flat = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in decoded]
        return flat[0] if len(flat) == 1 else flat

    def release_vocabulary(self) -> int:
        """Drop the parsed tokenizer arrays (tokens, merges, token types, scores: gguf-py keeps a numpy view per
        entry, ~110 MB at 152k tokens) once the tokenizer and the config are built from them; the fields dropped.
        The file lives as long as the model (its matrices are views of the map), so they would stay resident."""
        vocabulary = [key for key in self._reader.fields if key.startswith("tokenizer.ggml.")
                      and len(self._reader.fields[key].data) > 1]
        for key in vocabulary:
            del self._reader.fields[key]
        return len(vocabulary)

    def _tensor(self, name: str) -> Any:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelError(f"{self.path.name} has no tensor {name!r} (architecture {self.architecture})") from None


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
