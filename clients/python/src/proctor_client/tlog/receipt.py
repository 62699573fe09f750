"""Receipts: the log's signed promise, handed out with each response, that the call's record is in the log.

A receipt is to a generation what Certificate Transparency's signed certificate timestamp (RFC 6962) and
Rekor's signed entry timestamp are to a certificate or an artefact: the log signs, the moment the record is
committed, where the record sits and what it holds. The caller keeps it and can check it offline with the log's
verifier key (``proctor audit public-key``), long before a checkpoint covers the record; ``proctor audit prove
--from-receipt`` later turns it into an inclusion proof (c2sp.org/tlog-proof), which needs no trust in the log.

The receipt is a C2SP signed note (the checkpoints' format and key). Its text::

    proctor receipt v1          (a first line no origin can have: origins hold no spaces)
    <origin>                    (the log's name, its checkpoints' first line)
    <index>                     (the record's leaf index in the log's Merkle tree: its row number - 1)
    <leaf hash>                 (base64 of sha256(0x00 || leaf bytes): what the inclusion proof proves)
    <time_ms>                   (when the record was committed, POSIX milliseconds)
    <audit id>
    <request sha256>            (hex, of the request as the record holds it: RFC 8785 JSON of its ``request``)
    <output sha256>             (hex, of the output text as the response returned it, UTF-8)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from proctor_client.tlog.merkle import HASH_SIZE
from proctor_client.tlog.note import NoteError, Signer, Verifier, parse_note, signed_by

HEADER = "proctor receipt v1"


class ReceiptError(NoteError):
    """A receipt that does not verify; ``check`` names what failed (signature, origin, record, output, format)."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(f"{check}: {message}")
        self.check = check


@dataclass(frozen=True, slots=True)
class Receipt:
    origin: str
    index: int
    leaf_hash: bytes
    time_ms: int
    audit_id: str
    request_sha256: str
    output_sha256: str

    def text(self) -> str:
        lines = (HEADER, self.origin, str(self.index), base64.b64encode(self.leaf_hash).decode(), str(self.time_ms),
                 self.audit_id, self.request_sha256, self.output_sha256)
        return "".join(f"{line}\n" for line in lines)


def output_digest(text: str) -> str:
    """The receipt's output digest of ``text`` (what a caller recomputes from the response)."""
    return hashlib.sha256(text.encode()).hexdigest()


def sign_receipt(receipt: Receipt, signer: Signer) -> str:
    """The receipt as a signed note (``signer``: the log's key, named by its origin)."""
    if signer.name != receipt.origin:
        raise ValueError(f"a receipt of log {receipt.origin!r} is signed by its own key, not {signer.name!r}")
    text = receipt.text()
    return text + "\n" + signer.signature_line(text)


def parse_receipt(text: str) -> Receipt:
    """A receipt's text (the note's, without its signatures)."""
    lines = text.split("\n")
    if len(lines) != 9 or lines[-1] != "" or lines[0] != HEADER:
        raise ReceiptError("format", f"a receipt is eight lines, the first {HEADER!r}")
    _, origin, index, leaf, time_ms, audit_id, request, output = lines[:-1]
    try:
        digest = base64.b64decode(leaf, validate=True)
    except binascii.Error:
        digest = b""
    if not origin or not index.isdigit() or not time_ms.isdigit() or len(digest) != HASH_SIZE or not audit_id \
            or not all(len(value) == 64 and set(value) <= set("0123456789abcdef") for value in (request, output)):
        raise ReceiptError("format", "a receipt's lines are an origin, a leaf index, a 32-byte leaf hash in base64, "
                           "a time in milliseconds, an audit id and two sha256 digests in hex")
    return Receipt(origin, int(index), digest, int(time_ms), audit_id, request, output)


def verify_receipt(note: str, verifier: Verifier, *, audit_id: str | None = None,
                   output: str | None = None) -> Receipt:
    """The receipt ``note`` once it checks: signed by ``verifier`` (the log's vkey), of that log, and (when given)
    of record ``audit_id`` and of the response's ``output`` text. ``ReceiptError`` names the check that failed."""
    try:
        parsed = parse_note(note)
    except NoteError as exc:
        raise ReceiptError("format", str(exc)) from None
    receipt = parse_receipt(parsed.text)
    if receipt.origin != verifier.name:
        raise ReceiptError("origin", f"the receipt is of log {receipt.origin!r}, the key of {verifier.name!r}")
    try:
        signed = signed_by(parsed, verifier)
    except NoteError as exc:
        raise ReceiptError("signature", str(exc)) from None
    if signed is None:
        raise ReceiptError("signature", f"the receipt bears no signature of key {verifier.vkey()}")
    if audit_id is not None and receipt.audit_id != audit_id:
        raise ReceiptError("record", f"the receipt is of record {receipt.audit_id}, not {audit_id}")
    if output is not None and receipt.output_sha256 != output_digest(output):
        raise ReceiptError("output", "the output's sha256 is not the one the log signed")
    return receipt
