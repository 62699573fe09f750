"""Whether the server serves, as the gRPC health service publishes it, asked without gRPC.

The health service is the one home of the answer (app.py publishes liveness under the whole server's name ``""``
and readiness under ``proctor.v1.Generation``, and a drain turns both NOT_SERVING). The HTTP door's ``/health``
and ``/ready`` ask it through ``Serving``, a plain function, so they follow it through a drain and the door needs
neither gRPC nor its health messages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from proctor_client.v1 import generation_pb2

SERVICE_NAME = generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name
Serving = Callable[[bool], Awaitable[bool]]  # ready (the Generation service) or alive (the whole server) → serving?


def serving_of(health: HealthServicer) -> Serving:
    """Ask ``health``: readiness (``True``: the model is loaded and calls would be served) or liveness."""

    async def serving(ready: bool) -> bool:
        answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME if ready else ""), None)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    return serving
