"""A real audit log grown for the tests: records written by the real sink, signed checkpoints at a set cadence."""

from __future__ import annotations

from pathlib import Path

from proctor.audit import FORMAT
from proctor.audit.chain import load_or_create_signing_key
from proctor.audit.sink import AuditSink
from proctor.audit.store import AuditStore


def grow(store: AuditStore, key_path: Path, prefix: str, count: int, every: int = 4) -> None:
    """``count`` records by the real sink (audit ids ``prefix-N``), a checkpoint every ``every`` and one at close."""
    sink = AuditSink(store, load_or_create_signing_key(key_path), checkpoint_file=None, checkpoint_every=every,
                     checkpoint_interval_s=3600)
    for number in range(count):
        sink.submit({"format": FORMAT, "kind": "request", "audit_id": f"{prefix}-{number}", "method": "Generate",
                     "request_id": f"{prefix}{number}", "received_ms": 1_764_000_000_000 + number,
                     "caller": {"identity": "alice"}, "finish": {"reason": "length", "detail": ""}}).result(10)
    sink.close()
