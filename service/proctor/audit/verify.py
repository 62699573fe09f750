"""``proctor audit verify``: recompute the chain, check every checkpoint signature and the checkpoint file.

The result names the first bad sequence number and what is wrong with it; an intact log is
``ok``. Checks, per row in order: the sequence number follows the previous one (a deleted or
inserted row), ``prev_hash`` is the previous row's hash (a swapped or inserted row), the hash
matches the row's content (an edited byte), the filter columns match the body, and a checkpoint's
signature and the hash it covers. After the rows: every checkpoint in the checkpoint file is in
the store with the same hash (the tail was not cut off).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from proctor.audit import FORMAT
from proctor.audit.chain import GENESIS, checkpoint_message, public_key_text, row_hash, signature_ok
from proctor.audit.records import finish_reason_of
from proctor.audit.store import AuditStore, Row


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    records: int
    checkpoints: int
    first_bad_seq: int | None = None
    problem: str = ""
    seconds: float = 0.0

    def summary(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        if self.ok:
            return (f"intact: {self.records} records, {self.checkpoints} checkpoints verified "
                    f"({rate:,.0f} records/s)")
        return f"TAMPERED: record {self.first_bad_seq}: {self.problem}"


def _row_problem(row: Row, expected_seq: int, prev_hash: str, public_key: Ed25519PublicKey | None) -> str:
    if row.seq != expected_seq:
        what = "missing" if row.seq > expected_seq else "duplicated or out of order"
        return f"expected sequence number {expected_seq}, found {row.seq} (a record is {what})"
    if row.prev_hash != prev_hash:
        return "prev_hash does not match the previous record's hash (a record was removed, inserted or moved)"
    if row_hash(row.seq, row.prev_hash, row.body) != row.hash:
        return "the record's content does not match its hash (it was modified)"
    try:
        body = json.loads(row.body)
    except ValueError:
        return "the record body is not JSON"
    if body.get("format") != FORMAT:
        return f"unknown record format {body.get('format')!r} (this verifier reads {FORMAT})"
    if body.get("kind") != row.kind:
        return "the kind column does not match the record"
    if row.kind == "checkpoint":
        return _checkpoint_problem(row, body, prev_hash, public_key)
    columns = (row.audit_id, row.time_ms, row.caller, row.request_id, row.finish_reason)
    expected = (body["audit_id"], body["received_ms"], body["caller"]["identity"], body["request_id"],
                finish_reason_of(body))
    if columns != expected:
        return "a filter column (audit_id, time, caller, request_id, finish_reason) does not match the record"
    return ""


def _checkpoint_problem(row: Row, body: dict[str, object], prev_hash: str, public_key: Ed25519PublicKey | None) -> str:
    if body.get("checkpoint_seq") != row.seq - 1 or body.get("checkpoint_hash") != prev_hash:
        return "the checkpoint does not cover the record before it"
    if public_key is not None and body.get("public_key") != public_key_text(public_key):
        return "the checkpoint was signed with a different key"
    message = checkpoint_message(int(body["checkpoint_seq"]), str(body["checkpoint_hash"]), int(body["time_ms"]))  # type: ignore[call-overload]
    key = public_key
    if key is None:
        from proctor.audit.chain import load_public_key

        key = load_public_key(str(body["public_key"]))
    if not signature_ok(key, message, str(body["signature"])):
        return "the checkpoint signature is not valid"
    return ""


def verify_log(store: AuditStore, *, public_key: Ed25519PublicKey | None = None, checkpoint_file: Path | None = None,
               progress: Callable[[int], None] | None = None) -> VerifyResult:
    """Check the whole log. Without ``public_key`` checkpoints are checked against the key they name
    (which proves integrity since the checkpoint, not who signed it)."""
    start = time.perf_counter()
    prev_hash, expected, records, checkpoints = GENESIS, 1, 0, 0
    hashes: dict[int, str] = {}
    for row in store.iterate(None):
        problem = _row_problem(row, expected, prev_hash, public_key)
        if problem:
            return VerifyResult(False, records, checkpoints, min(row.seq, expected), problem,
                                time.perf_counter() - start)
        if row.kind == "checkpoint":
            checkpoints += 1
            hashes[row.seq] = row.hash
        else:
            records += 1
        prev_hash, expected = row.hash, row.seq + 1
        if progress is not None:
            progress(1)
    if checkpoint_file is not None and checkpoint_file.exists():
        for line in checkpoint_file.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if hashes.get(entry["seq"]) != entry["hash"]:
                where = entry["seq"] if entry["seq"] < expected else expected
                return VerifyResult(False, records, checkpoints, where,
                                    f"checkpoint {entry['seq']} from the checkpoint file is "
                                    f"{'missing from' if entry['seq'] >= expected else 'different in'} the store "
                                    "(the log was cut short or rewritten)", time.perf_counter() - start)
    return VerifyResult(True, records, checkpoints, seconds=time.perf_counter() - start)
