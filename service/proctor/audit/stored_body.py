"""How a record's canonical JSON is kept in the store's ``body`` column.

``proctor.audit/3`` rows hold a zstd frame (RFC 8878) of the canonical JSON, and the row hash
covers those stored bytes. A 100-token record (every token with 5 alternatives) is ~45 KB of JSON
and ~13 KB compressed, so verifying a log hashes and reads a third of the bytes, and the store is
a third the size; the writer spends the compression (~95 µs a record at level 1) and saves as
much in SQLite pages and hashing. Older rows (v1, v2) hold the JSON itself: a JSON body starts
with ``{``, a zstd frame with its magic number, so the two are told apart by their first bytes.
"""

from __future__ import annotations

import threading

import zstandard

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LEVEL = 1  # level 3 compresses no better on these records and takes 40% longer (bench/README.md)
MAX_RECORD_BYTES = 256 * 1024 * 1024  # refuse to inflate a (tampered) frame that claims more than this
_local = threading.local()  # zstd contexts are not thread-safe: one of each per thread


def compress(canonical_json: bytes) -> bytes:
    """The stored body of a ``proctor.audit/3`` row (the frame records the content size)."""
    compressor = getattr(_local, "compressor", None)
    if compressor is None:
        compressor = _local.compressor = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True)
    return compressor.compress(canonical_json)


def is_compressed(body: bytes) -> bool:
    return body[:4] == ZSTD_MAGIC


def record_json(body: bytes) -> bytes:
    """The canonical JSON a stored body holds, whichever format wrote it; ``ValueError`` for a
    corrupt frame or one that claims more than ``MAX_RECORD_BYTES``."""
    if not is_compressed(body):
        return body
    decompressor = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    try:
        size = zstandard.frame_content_size(body)
        if not 0 <= size <= MAX_RECORD_BYTES:
            raise ValueError(f"the stored body claims {size} bytes of record")
        return decompressor.decompress(body, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise ValueError(f"the stored body is not a valid zstd frame: {exc}") from exc
