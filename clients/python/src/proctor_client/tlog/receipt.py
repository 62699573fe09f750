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

Receipts committed together may share one signature (what keeps signing off the writer's back at saturation,
bench/receipts.py): the server makes an RFC 9162 Merkle tree of the group's receipt texts (leaf: the text's
bytes) and signs a group note instead::

    <the receipt's text, as above>
    group <index> <size>        (its leaf in the group's tree)
    path <base64 hash>          (its inclusion path, the leaf's sibling first; none for a group of one)

    proctor receipts v1         (the group note, signed like any note)
    <origin>
    <size>
    <root hash, base64>

    — <origin> <signature>

A lone receipt is signed as the plain note above. ``verify_receipt`` takes both.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from proctor_client.tlog.merkle import HASH_SIZE, ProofError, leaf_hash, node_hash, verify_inclusion
from proctor_client.tlog.note import Note, NoteError, Signer, Verifier, parse_note, signed_by

HEADER = "proctor receipt v1"
GROUP_HEADER = "proctor receipts v1"


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
    return signed_receipts([receipt], signer.name, signer.signature_line)[0]


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


def sign_receipts(receipts: list[Receipt], signer: Signer) -> list[str]:
    """The receipts as signed notes: a lone one plainly, several under one signature of their group's tree."""
    return signed_receipts(receipts, signer.name, signer.signature_line)


def signed_receipts(receipts: list[Receipt], origin: str, signature_line: Callable[[str], str]) -> list[str]:
    """``sign_receipts`` with the log's key as a function from a note's text to its signature line."""
    for receipt in receipts:
        if receipt.origin != origin:
            raise ValueError(f"a receipt of log {receipt.origin!r} is signed by its own key, not {origin!r}")
    texts = [receipt.text() for receipt in receipts]
    if len(texts) == 1:
        return [texts[0] + "\n" + signature_line(texts[0])]
    levels = tree_levels([leaf_hash(text.encode()) for text in texts])
    group = group_text(origin, len(texts), levels[-1][0])
    signed = group + "\n" + signature_line(group)
    return [grouped(text, index, levels, signed) for index, text in enumerate(texts)]


def group_text(origin: str, size: int, root: bytes) -> str:
    return "".join(f"{line}\n" for line in (GROUP_HEADER, origin, str(size), base64.b64encode(root).decode()))


def grouped(text: str, index: int, levels: list[list[bytes]], signed_group: str) -> str:
    """Receipt ``index`` of a group (its tree's ``levels``): its text, its place and path, the signed group note."""
    path = "".join(f"path {base64.b64encode(digest).decode()}\n" for digest in tree_path(index, levels))
    return f"{text}group {index} {len(levels[0])}\n{path}\n{signed_group}"


def tree_levels(leaves: list[bytes]) -> list[list[bytes]]:
    """An RFC 9162 tree over leaf hashes (at least one), level by level: nodes paired left to right, an odd last
    node carried up as it is (the same tree as MTH's split at the largest power of two); the root is the last."""
    levels = [leaves]
    while len(levels[-1]) > 1:
        level = levels[-1]
        levels.append([node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
                      + ([level[-1]] if len(level) % 2 else []))
    return levels


def tree_path(index: int, levels: list[list[bytes]]) -> list[bytes]:
    """RFC 9162's inclusion path of leaf ``index``, the leaf's sibling first (none where a node is carried up)."""
    path = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(level[sibling])
        index //= 2
    return path


def verify_receipt(note: str, verifier: Verifier, *, audit_id: str | None = None,
                   output: str | None = None) -> Receipt:
    """The receipt ``note`` once it checks: signed by ``verifier`` (the log's vkey), alone or in a group, of that
    log, and (when given) of record ``audit_id`` and of the response's ``output`` text. ``ReceiptError`` names the
    check that failed."""
    head, _, rest = note.partition("\n\n")
    lines = head.split("\n")
    if len(lines) > 8 and lines[8].startswith("group "):
        receipt = parse_receipt("".join(f"{line}\n" for line in lines[:8]))
        _check_group(receipt, lines[8:], rest, verifier)
    else:
        try:
            parsed = parse_note(note)
        except NoteError as exc:
            raise ReceiptError("format", str(exc)) from None
        receipt = parse_receipt(parsed.text)
        if receipt.origin != verifier.name:
            raise ReceiptError("origin", f"the receipt is of log {receipt.origin!r}, the key of {verifier.name!r}")
        _check_signed(parsed, verifier)
    if audit_id is not None and receipt.audit_id != audit_id:
        raise ReceiptError("record", f"the receipt is of record {receipt.audit_id}, not {audit_id}")
    if output is not None and receipt.output_sha256 != output_digest(output):
        raise ReceiptError("output", "the output's sha256 is not the one the log signed")
    return receipt


def _check_signed(parsed: Note, verifier: Verifier) -> None:
    try:
        signed = signed_by(parsed, verifier)
    except NoteError as exc:
        raise ReceiptError("signature", str(exc)) from None
    if signed is None:
        raise ReceiptError("signature", f"the receipt bears no signature of key {verifier.vkey()}")


def _check_group(receipt: Receipt, lines: list[str], signed_group: str, verifier: Verifier) -> None:
    """A grouped receipt: the group note is the log's, signed by its key, and the receipt's text is in its tree."""
    if receipt.origin != verifier.name:
        raise ReceiptError("origin", f"the receipt is of log {receipt.origin!r}, the key of {verifier.name!r}")
    try:
        _, index, size = lines[0].split(" ")
        path = [base64.b64decode(line.removeprefix("path "), validate=True) for line in lines[1:]]
        parsed = parse_note(signed_group)
        group = parsed.text.split("\n")
        root = base64.b64decode(group[3], validate=True)
    except (ValueError, IndexError, binascii.Error, NoteError) as exc:
        raise ReceiptError("format", f"a grouped receipt is its text, its group line and path, and the signed group "
                           f"note ({exc})") from None
    if group[:3] != [GROUP_HEADER, receipt.origin, size] or len(group) != 5 or group[4] != "":
        raise ReceiptError("format", f"the group note is not {GROUP_HEADER!r} of log {receipt.origin!r} and size "
                                     f"{size}")
    _check_signed(parsed, verifier)
    try:
        verify_inclusion(int(index), int(size), leaf_hash(receipt.text().encode()), path, root)
    except (ProofError, ValueError) as exc:
        raise ReceiptError("signature", f"the receipt is not in the group the log signed: {exc}") from None
