"""TLS and mutual TLS: server credentials re-read when their files change, and the peer's certificate.

gRPC asks the fetcher for a certificate configuration on every new handshake; it answers ``None``
(keep the current one) until a file's mtime or size changes, so a rotated certificate or key is
served to the next connection without a restart. A half-written rotation (a key that does not
match yet) keeps the previous configuration and is logged.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

from proctor.config import Settings

log = logging.getLogger("proctor.tls")


@dataclass(frozen=True, slots=True)
class PeerCertificate:
    """The verified client certificate of an mTLS call: its subject (RFC 4514) and SANs."""

    subject: str
    sans: tuple[str, ...]


class CertificateFiles:
    """The server certificate chain, its key and (for mTLS) the client CA bundle, with change detection."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self.paths = tuple(p for p in (cert, key, client_ca) if p is not None)
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self._stamp = self._stat()
        self.configuration = self._read()

    def _stat(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for path in self.paths:
            try:
                st = path.stat()
                stamps.append((st.st_mtime_ns, st.st_size))
            except OSError:
                stamps.append((0, 0))
        return tuple(stamps)

    def _read(self) -> grpc.ServerCertificateConfiguration:
        try:
            chain, key = self.cert.read_bytes(), self.key.read_bytes()
            ca = self.client_ca.read_bytes() if self.client_ca else None
        except OSError as exc:
            raise ValueError(f"TLS file {exc.filename}: {exc.strerror}") from exc
        if b"PRIVATE KEY" not in key:
            raise ValueError(f"TLS key file {self.key} holds no PEM private key")
        x509.load_pem_x509_certificates(chain)  # a clear error now rather than a failed handshake later
        if ca is not None:
            x509.load_pem_x509_certificates(ca)
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC per handshake: a new configuration when the files changed, else None."""
        stamp = self._stat()
        if stamp == self._stamp:
            return None
        try:
            configuration = self._read()
        except ValueError as exc:
            log.error("TLS files changed but cannot be used (%s); serving the previous certificate", exc)
            return None
        self._stamp, self.configuration = stamp, configuration
        log.info("TLS certificate re-read from %s", self.cert)
        return configuration


def server_credentials(settings: Settings) -> tuple[grpc.ServerCredentials, CertificateFiles] | None:
    """Credentials for ``add_secure_port`` when a certificate is configured, else None (plaintext)."""
    if not settings.tls_cert_file:
        return None
    client_ca = Path(settings.tls_client_ca_file) if settings.tls_client_ca_file else None
    files = CertificateFiles(Path(settings.tls_cert_file), Path(settings.tls_key_file), client_ca)
    credentials = grpc.dynamic_ssl_server_credentials(files.configuration, files.fetch,
                                                      require_client_authentication=client_ca is not None)
    return credentials, files


def peer_certificate(auth_context: dict[str, list[bytes]]) -> PeerCertificate | None:
    """The client certificate gRPC verified for this call, or None (no TLS, or TLS without a client cert)."""
    pems = auth_context.get("x509_pem_cert") or []
    return _parse(pems[0]) if pems else None


@functools.lru_cache(maxsize=256)
def _parse(pem: bytes) -> PeerCertificate:
    cert = x509.load_pem_x509_certificate(pem)
    sans: list[str] = []
    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        extension = None
    if extension is not None:
        for kind in (x509.DNSName, x509.UniformResourceIdentifier, x509.RFC822Name):
            sans.extend(str(v) for v in extension.get_values_for_type(kind))
        sans.extend(str(v) for v in extension.get_values_for_type(x509.IPAddress))
    return PeerCertificate(subject=cert.subject.rfc4514_string(), sans=tuple(sans))
