"""The metrics endpoint: prometheus_client's WSGI app, always in the classic text format (0.0.4).

Why not ``start_http_server`` as it is: Prometheus 2.x asks for OpenMetrics, and prometheus_client
0.26 then answers with ``escaping=underscores``, escaping metric names with the rule for *label*
names, which has no colon, so ``proctor:requests_total`` reached Prometheus as
``proctor_requests_total`` and every alert rule and dashboard query (written, like vLLM's, with the
``proctor:`` prefix) matched nothing. Found by the Compose check against a real Prometheus;
``tests/deploy/test_monitoring_assets.py`` scrapes with a real Prometheus to keep it found. The text
format keeps the names as they are, and carries everything these metrics have (no exemplars).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one line per scrape every few seconds is noise)."""


def text_format_only(app: WsgiApp) -> WsgiApp:
    """The app with the request's Accept header removed: prometheus_client then answers text 0.0.4."""
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ.pop("HTTP_ACCEPT", None)
        return app(environ, start_response)
    return wrapped


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> ThreadingWSGIServer:
    """Serve the registry on ``host:port`` (any path) from a daemon thread; IPv4 or IPv6 as ``host`` is."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
    server: ThreadingWSGIServer = make_server(host, port, text_format_only(make_wsgi_app(registry)), server_class,
                         handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="proctor-metrics", daemon=True).start()
    return server
