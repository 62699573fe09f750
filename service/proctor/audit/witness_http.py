"""The witness's HTTP endpoint (``proctor audit witness --listen``): ``POST /add-checkpoint`` over ``WitnessService``,
its answers counted by outcome for Prometheus (``proctor_witness_requests_total``) and a 422 raising
``proctor_witness_inconsistent`` for an alert, as the pull rounds do."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proctor.audit.witness_server import MAX_BODY_BYTES, TEXT_TYPE, WitnessService
from proctor_client.tlog.note import Signer, Verifier

PATH = "/add-checkpoint"


def witness_app(service: WitnessService, registry: CollectorRegistry) -> Starlette:
    requests = Counter("proctor_witness_requests", "add-checkpoint requests by outcome (cosigned, conflict, "
                       "bad-request, unknown-log, forbidden, inconsistent)", ["outcome"], registry=registry)
    inconsistent = Gauge("proctor_witness_inconsistent", "1 once a log posted a checkpoint inconsistent with one "
                         "this witness cosigned (a forked or rewritten log): alert", registry=registry)

    async def add_checkpoint(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            requests.labels("bad-request").inc()
            return Response(f"a request is at most {MAX_BODY_BYTES} bytes\n", 413, media_type=TEXT_TYPE)
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > MAX_BODY_BYTES:
                requests.labels("bad-request").inc()
                return Response(f"a request is at most {MAX_BODY_BYTES} bytes\n", 413, media_type=TEXT_TYPE)
        answer = await asyncio.to_thread(service.add_checkpoint, body)  # the state file is written and synced
        requests.labels(answer.outcome).inc()
        if answer.outcome == "inconsistent":
            inconsistent.set(1)
        return Response(answer.text, answer.status, headers={"Content-Type": answer.media_type})  # exactly as given

    return Starlette(routes=[Route(PATH, add_checkpoint, methods=["POST"])])


def serve_witness(logs: dict[str, Verifier], signer: Signer, state: Path, host: str, port: int,
                  metrics_port: int = 0) -> None:
    """Serve until stopped (SIGINT/SIGTERM): the endpoint, and the metrics on ``metrics_port`` when not 0."""
    import uvicorn
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    if metrics_port:
        start_http_server(metrics_port, registry=registry)
    print(f"witness {signer.verifier.vkey()} serving {PATH} at http://{host}:{port} for "
          f"{', '.join(sorted(logs))}", file=sys.stderr)
    uvicorn.run(witness_app(WitnessService(logs, signer, state), registry), host=host, port=port, log_level="warning")
