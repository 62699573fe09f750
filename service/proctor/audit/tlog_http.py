"""The tiled log over HTTP (c2sp.org/tlog-tiles): ``GET /tlog/checkpoint`` and ``GET /tlog/tile/<L>/<N>[.p/<W>]``.

``tlog_response`` is the one place a reader's answer or refusal becomes an HTTP response: 400 for a path the spec's
grammar does not allow, 404 for what is not there (no signed checkpoint yet, a tile past the latest, entry bundles),
500 for a stored tree that lacks a node it should have. The server's HTTP port serves it behind its admission rules
(openai_http/routes.py); ``proctor audit serve-tiles`` serves ``tlog_app`` as it is, for a read-only replica.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from proctor.audit.proofs import ProofUnavailable
from proctor.audit.tiles import TilePathError, TileUnavailable
from proctor.audit.tlog_read import Served, TlogReader
from proctor.audit.tree import TreeError

log = logging.getLogger("proctor.audit.tlog")
PREFIX = "/tlog"
CHECKPOINT_ROUTE = PREFIX + "/checkpoint"
TILE_ROUTE = PREFIX + "/tile/{path}"  # the metric label: the template, never the path
TILE_PATH = PREFIX + "/tile/{path:path}"  # what Starlette matches


def _served(served: Served) -> Response:
    return Response(served.body, media_type=served.media_type, headers={"Cache-Control": served.cache_control})


async def tlog_response(reader: TlogReader, tile_path: str | None) -> Response:
    """The checkpoint (``tile_path`` None) or the tile at ``tile_path``, read off the event loop."""
    try:
        if tile_path is None:
            return _served(await asyncio.to_thread(reader.checkpoint))
        return _served(await asyncio.to_thread(reader.tile, tile_path))
    except TilePathError as exc:
        return PlainTextResponse(f"{exc}\n", status_code=400)
    except (TileUnavailable, ProofUnavailable) as exc:
        return PlainTextResponse(f"{exc}\n", status_code=404, headers={"Cache-Control": "no-store"})
    except TreeError as exc:
        log.error("the tiled log cannot answer: %s", exc)
        return PlainTextResponse(f"the stored Merkle tree is damaged: {exc}\n", status_code=500)


def tlog_app(reader: TlogReader) -> Starlette:
    """The two routes alone (``proctor audit serve-tiles``)."""

    async def checkpoint(request: Request) -> Response:
        return await tlog_response(reader, None)

    async def tile(request: Request) -> Response:
        return await tlog_response(reader, request.path_params["path"])

    return Starlette(routes=[Route(CHECKPOINT_ROUTE, checkpoint, methods=["GET"]),
                             Route(TILE_PATH, tile, methods=["GET"])])
