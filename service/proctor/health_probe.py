"""``proctor health``: the gRPC health check as an exit status.

Container HEALTHCHECKs, Compose and exec probes call it, so the image needs no ``grpc_health_probe``
download. Exit 0 when the service is SERVING; 1 when it is NOT_SERVING, unknown or unreachable (the
reason on stderr); 2 for bad flags. The health service is exempt from the caller gate, so no token
is needed; TLS flags are, when the server listens with TLS.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proctor_client.auth import tls_credentials
from proctor_client.cli import ADDR_ENV, DEFAULT_ADDR, resolve_addr

EXIT_SERVING, EXIT_NOT_SERVING, EXIT_USAGE = 0, 1, 2


def check(address: str, service: str = "", timeout_s: float = 2.0,
          credentials: grpc.ChannelCredentials | None = None) -> tuple[bool, str]:
    """(serving, what the server said or why it could not be asked)."""
    channel = (grpc.secure_channel(address, credentials) if credentials is not None
               else grpc.insecure_channel(address))
    with channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status


def add_health_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("health", help="exit 0 if the server's health check says SERVING (for probes)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", metavar="HOST:PORT", help=f"server address (default: ${ADDR_ENV} or {DEFAULT_ADDR})")
    p.add_argument("--service", default="", help="service to ask about (default: the whole server)")
    p.add_argument("--timeout", type=float, default=2.0, metavar="S", help="deadline in seconds (2)")
    p.add_argument("--tls-ca", metavar="PEM", help="TLS: trust this CA (implies TLS)")
    p.add_argument("--tls-cert", metavar="PEM", help="mutual TLS: client certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="mutual TLS: client key")
    p.add_argument("--quiet", action="store_true", help="print nothing when serving")
    p.set_defaults(func=run_health)


def run_health(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        print("error: --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    try:
        credentials = (tls_credentials(args.tls_ca, args.tls_cert, args.tls_key)
                       if args.tls_ca or args.tls_cert else None)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    address = resolve_addr(args.addr)
    serving, said = check(address, args.service, args.timeout, credentials)
    if not serving:
        print(f"{address}: not serving ({said})", file=sys.stderr)
        return EXIT_NOT_SERVING
    if not args.quiet:
        print(f"{address}: {said}")
    return EXIT_SERVING
