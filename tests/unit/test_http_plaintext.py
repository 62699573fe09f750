"""``--http-plaintext``: the HTTP port without TLS while the gRPC port keeps its certificate (a gateway or mesh in
front terminates TLS, as Kubernetes' inference gateway does: deploy/k8s/overlays/inference-gateway). The real
listener (openai_http/server.py's uvicorn port) with real certificates: plaintext answers only when asked for."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import pytest
from helpers.certs import CertificateAuthority
from helpers.reliability import free_port
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from proctor.config import Settings
from proctor.openai_http.server import HttpListener


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def _answers(plaintext: bool, tmp_path: Path) -> tuple[str, str]:
    """(over http://, over https://): the body, or the error's class name."""
    ca = CertificateAuthority(tmp_path / "pki", "proctor-test-ca")
    cert = ca.issue("localhost", server=True, file_stem="server")
    settings = Settings.load({"host": "127.0.0.1", "http_port": free_port(), "tls_cert_file": str(cert.cert),
                              "tls_key_file": str(cert.key), "http_plaintext": plaintext}, environ={})

    async def run() -> tuple[str, str]:
        listener = HttpListener(Starlette(routes=[Route("/", _hello)]), settings)
        port = await listener.start()
        results = []
        try:
            for scheme, verify in (("http", False), ("https", ssl.create_default_context(cafile=str(ca.cert)))):
                try:
                    async with httpx.AsyncClient(verify=verify, timeout=5) as client:
                        results.append((await client.get(f"{scheme}://localhost:{port}/")).text)
                except httpx.HTTPError as exc:
                    results.append(type(exc).__name__)
        finally:
            await listener.stop()
        return results[0], results[1]

    return asyncio.run(run())


@pytest.mark.parametrize("plaintext", [True, False], ids=["http-plaintext", "tls"])
def test_the_http_port_is_plaintext_only_when_asked(plaintext: bool, tmp_path: Path) -> None:
    over_http, over_https = _answers(plaintext, tmp_path)
    if plaintext:
        assert over_http == "hello" and over_https != "hello"
    else:
        assert over_http != "hello" and over_https == "hello"
