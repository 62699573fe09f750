"""``proctor audit export``: records as JSON Lines (complete) or CSV (one row per request, tokens as JSON)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from proctor.audit.erasure import opened_json
from proctor.audit.keystore import KeyStore
from proctor.audit.kinds import ACCESS
from proctor.audit.store import AuditStore, Filters, Row

CSV_COLUMNS = ["seq", "audit_id", "time_utc", "caller", "request_id", "method", "status", "finish_reason",
               "model_id", "weights_sha256", "prompt_tokens", "completion_tokens", "prompt", "output",
               "schema_valid", "tokens_json", "hash"]
ACCESS_CSV_COLUMNS = ["seq", "audit_id", "time_utc", "caller", "method", "status", "target_json", "returned", "hash"]


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(part: dict[str, Any] | None) -> str:
    if not part:
        return ""
    if part.get("policy") == "erased":
        return "erased"
    return part.get("text", "") if part.get("policy") == "full" else f"hmac-sha256:{part.get('hmac_sha256', '')}"


def csv_row(row: Row, body: dict[str, Any]) -> list[object]:
    usage = body.get("usage") or {}
    validation = body.get("schema_validation")
    return [row.seq, row.audit_id, iso(row.time_ms), row.caller, row.request_id, body.get("method", ""),
            body["status"]["code"], row.finish_reason, body["model"].get("model_id", ""),
            body["model"].get("weights_sha256", ""), usage.get("prompt_tokens", ""), usage.get("completion_tokens", ""),
            _text(body.get("prompt")), _text(body.get("output")), "" if validation is None else validation["valid"],
            json.dumps(body.get("tokens", []), ensure_ascii=False, separators=(",", ":")), row.hash]


def access_csv_row(row: Row, body: dict[str, Any]) -> list[object]:
    return [row.seq, row.audit_id, iso(row.time_ms), row.caller, body.get("method", ""), body["status"]["code"],
            json.dumps(body.get("target", {}), ensure_ascii=False, separators=(",", ":")), body.get("returned", 0),
            row.hash]


def export_records(store: AuditStore, out: TextIO, fmt: str, filters: Filters,
                   progress: Callable[[int], None] | None = None, keys: KeyStore | None = None) -> int:
    """Write the matching records (sealed ones opened with ``keys``, or marked erased); returns how many."""
    access = filters.kind == ACCESS
    writer = csv.writer(out) if fmt == "csv" else None
    if writer is not None:
        writer.writerow(ACCESS_CSV_COLUMNS if access else CSV_COLUMNS)
    count = 0
    for row in store.iterate(filters):
        body = json.loads(opened_json(row, keys))
        if writer is not None:
            writer.writerow(access_csv_row(row, body) if access else csv_row(row, body))
        else:
            out.write(json.dumps({"seq": row.seq, "hash": row.hash, "prev_hash": row.prev_hash, "record": body},
                                 ensure_ascii=False) + "\n")
        count += 1
        if progress is not None:
            progress(1)
    return count
