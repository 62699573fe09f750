"""What the tiled log's routes answer (``/tlog/checkpoint``, ``/tlog/tile/...``): a store's latest signed checkpoint,
with its cosignatures, and its tiles (audit/tiles.py), cached.

Both doors serve it: the server's HTTP port (openai_http/routes.py) and ``proctor audit serve-tiles`` over a replica
or a copy of the log. The checkpoint is read again at most every ``CHECKPOINT_TTL_S`` (a new one is written every
``--audit-checkpoint-every`` records or interval); a tile is immutable once its hashes exist, so it is kept for good,
up to ``TILE_CACHE`` of them (8 KiB each at most).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from proctor.audit.proofs import ProofUnavailable, signed_checkpoint
from proctor.audit.store import AuditStore
from proctor.audit.tiles import Tile, TileUnavailable, parse_tile_path, tile_bytes

CHECKPOINT_TTL_S = 1.0
TILE_CACHE = 4096
CHECKPOINT_TYPE = "text/plain; charset=utf-8"
TILE_TYPE = "application/octet-stream"
CHECKPOINT_MAX_AGE_S = 2  # the spec: the checkpoint's headers prevent caching beyond a few seconds
TILE_MAX_AGE_S = 31_536_000  # a year: a tile never changes


@dataclass(frozen=True, slots=True)
class Served:
    """One answer: its body, media type and ``Cache-Control`` value (the door adds nothing else)."""

    body: bytes
    media_type: str
    cache_control: str


class TlogReader:
    """One store's checkpoint and tiles, safe to call from several threads at once."""

    def __init__(self, store: AuditStore, *, public: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._scope = "public" if public else "private"  # what a shared cache may keep
        self._clock = clock
        self._lock = threading.Lock()
        self._checkpoint: tuple[float, int, str] | None = None  # (read at, size, note with cosignatures)
        self._tiles: OrderedDict[Tile, bytes] = OrderedDict()

    def _latest(self, fresh: bool = False) -> tuple[int, str]:
        with self._lock:
            held = self._checkpoint
        if held is not None and not fresh and self._clock() - held[0] < CHECKPOINT_TTL_S:
            return held[1], held[2]
        checkpoint, note = signed_checkpoint(self._store)  # ProofUnavailable: none signed yet
        with self._lock:
            self._checkpoint = (self._clock(), checkpoint.size, note)
        return checkpoint.size, note

    def checkpoint(self) -> Served:
        """The latest signed checkpoint with the cosignatures kept for it; ``ProofUnavailable`` before the first."""
        _, note = self._latest()
        return Served(note.encode(), CHECKPOINT_TYPE, f"{self._scope}, max-age={CHECKPOINT_MAX_AGE_S}")

    def tile(self, path: str) -> Served:
        """The tile at ``path`` (under ``tile/``). ``TilePathError`` for a malformed path, ``TileUnavailable`` for one
        past the latest signed checkpoint (read again once before saying so: a client may hold a checkpoint newer
        than the cached one)."""
        tile = parse_tile_path(path)
        with self._lock:
            body = self._tiles.get(tile)
            if body is not None:
                self._tiles.move_to_end(tile)
        if body is None:
            body = self._read(tile)
            with self._lock:
                self._tiles[tile] = body
                while len(self._tiles) > TILE_CACHE:
                    self._tiles.popitem(last=False)
        return Served(body, TILE_TYPE, f"{self._scope}, max-age={TILE_MAX_AGE_S}, immutable")

    def _read(self, tile: Tile) -> bytes:
        try:
            size, _ = self._latest()
        except ProofUnavailable:
            raise TileUnavailable("the log has no signed checkpoint yet, so no tile") from None
        try:
            return tile_bytes(tile, size, self._store.tree_nodes)
        except TileUnavailable:
            size, _ = self._latest(fresh=True)
            return tile_bytes(tile, size, self._store.tree_nodes)
