"""``c2sp.org/tlog-proof@v1`` files: one audit record with the proof that a signed checkpoint holds it.

The file: the header line, ``extra <base64 leaf>`` (the record's leaf bytes: what the audit chain
hashes, docs/audit-format.md), ``index <n>``, the RFC 9162 inclusion path (one base64 hash per
line, the leaf's sibling first), a blank line, then the signed checkpoint with any cosignatures.
``verify_proof`` checks it with nothing but the published keys and says which check failed.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

import zstandard

from proctor_client.tlog.merkle import HASH_SIZE, ProofError, leaf_hash, verify_inclusion
from proctor_client.tlog.note import NoteError, Verifier, parse_checkpoint, parse_note, signed_by

HEADER = "c2sp.org/tlog-proof@v1"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a (forged) frame claiming more is refused, not inflated
SUFFIX = ".tlog-proof"


@dataclass(frozen=True, slots=True)
class TlogProof:
    index: int
    path: tuple[bytes, ...]
    checkpoint: str  # the signed note, verbatim
    extra: bytes | None = None

    def render(self) -> str:
        lines = [HEADER]
        if self.extra is not None:
            lines.append(f"extra {base64.b64encode(self.extra).decode()}")
        lines.append(f"index {self.index}")
        lines += [base64.b64encode(h).decode() for h in self.path]
        return "\n".join(lines) + "\n\n" + self.checkpoint


def parse_proof(text: str) -> TlogProof:
    head, sep, checkpoint = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or lines[0] != HEADER:
        raise ProofError(f"not a {HEADER} file (its first line and a blank line before the checkpoint)")
    rest, extra = lines[1:], None
    try:
        if rest and rest[0].startswith("extra "):
            extra = base64.b64decode(rest.pop(0)[6:], validate=True)
        if not rest or not rest[0].startswith("index ") or not rest[0][6:].isdigit():
            raise ProofError("the proof has no 'index <n>' line")
        index = int(rest.pop(0)[6:])
        path = tuple(base64.b64decode(line, validate=True) for line in rest)
    except binascii.Error as exc:
        raise ProofError(f"a line of the proof is not base64: {exc}") from None
    if any(len(h) != HASH_SIZE for h in path):
        raise ProofError("an inclusion path line is not a 32-byte hash")
    return TlogProof(index, path, checkpoint, extra)


@dataclass(frozen=True, slots=True)
class Leaf:
    """An audit row's leaf bytes read back: the head the chain hashes (as a list or, v1, a dict) and the stored body."""

    head: Any
    body: bytes

    @property
    def seq(self) -> int:
        return int(self.head["seq"] if isinstance(self.head, dict) else self.head[1])

    @property
    def kind(self) -> str:
        return "request" if isinstance(self.head, dict) else str(self.head[3])

    @property
    def audit_id(self) -> str | None:
        return None if isinstance(self.head, dict) else str(self.head[4])

    def record(self) -> dict[str, Any]:
        """The record's JSON (the stored body inflated when it is a zstd frame)."""
        body = self.body
        if body[:4] == ZSTD_MAGIC:
            try:
                body = zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_RECORD_BYTES)
            except zstandard.ZstdError as exc:
                raise ValueError(f"the stored body is not a zstd frame of a record: {exc}") from None
        record = json.loads(body)
        if not isinstance(record, dict):
            raise ValueError("the record is not a JSON object")
        return record


def parse_leaf(leaf: bytes) -> Leaf:
    """The head line (canonical JSON: no raw newline inside) and the body after it."""
    head, sep, body = leaf.partition(b"\n")
    if not sep:
        raise ValueError("the leaf has no head line")
    parsed = json.loads(head)
    if isinstance(parsed, list) and len(parsed) == 9 and isinstance(parsed[1], int):
        return Leaf(parsed, body)
    if isinstance(parsed, dict) and isinstance(parsed.get("seq"), int):
        return Leaf(parsed, body)
    raise ValueError("the leaf's head is not an audit row head")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class ProofReport:
    checks: list[Check] = field(default_factory=list)
    record: dict[str, Any] | None = None
    leaf: Leaf | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failed(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok


def verify_proof(text: str, log_key: str | Verifier, witness_keys: list[str | Verifier] | None = None) -> ProofReport:
    """Check a proof file offline: its form, the log's signature on the checkpoint, each witness's
    cosignature, the leaf against the record it holds, and the inclusion path against the root.

    ``log_key``: a vkey, or a raw Ed25519 key (base64 or a PEM file) taken as the checkpoint origin's key.
    ``witness_keys``: vkeys (type 0x04) that must each have cosigned the checkpoint.
    """
    from proctor_client.tlog.note import COSIGNATURE_V1, load_verifier

    report = ProofReport()
    try:
        proof = parse_proof(text)
        note = parse_note(proof.checkpoint)
        checkpoint = parse_checkpoint(note.text)
    except (ProofError, NoteError) as exc:
        report.add("format", False, str(exc))
        return report
    report.add("format", True, f"record index {proof.index} in a checkpoint of {checkpoint.size} records "
                               f"from {checkpoint.origin}")
    try:
        verifier = log_key if isinstance(log_key, Verifier) else load_verifier(log_key, checkpoint.origin)
        if verifier.name != checkpoint.origin:
            raise NoteError(f"the key is {verifier.name!r}'s, the checkpoint is {checkpoint.origin!r}'s")
        if signed_by(note, verifier) is None:
            raise NoteError(f"the checkpoint carries no signature of the log key {verifier.vkey()}")
        report.add("log signature", True, f"signed by {verifier.vkey()}")
    except NoteError as exc:
        report.add("log signature", False, str(exc))
        return report
    for key in witness_keys or []:
        try:
            witness = key if isinstance(key, Verifier) else load_verifier(key, "", COSIGNATURE_V1)
            when = signed_by(note, witness)
            if when is None:
                raise NoteError(f"the checkpoint carries no cosignature of witness {witness.name}")
            report.add("witness cosignature", True, f"cosigned by {witness.name} at {when}")
        except NoteError as exc:
            report.add("witness cosignature", False, str(exc))
            return report
    if proof.extra is None:
        report.add("leaf", False, "the proof has no extra line: the record's leaf bytes are missing")
        return report
    try:
        leaf = parse_leaf(proof.extra)
        report.leaf = leaf
        if leaf.seq != proof.index + 1:
            raise ValueError(f"the leaf is row {leaf.seq}, the proof is for index {proof.index} "
                             f"(row {proof.index + 1})")
        record = leaf.record()
        if leaf.audit_id is not None and record.get("audit_id", leaf.audit_id) != leaf.audit_id \
                and leaf.kind == "request":
            raise ValueError("the record's audit id is not the one its row head names")
        report.record = record
        report.add("leaf", True, f"row {leaf.seq}, {leaf.kind} {record.get('audit_id', '')}".rstrip())
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        report.add("leaf", False, f"the leaf bytes are not an audit row with its record: {exc}")
        return report
    try:
        verify_inclusion(proof.index, checkpoint.size, leaf_hash(proof.extra), list(proof.path), checkpoint.root)
        report.add("inclusion", True, f"the record is leaf {proof.index} of the tree whose root the log signed")
    except ProofError as exc:
        report.add("inclusion", False, str(exc))
    return report
