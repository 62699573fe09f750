"""Hash chain and signed checkpoints.

Each stored row's hash covers its sequence number, the previous row's hash, its filter columns
and its body, so changing, removing, inserting or reordering any row, or editing a column, breaks
the chain at that row (``row_hash``; ``proctor.audit/1`` rows, whose hash covers only the sequence
number, the previous hash and the body, are read with ``row_hash_v1``). Every N rows (or T
seconds) a checkpoint row carries an Ed25519 signature over the sequence number and hash it
closes; checkpoints are also appended to a file outside the store, so cutting off the tail of the
log (checkpoints included) is detected as well. The layout is docs/audit-format.md.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from json.encoder import encode_basestring  # the C encoder's JSON string (no ASCII escaping): RFC 8785's
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proctor.audit import FORMAT_V1, FORMAT_V2, FORMAT_V3, FORMATS
from proctor.audit.canonical import canonical
from proctor.audit.kinds import CHECKPOINT, RECORD_KINDS
from proctor.audit.records import finish_reason_of
from proctor.audit.store import RawRow
from proctor.audit.stored_body import is_compressed, record_json
from proctor_client.tlog.note import (
    NoteError,
    Signer,
    Verifier,
    load_public_key,
    parse_checkpoint,
    parse_note,
    signed_by,
)

GENESIS = "0" * 64
_HEADS = {FORMAT_V2: encode_basestring(FORMAT_V2), FORMAT_V3: encode_basestring(FORMAT_V3)}


def row_head(seq: int, prev_hash: str, kind: str, audit_id: str, time_ms: int, caller: str, request_id: str,
             finish_reason: str, form: str = FORMAT_V3) -> bytes:
    """What a ``proctor.audit/2`` or ``/3`` row's hash covers before its body: the canonical JSON
    (RFC 8785) of ``[format, seq, prev_hash, kind, audit_id, time_ms, caller, request_id,
    finish_reason]`` and a newline. It starts with ``[`` where the v1 head starts with ``{``: no
    bytes hash as both; and the format in it tells v2 from v3."""
    return (f"[{_HEADS[form]},{seq:d},{encode_basestring(prev_hash)},{encode_basestring(kind)},"
            f"{encode_basestring(audit_id)},{time_ms:d},{encode_basestring(caller)},{encode_basestring(request_id)},"
            f"{encode_basestring(finish_reason)}]\n").encode()


def chained_format(body: bytes) -> str:
    """The format of a row with a v2/v3 hash, told by its stored body: a zstd frame is v3, the
    canonical JSON itself v2."""
    return FORMAT_V3 if is_compressed(body) else FORMAT_V2


def row_hash(seq: int, prev_hash: str, kind: str, audit_id: str, time_ms: int, caller: str, request_id: str,
             finish_reason: str, body: bytes) -> str:
    """sha256 (hex) of ``row_head(...) + body``, ``body`` as stored (``chained_format`` names the head)."""
    digest = hashlib.sha256(row_head(seq, prev_hash, kind, audit_id, time_ms, caller, request_id, finish_reason,
                                     chained_format(body)))
    digest.update(body)  # releases the GIL for large bodies: another thread can read the store meanwhile
    return digest.hexdigest()


def row_hash_v1(seq: int, prev_hash: str, body: bytes) -> str:
    """A ``proctor.audit/1`` row's hash: sha256 over ``canonical({"seq", "prev"}) + "\\n" + body``."""
    return hashlib.sha256(canonical({"seq": seq, "prev": prev_hash}) + b"\n" + body).hexdigest()


def checkpoint_message(seq: int, hash_: str, time_ms: int) -> bytes:
    return canonical({"checkpoint_seq": seq, "checkpoint_hash": hash_, "time_ms": time_ms})


def load_or_create_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 key (PEM, PKCS#8). Created (mode 0600) when the file does not exist yet."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.touch(mode=0o600)
    path.write_bytes(pem)
    return key


def public_key_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def log_origin(key: Ed25519PublicKey, prefix: str = "proctor.audit") -> str:
    """The default origin (and note key name) of the log this key signs, unique per key (a witness's name
    with ``prefix`` ``proctor.witness``)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{prefix}/{hashlib.sha256(raw).hexdigest()[:16]}"


def log_signer(key: Ed25519PrivateKey, origin: str = "") -> Signer:
    """The checkpoint note signer: ``origin`` (default ``log_origin``) is both the checkpoint's origin line
    and the key's name, as in Go's checksum database."""
    return Signer(origin or log_origin(key.public_key()), key)


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    return base64.b64encode(key.sign(message)).decode()


def signature_ok(key: Ed25519PublicKey, message: bytes, signature: str) -> bool:
    try:
        key.verify(base64.b64decode(signature), message)
    except Exception:
        return False
    return True


# --- walking the chain (audit/verify.py in one process, audit/verify_parallel.py over ranges) ---


@dataclass(slots=True)
class ChainWalk:
    """Where the walk along the chain stands, and what it found."""

    public_key: Ed25519PublicKey | None
    prev_hash: str = GENESIS
    expected: int = 1
    records: int = 0
    checkpoints: int = 0
    checkpoint_hashes: dict[int, str] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)  # tree size -> the checkpoint's signed note (checked)
    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)  # signer keys named by checkpoints

    def page(self, rows: list[RawRow], digests: list[str | None]) -> tuple[int, str] | None:
        """Check one page of rows, given their v2/v3 hashes; (first bad seq, problem) or None. The
        loop is the common case (an intact v2 or v3 request row); anything else goes to ``_row_problem``."""
        prev_hash, expected, records = self.prev_hash, self.expected, self.records
        for row, digest in zip(rows, digests, strict=True):
            seq, kind, prev, hash_ = row[0], row[2], row[8], row[9]
            if seq == expected and prev == prev_hash and kind == "request" and digest == hash_:
                records += 1
            else:
                self.prev_hash, self.expected, self.records = prev_hash, expected, records
                problem = self._row_problem(row, digest)
                if problem:
                    return min(seq, expected), problem
                records = self.records
            prev_hash, expected = hash_, seq + 1
        self.prev_hash, self.expected, self.records = prev_hash, expected, records
        return None

    def _row_problem(self, row: RawRow, digest: str | None) -> str:
        seq, audit_id, kind, time_ms, caller, request_id, finish, body, prev, hash_ = row
        if seq != self.expected:
            return gap_problem(self.expected, seq)
        if prev != self.prev_hash:
            return link_problem()
        chained = digest == hash_  # the v2/v3 hash: it covers the columns
        form = chained_format(body) if chained else _v1_or_none(row)
        if form is None:
            return _unknown_format(body) or "the record's content does not match its hash (it was modified)"
        if chained and kind in RECORD_KINDS:  # the hash covers the columns and the body: nothing else to check
            self.records += 1
            return ""
        if chained and kind != CHECKPOINT:
            return f"unknown record kind {kind!r}"
        try:
            record = orjson.loads(record_json(body))  # canonical JSON, which orjson reads
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return "the record body is not JSON"
        if not isinstance(record, dict) or record.get("format") != form:
            found = record.get("format") if isinstance(record, dict) else None
            return f"the record's format {found!r} is not the {form} its hash is computed as"
        if record.get("kind") != kind:
            return "the kind column does not match the record"
        if kind == "checkpoint":
            problem = self._checkpoint_problem(record)
            if not problem:
                self.checkpoints += 1
                self.checkpoint_hashes[seq] = hash_
            return problem
        columns = (audit_id, time_ms, caller, request_id, finish)
        try:
            expected = (record["audit_id"], record["received_ms"], record["caller"]["identity"], record["request_id"],
                        finish_reason_of(record))
        except (KeyError, TypeError):
            return "the record lacks a field its filter columns copy"
        if columns != expected:
            return "a filter column (audit_id, time, caller, request_id, finish_reason) does not match the record"
        self.records += 1
        return ""

    def _checkpoint_problem(self, record: dict[str, Any]) -> str:
        if record.get("checkpoint_seq") != self.expected - 1 or record.get("checkpoint_hash") != self.prev_hash:
            return "the checkpoint does not cover the record before it"
        named = str(record.get("public_key"))
        if self.public_key is not None and named != public_key_text(self.public_key):
            return "the checkpoint was signed with a different key"
        try:
            key = self.public_key or self.keys.get(named) or self.keys.setdefault(named, load_public_key(named))
            message = checkpoint_message(int(record["checkpoint_seq"]), str(record["checkpoint_hash"]),
                                         int(record["time_ms"]))
        except (KeyError, TypeError, ValueError):
            return "the checkpoint is malformed"
        if not signature_ok(key, message, str(record.get("signature"))):
            return "the checkpoint signature is not valid"
        if "note" in record:
            return self._note_problem(record, key)
        return ""

    def _note_problem(self, record: dict[str, Any], key: Ed25519PublicKey) -> str:
        """The checkpoint's C2SP note: signed by the same key under the note's origin, for the tree of
        every row before it (its root is checked against the tree once the tree is verified)."""
        try:
            note = parse_note(str(record["note"]))
            checkpoint = parse_checkpoint(note.text)
            if signed_by(note, Verifier(checkpoint.origin, key)) is None:
                return "the checkpoint's signed note carries no signature of the log key"
        except NoteError as exc:
            return f"the checkpoint's signed note is not valid: {exc}"
        if checkpoint.size != record["checkpoint_seq"]:
            return "the checkpoint's signed note is for another tree size than the rows before it"
        self.notes[checkpoint.size] = str(record["note"])
        return ""


def gap_problem(expected: int, seq: int) -> str:
    what = "missing" if seq > expected else "duplicated or out of order"
    return f"expected sequence number {expected}, found {seq} (a record is {what})"


def link_problem() -> str:
    return "prev_hash does not match the previous record's hash (a record was removed, inserted or moved)"


def _v1_or_none(row: RawRow) -> str | None:
    """``FORMAT_V1`` when the row has a v1 hash (it has not the v2 one), else None: it was modified."""
    seq, body, prev, hash_ = row[0], row[7], row[8], row[9]
    try:
        return FORMAT_V1 if row_hash_v1(seq, prev, body) == hash_ else None
    except (TypeError, ValueError):
        return None


def _unknown_format(body: bytes) -> str:
    """For a row no known hash matches: whether its body names a format this verifier does not read."""
    try:
        named = orjson.loads(record_json(body)).get("format")
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
        return ""
    if not isinstance(named, str) or named in FORMATS:
        return ""
    return f"unknown record format {named!r} (this verifier reads {', '.join(FORMATS)})"
