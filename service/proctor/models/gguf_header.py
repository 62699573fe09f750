"""A GGUF file's header read without parsing its vocabulary: scalars decoded, arrays left where they lie.

gguf-py's ``GGUFReader`` builds a numpy view for every element of every array, and a 152k-token file's
tokens, merges, types and scores are ~600k of them: 1.5–3 s of a start-up, and ~110 MB held until dropped.
The server needs the tensor table, the data offset and a few scalars; the vocabulary arrays matter only when
the tokenizer or the config is converted, which happens once per file (models/gguf_tokenizer.py caches both).
So this walks the header itself (the format: llama.cpp's docs/gguf.md), skipping arrays by their lengths, and
decodes an array only when asked. ``GGUFReader`` still parses the file for a conversion (gguf_file.one_reader).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
# GGUF value types with a fixed size: struct format per type number
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class ArrayField:
    """An array value left in the file: its element type, count and the offset of its first element."""

    item_type: int
    count: int
    offset: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor-table entry: ``dims`` in GGUF order (``dims[0]`` the innermost: a matrix's inputs)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the tensor data


@dataclass(frozen=True)
class GgufHeader:
    version: int
    fields: dict[str, Any]  # a scalar or string decoded, or an ArrayField
    tensors: tuple[TensorInfo, ...]
    data_offset: int  # bytes before the tensor data: the header, the metadata and the tensor table

    def value(self, key: str, path: Path) -> Any:
        """The field ``key`` with an array decoded from ``path`` (a list), or None when absent."""
        field = self.fields.get(key)
        if not isinstance(field, ArrayField):
            return field
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _Walker(view, field.offset).items(field.item_type, field.count)


def read_header(path: Path) -> GgufHeader:
    """The header of ``path``; ValueError when it is not a GGUF file this reader understands."""
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
        if view[:4] != MAGIC:
            raise ValueError("no GGUF magic at the start")
        walker = _Walker(view, 4)
        version = walker.scalar(4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (2 and 3 are read here)")
        tensor_count, field_count = walker.scalar(10), walker.scalar(10)
        fields: dict[str, Any] = {}
        for _ in range(field_count):
            key = walker.string()
            kind = walker.scalar(4)
            if kind == ARRAY:
                item_type, count = walker.scalar(4), walker.scalar(10)
                fields[key] = ArrayField(item_type, count, walker.position)
                walker.skip(item_type, count)
            else:
                fields[key] = walker.value(kind)
        tensors = []
        for _ in range(tensor_count):
            name = walker.string()
            dims = tuple(walker.scalar(10) for _ in range(walker.scalar(4)))
            tensors.append(TensorInfo(name, dims, walker.scalar(4), walker.scalar(10)))
        alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
        data_offset = -(-walker.position // alignment) * alignment
        if data_offset > len(view):
            raise ValueError("the tensor table runs past the end of the file")
        return GgufHeader(version, fields, tuple(tensors), data_offset)


class _Walker:
    """A cursor over the mapped bytes (little-endian, as GGUF is)."""

    def __init__(self, view: mmap.mmap, position: int) -> None:
        self._view = view
        self.position = position

    def scalar(self, kind: int) -> Any:
        fmt = "<" + SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self._view, self.position)
        self.position += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar(10)
        start = self.position
        self.position += length
        if self.position > len(self._view):
            raise ValueError("a string runs past the end of the file")
        return bytes(self._view[start:self.position]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind not in SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self.scalar(kind)

    def items(self, kind: int, count: int) -> list[Any]:
        if kind == ARRAY:
            raise ValueError("nested GGUF arrays are not read here")
        return [self.value(kind) for _ in range(count)]

    def skip(self, kind: int, count: int) -> None:
        if kind == STRING:  # each one its length first: walked, not decoded
            view, position, unpack = self._view, self.position, struct.Struct("<Q").unpack_from
            for _ in range(count):
                position += 8 + unpack(view, position)[0]
            self.position = position
        elif kind in SCALARS:
            self.position += struct.calcsize("<" + SCALARS[kind]) * count
        else:
            raise ValueError(f"GGUF arrays of type {kind} are not read here")
        if self.position > len(self._view):
            raise ValueError("an array runs past the end of the file")
