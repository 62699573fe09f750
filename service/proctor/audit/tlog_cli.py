"""``proctor audit serve-tiles`` and ``proctor audit export-tiles``: the log as a C2SP tiled log, away from the server.

``serve-tiles`` answers ``GET /tlog/checkpoint`` and ``GET /tlog/tile/...`` over a store opened read-only (a replica,
a copy, the server's own file): what the server's HTTP port serves under ``/tlog/``, open to anyone (tiles and
checkpoints hold hashes only; put it behind a proxy to restrict it). ``export-tiles`` writes the same resources as
files under a directory (``checkpoint``, ``tile/L/N[.p/W]``), which any static web server can serve as they are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from proctor.audit.cli_common import fail, open_readonly, store_flags


def add_tlog_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve-tiles", help="serve the log as a C2SP tiled log (/tlog/checkpoint, /tlog/tile/...) "
                                               "over a store opened read-only")
    store_flags(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, required=True, help="port to serve on")
    serve.set_defaults(func=_serve_tiles)

    export = sub.add_parser("export-tiles", help="write the latest signed checkpoint and every tile it needs as "
                                                 "files, for a static web server")
    store_flags(export)
    export.add_argument("--out", required=True, type=Path, help="directory (checkpoint, tile/...)")
    export.set_defaults(func=_export_tiles)


def _serve_tiles(args: argparse.Namespace) -> int:
    import uvicorn

    from proctor.audit.tlog_http import PREFIX, tlog_app
    from proctor.audit.tlog_read import TlogReader

    try:
        store = open_readonly(args)
    except (OSError, ValueError, RuntimeError) as exc:
        return fail(str(exc))
    print(f"serving {store.description} as a tiled log at http://{args.host}:{args.port}{PREFIX}/", file=sys.stderr)
    uvicorn.run(tlog_app(TlogReader(store, public=True)), host=args.host, port=args.port, log_level="warning")
    return 0


def _export_tiles(args: argparse.Namespace) -> int:
    from proctor.audit.proofs import ProofUnavailable
    from proctor.audit.tiles import tiles_of
    from proctor.audit.tlog_read import TlogReader
    from proctor_client.tlog.note import parse_checkpoint, parse_note

    try:
        store = open_readonly(args)
        reader = TlogReader(store, public=True)
        note = reader.checkpoint().body
    except ProofUnavailable as exc:
        return fail(str(exc))
    except (OSError, ValueError, RuntimeError) as exc:
        return fail(str(exc))
    size = parse_checkpoint(parse_note(note.decode()).text).size
    tiles = tiles_of(size)
    for number, tile in enumerate(tiles, 1):
        _write(args.out / "tile" / tile.path(), reader.tile(tile.path()).body)
        if number % 1000 == 0:
            print(f"{number}/{len(tiles)} tiles", file=sys.stderr)
    _write(args.out / "checkpoint", note)  # last: a reader of the directory never sees a checkpoint without its tiles
    print(f"checkpoint of {size} records and {len(tiles)} tiles in {args.out}", file=sys.stderr)
    return 0


def _write(path: Path, body: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(body)
    partial.replace(path)
