"""``proctor audit witness``: a separate process that watches a log and cosigns what it has checked.

Each round it fetches the log's latest signed checkpoint and checks the log's signature; then, against
the checkpoint it cosigned last (kept in ``--state``), that the log only grew: an RFC 9162 consistency
proof from that size to the new one, checked here. Only then it cosigns (C2SP ``tlog-cosignature``,
Ed25519, type 0x04) and hands the line back (``AddCosignature``); the log attaches it to that checkpoint
and to every proof in it. A checkpoint not consistent with one it saw (a rewritten or forked log, or
one that shrank) is refused: nothing is signed, the state is kept, and the refusal is logged, counted
(``proctor_witness_refusals_total``) and raised as ``proctor_witness_inconsistent`` = 1 for an alert.
It keeps refusing that log until an operator looks (the state is not moved past a fork).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proctor_client.tlog.merkle import ProofError, verify_consistency
from proctor_client.tlog.note import (
    COSIGNATURE_V1,
    Checkpoint,
    NoteError,
    Signer,
    Verifier,
    parse_checkpoint,
    parse_note,
    signed_by,
)

log = logging.getLogger("proctor.witness")


class LogView(Protocol):
    """What the witness asks of the log (``ProctorClient`` over gRPC)."""

    def checkpoint(self, tree_size: int = 0) -> object: ...  # with ``.note``

    def consistency_proof(self, from_size: int, to_size: int) -> object: ...  # with ``.hashes``

    def add_cosignature(self, tree_size: int, witness_vkey: str, signature_line: str) -> bool: ...


class Refused(Exception):
    """The log's checkpoint is not one this witness may cosign (``reason``: why, for the metric's label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Round:
    size: int
    cosigned: bool  # False: the log had not grown since the last round (nothing new to sign)


def witness_signer(key: Ed25519PrivateKey, name: str = "") -> Signer:
    from proctor.audit.chain import log_origin

    return Signer(name or log_origin(key.public_key(), "proctor.witness"), key, COSIGNATURE_V1)


def state_file(state: Path, origin: str) -> Path:
    return state / (origin.replace("/", "_").replace(":", "_") + ".checkpoint")


def witness_round(view: LogView, log_key: Verifier, signer: Signer, state: Path, now_s: float | None = None) -> Round:
    """One round: fetch, check, cosign, hand back, remember. ``Refused`` when the log must not be cosigned."""
    note_text = str(view.checkpoint(0).note)  # type: ignore[attr-defined]
    try:
        note = parse_note(note_text)
        checkpoint = parse_checkpoint(note.text)
    except NoteError as exc:
        raise Refused("malformed", f"the log's checkpoint is malformed: {exc}") from None
    if checkpoint.origin != log_key.name:
        raise Refused("origin", f"the checkpoint is {checkpoint.origin!r}'s, the log key {log_key.name!r}'s")
    try:
        if signed_by(note, log_key) is None:
            raise NoteError("it carries no signature of the log key")
    except NoteError as exc:
        raise Refused("signature", f"the checkpoint of {checkpoint.size} records is not the log's: {exc}") from None
    seen = last_seen(state_file(state, checkpoint.origin))
    if seen is not None:
        _check_growth(view, seen, checkpoint)
        if seen.size == checkpoint.size:
            return Round(checkpoint.size, False)
    line = signer.signature_line(note.text, int(time.time() if now_s is None else now_s))
    view.add_cosignature(checkpoint.size, signer.verifier.vkey(), line)
    remember(state_file(state, checkpoint.origin), note.text)
    log.info("cosigned %s at %d records", checkpoint.origin, checkpoint.size)
    return Round(checkpoint.size, True)


def _check_growth(view: LogView, seen: Checkpoint, now: Checkpoint) -> None:
    if now.size < seen.size:
        raise Refused("shrank", f"the log went back from {seen.size} to {now.size} records (a rollback or a fork)")
    if now.size == seen.size:
        if now.root != seen.root:
            raise Refused("fork", f"two different roots for {now.size} records: the log was rewritten or forked")
        return
    proof = list(view.consistency_proof(seen.size, now.size).hashes)  # type: ignore[attr-defined]
    try:
        verify_consistency(seen.size, now.size, proof, seen.root, now.root)
    except ProofError as exc:
        raise Refused("fork", f"the checkpoint of {now.size} records is not consistent with the one of "
                              f"{seen.size} this witness cosigned (the log was rewritten or forked): {exc}") from None


def last_seen(path: Path) -> Checkpoint | None:
    if not path.exists():
        return None
    return parse_checkpoint(path.read_text(encoding="utf-8"))


def remember(path: Path, text: str) -> None:
    """The cosigned checkpoint's text, replaced atomically (a crash leaves the old one or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
