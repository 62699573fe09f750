"""A real gRPC server around a fake Generation servicer: for testing the *client* side only."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc

from proctor_client.v1 import generation_pb2_grpc


@contextmanager
def serve_fake(servicer: generation_pb2_grpc.GenerationServicer) -> Iterator[str]:
    """Serve ``servicer`` on 127.0.0.1 port 0 and yield its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def unused_addr() -> str:
    """An address nothing listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"
