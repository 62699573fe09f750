"""The audit log as a C2SP tiled log (audit/tiles.py, tlog_read.py, tlog_http.py; ``proctor audit serve-tiles`` and
``export-tiles``), read by the tests' own client written from the spec (helpers/tlog_spec.py): tile paths as the
spec spells them, tiles at every checkpointed size rebuilding that checkpoint's root, every higher tile the hash of
the full tile below, and the same hashes the gRPC consistency proofs are made of."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from helpers.audit_log import grow
from helpers.reliability import free_port
from helpers.tlog_spec import consistent, fetch, mth, parse_checkpoint, read_tree, split_note, tile_url

from proctor.audit import tree
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.audit.tiles import (
    TILE_WIDTH,
    Tile,
    TilePathError,
    TileUnavailable,
    encode_index,
    parse_tile_path,
    tile_bytes,
    tiles_of,
)
from proctor.audit.tlog_http import tlog_app
from proctor.audit.tlog_read import TlogReader
from proctor.cli import main


@pytest.mark.parametrize(("index", "text"), [(0, "000"), (7, "007"), (999, "999"), (1000, "x001/000"),
                                             (1234067, "x001/x234/067"), (10**9, "x001/x000/x000/000")])
def test_an_index_is_written_as_the_spec_spells_it(index: int, text: str) -> None:
    assert encode_index(index) == text
    assert parse_tile_path(f"3/{text}") == Tile(3, index, TILE_WIDTH)
    assert tile_url("", 3, index).endswith(f"/tile/3/{text}")  # the spec's client agrees
    assert parse_tile_path(f"0/{text}.p/17") == Tile(0, index, 17)


@pytest.mark.parametrize("path", ["00/000", "01/000", "64/000", "0/00", "0/0000", "0/1000", "0/x001", "0/001/000",
                                  "0/x000/001", "0/000.p/0", "0/000.p/256", "0/000.p/01", "0/000.p/", "0/000.p",
                                  "-1/000", "0/000/", "", "0/x01/000"])
def test_a_path_outside_the_grammar_is_refused(path: str) -> None:
    with pytest.raises(TilePathError):
        parse_tile_path(path)


def test_entry_bundles_are_refused_with_the_reason() -> None:
    for path in ("entries/000", "entries/000.p/3"):
        with pytest.raises(TileUnavailable, match="64 KiB"):
            parse_tile_path(path)


def test_the_specs_example_tree_is_the_tiles_it_lists() -> None:
    """70,000 leaves: 273 full level-0 tiles, one of width 112, one full level-1 tile, one of width 17, and one
    level-2 tile of width 1; 256 leaves: a full level-0 tile and a level-1 tile of width 1."""
    tiles = tiles_of(70_000)
    by_level = {level: [t for t in tiles if t.level == level] for level in (0, 1, 2)}
    assert len(tiles) == 273 + 1 + 1 + 1 + 1
    assert [t.width for t in by_level[0]].count(TILE_WIDTH) == 273 and by_level[0][-1] == Tile(0, 273, 112)
    assert by_level[1] == [Tile(1, 0, TILE_WIDTH), Tile(1, 1, 17)]
    assert by_level[2] == [Tile(2, 0, 1)]
    assert tiles_of(256) == [Tile(0, 0, TILE_WIDTH), Tile(1, 0, 1)]
    assert tiles_of(0) == []


def test_tiles_of_a_large_tree_from_its_stored_nodes_rebuild_every_root() -> None:
    """A 70,000-leaf tree built as the writer builds it (CompactRange): at sizes across tile and level edges, the
    tiles a client reads give the MTH of the leaves, computed apart (helpers/tlog_spec.py)."""
    leaves = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(70_000)]
    compact = tree.CompactRange(0, [])
    compact.extend(leaves)
    nodes = {(level, index): digest for level, index, digest in compact.nodes}

    def lookup(keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        return {key: nodes[key] for key in keys if key in nodes}

    for size in (1, 255, 256, 257, 511, 512, 65_535, 65_536, 65_537, 70_000):
        got = {tile: tile_bytes(tile, size, lookup) for tile in tiles_of(size)}
        level0 = b"".join(body for tile, body in sorted(got.items(), key=lambda kv: kv[0].index) if tile.level == 0)
        assert [level0[i:i + 32] for i in range(0, len(level0), 32)] == leaves[:size]
        for tile, body in got.items():
            if tile.level:
                below = [got[Tile(tile.level - 1, tile.index * TILE_WIDTH + i, TILE_WIDTH)] for i in range(tile.width)]
                assert [body[32 * i:32 * i + 32] for i in range(tile.width)] == \
                    [mth([b[j:j + 32] for j in range(0, len(b), 32)]) for b in below]
        assert mth(leaves[:size]) == tree.range_hash(0, size, lookup(tree.range_keys(0, size)))
    with pytest.raises(TileUnavailable):
        tile_bytes(Tile(0, 273, 113), 70_000, lookup)  # one hash past the tree
    with pytest.raises(TileUnavailable):
        tile_bytes(Tile(2, 0, 2), 70_000, lookup)



@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tiles")
    grow(SQLiteAuditStore(directory / "log.db"), directory / "log.key", "tile", 620, every=50)
    return directory / "log.db", directory / "log.key"


@pytest.fixture(scope="module")
def served(log: tuple[Path, Path]) -> Iterator[str]:
    """``tlog_app`` (what ``proctor audit serve-tiles`` runs) over the log, on loopback."""
    config = uvicorn.Config(tlog_app(TlogReader(SQLiteAuditStore(log[0], readonly=True), public=True)),
                            host="127.0.0.1", port=free_port(), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"http://127.0.0.1:{config.port}/tlog"
    server.should_exit = True
    thread.join(10)


def test_every_checkpoint_is_rebuilt_from_the_tiles(log: tuple[Path, Path], served: str) -> None:
    """Each signed checkpoint of the log (every 50 records): its partial tiles are there, and the root a client
    rebuilds from them is the checkpoint's; the consistency proofs the log hands out check against those roots."""
    from proctor.audit.proofs import consistency, signed_checkpoint

    store = SQLiteAuditStore(log[0], readonly=True)
    status, body, headers = fetch(served + "/checkpoint")
    assert status == 200 and headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["cache-control"] == "public, max-age=2"
    _, latest, latest_root = parse_checkpoint(split_note(body.decode())[0])
    assert latest > TILE_WIDTH * 2  # full level-0 tiles and a partial level-1 one
    roots = {}
    for size in range(1, latest + 1):
        try:
            checkpoint, _ = signed_checkpoint(store, size)
        except LookupError:
            continue
        root, leaves = read_tree(served, size)
        assert root == checkpoint.root, size
        roots[size] = (root, leaves)
    assert len(roots) >= 12 and roots[latest][0] == latest_root
    sizes = sorted(roots)
    for old, new in itertools.pairwise(sizes):
        proof, _, _ = consistency(store, old, new)
        assert consistent(old, new, proof, roots[old][0], roots[new][0])
        assert roots[new][1][:old] == roots[old][1]  # the tiles at the larger size hold the smaller's leaves


def test_a_full_tile_is_immutable_and_what_is_not_there_is_404(served: str) -> None:
    status, body, headers = fetch(tile_url(served, 0, 0))
    assert status == 200 and len(body) == 8192 and headers["content-type"] == "application/octet-stream"
    assert headers["cache-control"] == "public, max-age=31536000, immutable"
    assert fetch(tile_url(served, 0, 0, 5))[1] == body[:5 * 32]  # a partial tile is a prefix of the full one
    for url in (tile_url(served, 0, 1000), tile_url(served, 3, 0, 1), served + "/tile/entries/000"):
        status, text, headers = fetch(url)
        assert status == 404 and headers["cache-control"] == "no-store", (url, text)
    status, text, _ = fetch(served + "/tile/0/0")
    assert status == 400 and b"3-digit" in text


def test_export_tiles_writes_what_serve_tiles_serves(log: tuple[Path, Path], served: str, tmp_path: Path) -> None:
    assert main(["audit", "export-tiles", "--db", str(log[0]), "--out", str(tmp_path / "out")]) == 0
    note = (tmp_path / "out" / "checkpoint").read_bytes()
    assert fetch(served + "/checkpoint")[1] == note
    _, size, _ = parse_checkpoint(split_note(note.decode())[0])
    files = sorted(p.relative_to(tmp_path / "out" / "tile").as_posix() for p in (tmp_path / "out" / "tile").rglob("*")
                   if p.is_file())
    assert files == sorted(tile.path() for tile in tiles_of(size))
    for path in files:
        assert (tmp_path / "out" / "tile" / path).read_bytes() == fetch(f"{served}/tile/{path}")[1]
