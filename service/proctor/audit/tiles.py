"""The audit log's Merkle tree as C2SP tlog-tiles (c2sp.org/tlog-tiles): paths, and tiles read from the stored tree.

A tile is 256 consecutive hashes at one height of the tree: tile ``N`` of level ``L`` holds
``MTH(D[(N·256 + i)·256^L : (N·256 + i + 1)·256^L])`` for ``i`` in 0..255. The store keeps every complete
subtree's root (audit/tree.py: node ``(level, index)``), so a level-``L`` tile is just the stored nodes
``(8L, N·256 + i)``: no hashing at read time. A partial tile (``.p/W``) is the first ``W`` of those hashes; it is
as immutable as a full one (its hashes never change), so both are cached the same way.

What is served is bounded by the latest *signed* checkpoint's size, not the tree's: a client only needs tiles a
checkpoint requires, and rows not yet under a checkpoint stay out of view.

Entry bundles (``tile/entries/...``) are not served: the spec frames each entry with a big-endian uint16 length,
and an audit record (a prompt's token ids, its output, the token details) often passes 64 KiB, so a bundle could
not hold every leaf faithfully. The leaves are ``audit/tree.leaf_bytes`` of each record (docs/audit-format.md),
which ``ExportRecords`` and ``proctor audit export`` hand out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from proctor.audit.tree import TreeError

TILE_HEIGHT = 8  # tree levels a tile spans
TILE_WIDTH = 1 << TILE_HEIGHT  # hashes in a full tile
MAX_LEVEL = 63
Lookup = Callable[[list[tuple[int, int]]], dict[tuple[int, int], bytes]]

_LEVEL = r"(0|[1-9][0-9]?)"
_INDEX = r"((?:x[0-9]{3}/)*[0-9]{3})"
_WIDTH = r"(?:\.p/([1-9][0-9]{0,2}))?"
_TILE_PATH = re.compile(rf"{_LEVEL}/{_INDEX}{_WIDTH}")


class TilePathError(ValueError):
    """A path that is no tile's (the spec's grammar)."""


class TileUnavailable(LookupError):
    """A tile past what the latest signed checkpoint covers (or entry bundles, which this log does not serve)."""


@dataclass(frozen=True, slots=True)
class Tile:
    level: int
    index: int
    width: int  # TILE_WIDTH for a full tile

    @property
    def partial(self) -> bool:
        return self.width < TILE_WIDTH

    def path(self) -> str:
        """The tile's path under ``tile/``: ``L/N`` or ``L/N.p/W``."""
        return f"{self.level}/{encode_index(self.index)}" + (f".p/{self.width}" if self.partial else "")


def encode_index(index: int) -> str:
    """``N`` as the spec writes it: zero-padded 3-digit groups, all but the last prefixed ``x`` (1234067 →
    ``x001/x234/067``)."""
    if index < 0:
        raise ValueError(f"a tile index is never negative ({index})")
    groups = []
    while True:
        groups.append(f"{index % 1000:03d}")
        index //= 1000
        if not index:
            break
    return "/".join([f"x{group}" for group in reversed(groups[1:])] + [groups[0]])


def parse_tile_path(path: str) -> Tile:
    """A path under ``tile/`` (``L/N[.p/W]``) as a ``Tile``; ``TileUnavailable`` for an entry bundle's,
    ``TilePathError`` for anything the grammar does not allow (a leading zero, a group without ``x``, W of 0 or
    past 255...)."""
    if path == "entries" or path.startswith("entries/"):
        raise TileUnavailable("this log serves no entry bundles: its records can pass the 64 KiB a bundle's "
                              "uint16 lengths hold; read records with ExportRecords or `proctor audit export`")
    match = _TILE_PATH.fullmatch(path)
    if match is None:
        raise TilePathError(f"{path!r} is not a tile path (L/N[.p/W], N in 3-digit groups, x before all but "
                            "the last)")
    level, index_text, width_text = match.groups()
    width = int(width_text) if width_text else TILE_WIDTH
    if int(level) > MAX_LEVEL or (width_text and width >= TILE_WIDTH):
        raise TilePathError(f"{path!r}: the level must be 0-{MAX_LEVEL} and a partial width 1-{TILE_WIDTH - 1}")
    index = int(index_text.replace("x", "").replace("/", ""))
    if encode_index(index) != index_text:  # a redundant leading group (x000/...)
        raise TilePathError(f"{path!r}: the index {index} is written {encode_index(index)}")
    return Tile(int(level), index, width)


def hashes_at(level: int, size: int) -> int:
    """Hashes a tree of ``size`` leaves has at tile level ``level`` (the roots of its complete 256^level-leaf
    subtrees)."""
    return size >> (TILE_HEIGHT * level)


def tile_bytes(tile: Tile, size: int, lookup: Lookup) -> bytes:
    """The tile's hashes, concatenated, from the stored tree; ``TileUnavailable`` when a tree of ``size`` leaves
    (the latest signed checkpoint's) does not have them all."""
    first = tile.index * TILE_WIDTH
    if first + tile.width > hashes_at(tile.level, size):
        raise TileUnavailable(f"tile {tile.path()} is past the latest signed checkpoint ({size} records)")
    keys = [(TILE_HEIGHT * tile.level, first + i) for i in range(tile.width)]
    nodes = lookup(keys)
    missing = [key for key in keys if key not in nodes]
    if missing:
        raise TreeError(f"the stored Merkle tree lacks node {missing[0]} (level, index) under its signed checkpoint")
    return b"".join(nodes[key] for key in keys)


def tiles_of(size: int) -> list[Tile]:
    """Every tile a tree of ``size`` leaves is served as: its full tiles and, per level, its partial one (the spec's
    example: 70,000 leaves are 273 full level-0 tiles, one of width 112, one full level-1 tile, one of width 17 and
    one level-2 tile of width 1)."""
    tiles: list[Tile] = []
    level = 0
    while (count := hashes_at(level, size)) > 0:
        tiles += [Tile(level, index, TILE_WIDTH) for index in range(count // TILE_WIDTH)]
        if count % TILE_WIDTH:
            tiles.append(Tile(level, count // TILE_WIDTH, count % TILE_WIDTH))
        level += 1
    return tiles
