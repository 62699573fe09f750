"""Who may call: the callers file (YAML or TOML), its roles, and which role each RPC needs.

A caller is named and identified by the **sha256 of its bearer token** (the file never holds a
token) and/or the subject or a SAN of its mTLS client certificate. The file is re-read when it
changes, so a token is added or revoked without a restart; a file that no longer parses keeps the
previous callers (and says so in the log).

```yaml
callers:
  - name: contracts-service
    token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    roles: [generate]
    limits: {requests_per_second: 5, burst: 10, concurrent_streams: 4, max_new_tokens: 512,
             max_request_bytes: 1048576}   # its request message / HTTP body; the server's limit caps it
  - name: compliance
    tls_subject: "CN=compliance.internal,O=Acme"   # RFC 4514, as `openssl x509 -subject -nameopt rfc2253`
    tls_san: compliance.internal                  # or a DNS/URI/email SAN of the certificate
    roles: [audit:read, audit:replay]
    prompt_cache: false   # nothing of its prompts outlives its requests (default: true, false under hmac prompts)
```

A caller's prompts are cached (engine/prefix_cache.py) in a namespace of its own: one caller's requests
never reuse, nor can time, another's cached prefix.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("proctor.auth")

ROLES = ("generate", "audit:read", "audit:replay", "audit:witness", "admin")  # admin holds every role
METHOD_ROLES = {
    "/proctor.v1.Generation/Generate": "generate",
    "/proctor.v1.Generation/StreamGenerate": "generate",
    "/proctor.v1.Generation/GetModelInfo": "generate",
    "/proctor.v1.Generation/ListSchemas": "generate",
    "/proctor.v1.Contracts/DraftContract": "generate",
    "/proctor.v1.Contracts/ListTemplates": "generate",
    "/proctor.v1.Audit/GetRecord": "audit:read",
    "/proctor.v1.Audit/ExportRecords": "audit:read",
    "/proctor.v1.Audit/VerifyLog": "audit:read",
    "/proctor.v1.Audit/GetCheckpoint": "audit:read",
    "/proctor.v1.Audit/GetInclusionProof": "audit:read",
    "/proctor.v1.Audit/GetConsistencyProof": "audit:read",
    "/proctor.v1.Audit/AddCosignature": "audit:witness",
    "/proctor.v1.Audit/CreateCheckpoint": "audit:read",
    "/proctor.v1.Audit/Replay": "audit:replay",
}
# These hold a concurrent-stream slot.
GENERATING_METHODS = frozenset({"/proctor.v1.Generation/Generate", "/proctor.v1.Generation/StreamGenerate",
                                "/proctor.v1.Contracts/DraftContract", "/proctor.v1.Audit/Replay"})
HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIXES = ("/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")
RELOAD_CHECK_S = 1.0
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
CALLER_KEYS = {"name", "token_sha256", "tls_subject", "tls_san", "roles", "limits", "prompt_cache"}
LIMIT_KEYS = {"requests_per_second", "burst", "concurrent_streams", "max_new_tokens", "max_request_bytes"}


class CallersFileError(ValueError):
    """The callers file is unreadable or wrong; the message names the entry and the key."""


def role_for(method: str) -> str:
    """The role an RPC needs; an RPC this table does not know needs ``admin`` (safe for new RPCs)."""
    return METHOD_ROLES.get(method, "admin")


@dataclass(frozen=True, slots=True)
class CallerLimits:
    requests_per_second: float | None = None
    burst: int | None = None
    concurrent_streams: int | None = None
    max_new_tokens: int | None = None
    # Its request's bytes (a gRPC message, an HTTP body), checked once it is admitted and before the request is
    # read or decoded; the server's max_message_bytes caps it (api/caller_limits.request_bytes_limit).
    max_request_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    roles: frozenset[str]
    token_sha256: str = ""
    tls_subject: str = ""
    tls_san: str = ""
    limits: CallerLimits = field(default_factory=CallerLimits)
    # Its prompts' chunks may be kept in the prefix cache (its own namespace); None: the server's default, on
    # unless prompts are kept out of the audit trail (--audit-prompt-policy hmac).
    prompt_cache: bool | None = None

    def may(self, role: str) -> bool:
        return role in self.roles or "admin" in self.roles


@dataclass(frozen=True, slots=True)
class Callers:
    """The parsed file: lookups by token hash, certificate subject and SAN."""

    by_token: dict[str, Caller]
    by_subject: dict[str, Caller]
    by_san: dict[str, Caller]

    def __len__(self) -> int:
        return len({c.name for group in (self.by_token, self.by_subject, self.by_san) for c in group.values()})


def parse_callers(data: Any, source: str) -> Callers:
    """Check every entry (names the entry and key on the first problem) and index it."""
    entries = data.get("callers") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CallersFileError(f"{source}: expected a non-empty list under 'callers'")
    by_token: dict[str, Caller] = {}
    by_subject: dict[str, Caller] = {}
    by_san: dict[str, Caller] = {}
    names: set[str] = set()
    for index, entry in enumerate(entries):
        caller = _caller(entry, f"{source}: callers[{index}]")
        if caller.name in names:
            raise CallersFileError(f"{source}: callers[{index}]: name {caller.name!r} appears twice")
        names.add(caller.name)
        for key, table in ((caller.token_sha256, by_token), (caller.tls_subject, by_subject), (caller.tls_san, by_san)):
            if key and key in table:
                raise CallersFileError(f"{source}: callers[{index}] ({caller.name}) shares its credential with "
                                       f"{table[key].name!r}")
            if key:
                table[key] = caller
    return Callers(by_token, by_subject, by_san)


def _caller(entry: Any, where: str) -> Caller:
    if not isinstance(entry, dict):
        raise CallersFileError(f"{where}: expected a table/mapping")
    unknown = set(entry) - CALLER_KEYS
    if unknown:
        hint = " (the file holds the token's sha256, never the token)" if "token" in unknown else ""
        raise CallersFileError(f"{where}: unknown keys {sorted(unknown)}{hint}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise CallersFileError(f"{where}: 'name' must be a non-empty string")
    where = f"{where} ({name})"
    token = str(entry.get("token_sha256", "")).strip().lower()
    if token and not SHA256_HEX.fullmatch(token):
        raise CallersFileError(f"{where}: 'token_sha256' must be 64 hex digits (sha256 of the token)")
    subject, san = str(entry.get("tls_subject", "")).strip(), str(entry.get("tls_san", "")).strip()
    if not (token or subject or san):
        raise CallersFileError(f"{where}: needs 'token_sha256', 'tls_subject' or 'tls_san'")
    roles = entry.get("roles")
    if not isinstance(roles, list) or not roles or not all(isinstance(r, str) for r in roles):
        raise CallersFileError(f"{where}: 'roles' must be a non-empty list of {', '.join(ROLES)}")
    bad = sorted(set(roles) - set(ROLES))
    if bad:
        raise CallersFileError(f"{where}: unknown roles {bad}; expected {', '.join(ROLES)}")
    prompt_cache = entry.get("prompt_cache")
    if prompt_cache is not None and not isinstance(prompt_cache, bool):
        raise CallersFileError(f"{where}: 'prompt_cache' must be true or false, got {prompt_cache!r}")
    return Caller(name=name.strip(), roles=frozenset(roles), token_sha256=token, tls_subject=subject, tls_san=san,
                  limits=_limits(entry.get("limits") or {}, where), prompt_cache=prompt_cache)


def _limits(raw: Any, where: str) -> CallerLimits:
    if not isinstance(raw, dict):
        raise CallersFileError(f"{where}: 'limits' must be a table/mapping")
    unknown = set(raw) - LIMIT_KEYS
    if unknown:
        raise CallersFileError(f"{where}: unknown limits {sorted(unknown)}; expected {', '.join(sorted(LIMIT_KEYS))}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        number = float(value) if key == "requests_per_second" and isinstance(value, int | float) else value
        if isinstance(number, bool) or not isinstance(number, int | float) or number <= 0:
            raise CallersFileError(f"{where}: limits.{key} must be a number above 0, got {value!r}")
        if key != "requests_per_second" and not isinstance(number, int):
            raise CallersFileError(f"{where}: limits.{key} must be a whole number, got {value!r}")
        values[key] = number
    return CallerLimits(**values)


def load_callers(path: Path) -> Callers:
    """Read a ``.toml`` file with tomllib, anything else as YAML."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CallersFileError(f"callers file {path}: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise CallersFileError(f"callers file {path} does not parse: {exc}") from exc
    return parse_callers(data, str(path))


class CallerBook:
    """The current callers, re-read (at most once a second) when the file's mtime or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._stat()
        self._callers = load_callers(path)
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _stat(self) -> tuple[int, int]:
        try:
            st = self.path.stat()
        except OSError:
            return (0, 0)
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> Callers:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return self._callers
        with self._lock:
            self._checked = now
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._callers = load_callers(self.path)
                    log.info("callers file %s re-read: %d callers", self.path, len(self._callers))
                except CallersFileError as exc:
                    log.error("%s; keeping the previous %d callers", exc, len(self._callers))
        return self._callers
