"""Inclusion and consistency proofs from the stored tree, against the log's signed checkpoints.

A proof is only handed out once it checks (``proctor_client.tlog``, as a third party would check
it): a tree that no longer matches its signed roots gives an error here, never a proof that fails
later in someone else's hands.
"""

from __future__ import annotations

import json
import time

from proctor.audit import tree
from proctor.audit.store import AuditStore, Row
from proctor_client.tlog.merkle import leaf_hash, verify_consistency, verify_inclusion
from proctor_client.tlog.note import (
    COSIGNATURE_V1,
    Checkpoint,
    NoteError,
    add_signature_lines,
    parse_checkpoint,
    parse_note,
    parse_vkey,
    signed_by,
)
from proctor_client.tlog.proof import TlogProof

CLOCK_SKEW_S = 300  # a cosignature dated this far ahead of the server's clock is refused


class ProofUnavailable(LookupError):
    """No proof can be given for what was asked (no checkpoint covering the record yet, a size past the tree...)."""


class NotFound(ProofUnavailable):
    """No record has the audit id asked for, or no checkpoint the tree size."""


def checkpoint_note(row: Row) -> str | None:
    """The signed note of a checkpoint row (None for one written before the tree)."""
    if row.kind != "checkpoint":
        return None
    note = json.loads(row.record_json()).get("note")
    return str(note) if note else None


def signed_checkpoint(store: AuditStore, wanted: str | int = "latest") -> tuple[Checkpoint, str]:
    """A checkpoint with its signed note: the latest, or the one for tree size ``wanted``."""
    if wanted == "latest":
        row = store.last_checkpoint()
        while row is not None and checkpoint_note(row) is None:
            row = store.last_checkpoint(row.seq)
        if row is None:
            raise ProofUnavailable("the log has no checkpoint with a signed tree root yet (one is written every "
                                   "--audit-checkpoint-every records or interval, and at shutdown)")
    else:
        row = store.row(int(wanted) + 1)  # the checkpoint for size N is row N + 1
        if row is None or checkpoint_note(row) is None:
            raise NotFound(f"there is no signed checkpoint for tree size {wanted}")
    note = checkpoint_note(row)
    assert note is not None
    checkpoint = parse_checkpoint(parse_note(note).text)
    cosigned = store.cosignatures(checkpoint.size)
    return checkpoint, add_signature_lines(note, cosigned) if cosigned else note


class CosignatureRefused(ValueError):
    """A cosignature the log does not keep: ``field`` names the request field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def add_cosignature(store: AuditStore, tree_size: int, witness_vkey: str, line: str, allowed: tuple[str, ...] = (),
                    now_s: float | None = None) -> bool:
    """Keep a witness's cosignature of the checkpoint of ``tree_size`` once it verifies on that checkpoint's note
    (``allowed``: the witnesses' vkeys this log accepts; empty: any whose cosignature verifies). ``PermissionError``
    for a witness not allowed."""
    try:
        witness = parse_vkey(witness_vkey)
    except NoteError as exc:
        raise CosignatureRefused("witness_vkey", str(exc)) from None
    if witness.type != COSIGNATURE_V1:
        raise CosignatureRefused("witness_vkey", "the witness key is not a cosignature key (vkey type 0x04)")
    if allowed and witness.vkey() not in allowed:
        raise PermissionError(f"witness {witness.name} is not one of this log's witnesses (--audit-witnesses)")
    _, note = signed_checkpoint(store, tree_size)
    try:
        signed = parse_note(parse_note(note).text + "\n" + line.rstrip("\n") + "\n")
        if len(signed.signatures) != 1:
            raise NoteError("send one signature line")
        when = signed_by(signed, witness)
    except NoteError as exc:
        raise CosignatureRefused("signature_line", str(exc)) from None
    if when is None:
        raise CosignatureRefused("signature_line", f"the line is not a signature of witness {witness.name} "
                                                   "(its name and key ID)")
    now = time.time() if now_s is None else now_s
    if when > now + CLOCK_SKEW_S:
        raise CosignatureRefused("signature_line", f"the cosignature is dated {when}, in the future")
    return store.add_cosignature(tree_size, witness.name, signed.signatures[0].line, int(now * 1000))


def witnessed_by(store: AuditStore, size: int, witnesses: tuple[str, ...]) -> int:
    """How many of ``witnesses`` (vkeys) have a cosignature kept for the checkpoint of ``size``."""
    names = {line.split(" ")[1] for line in store.cosignatures(size) if line.count(" ") >= 2}
    return len(names & {parse_vkey(vkey).name for vkey in witnesses})


def quorum_checkpoint(store: AuditStore, index: int, quorum: int, witnesses: tuple[str, ...]) -> tuple[Checkpoint, str]:
    """The latest signed checkpoint cosigned by at least ``quorum`` of ``witnesses`` (c2sp.org/tlog-policy's
    threshold) that covers leaf ``index``; ``ProofUnavailable`` when none does yet."""
    row = store.last_checkpoint()
    while row is not None:
        note = checkpoint_note(row)
        if note is not None:
            size = parse_checkpoint(parse_note(note).text).size
            if size <= index:
                break
            if witnessed_by(store, size, witnesses) >= quorum:
                return signed_checkpoint(store, size)
        row = store.last_checkpoint(row.seq)
    raise ProofUnavailable(f"no checkpoint covering row {index + 1} has {quorum} witness cosignatures yet "
                           "(--audit-witness-quorum): a later one will, once the witnesses answer")


def inclusion(store: AuditStore, audit_id: str, wanted: str | int = "latest", quorum: int = 0,
              witnesses: tuple[str, ...] = ()) -> TlogProof:
    """The ``tlog-proof`` of record ``audit_id`` in a signed checkpoint (the latest, or tree size ``wanted``); with a
    ``quorum``, one that many of ``witnesses`` cosigned."""
    row = store.get(audit_id)
    if row is None:
        raise NotFound(f"no audit record {audit_id!r}")
    index = row.seq - 1
    if quorum and wanted == "latest":
        checkpoint, note = quorum_checkpoint(store, index, quorum, witnesses)
    else:
        checkpoint, note = signed_checkpoint(store, wanted)
        if quorum and (count := witnessed_by(store, checkpoint.size, witnesses)) < quorum:
            raise ProofUnavailable(f"the checkpoint of {checkpoint.size} records has {count} of the {quorum} witness "
                                   "cosignatures --audit-witness-quorum asks for")
    if checkpoint.size <= index:
        raise ProofUnavailable(f"record {audit_id} is row {row.seq}; the {'latest ' if wanted == 'latest' else ''}"
                               f"checkpoint covers {checkpoint.size} rows. A later checkpoint will cover it")
    leaf = tree.leaf_bytes(row)
    path = tree.inclusion_proof(index, checkpoint.size, store.tree_nodes)
    verify_inclusion(index, checkpoint.size, leaf_hash(leaf), path, checkpoint.root)
    return TlogProof(index, tuple(path), note, leaf)


def consistency(store: AuditStore, old: int, new: int) -> tuple[list[bytes], bytes, bytes]:
    """The RFC 9162 consistency proof from tree size ``old`` to ``new``, and both roots (checked)."""
    size = store.tree_size() or 0
    if not 0 <= old <= new <= size:
        raise ProofUnavailable(f"sizes must satisfy 0 <= from <= to <= {size} (the tree's size)")
    proof = tree.consistency_proof(old, new, store.tree_nodes)
    old_root, new_root = tree.root(old, store.tree_nodes), tree.root(new, store.tree_nodes)
    verify_consistency(old, new, proof, old_root, new_root)
    return proof, old_root, new_root
