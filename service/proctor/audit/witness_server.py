"""``proctor audit witness --listen``: the witness role of c2sp.org/tlog-witness, ``POST /add-checkpoint``.

A log (Proctor's, or any C2SP log whose key this witness is given) posts its new checkpoint with the size this witness
last cosigned and the RFC 6962 consistency proof from it. The checks go in the spec's order, each with its status:
a body that is not ``old N``, proof lines, a blank line and a checkpoint is 400; an origin this witness does not know
404; no valid signature of the log's key (or one of its lines that does not verify) 403; an old size past the
checkpoint's 400; an old size that is not the one last cosigned 409 (body: that size, ``text/x.tlog.size``); a
size-zero checkpoint whose root is not the empty tree's, a proof from size zero, two roots for one size or a proof
that does not verify 422. Then the new checkpoint is written to the state directory (the same files the pull
rounds of audit/witness.py keep, replaced atomically) before the cosignature/v1 line is answered. The check and the
write are one critical section per witness process, so two requests racing cannot roll the state back.

Ed25519 cosignatures (cosignature/v1, vkey type 0x04), as the pull rounds sign. The spec recommends ML-DSA-44 (type
0x06): it would be a second ``Signer`` kind beside ``COSIGNATURE_V1`` in proctor_client/tlog/note.py, answered as a
second line here; no maintained Python ML-DSA implementation was available to this project when this was written.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proctor.audit.witness import last_seen, remember, state_file
from proctor_client.tlog.merkle import EMPTY_ROOT, ProofError, verify_consistency
from proctor_client.tlog.note import NoteError, Signer, Verifier, parse_checkpoint, parse_note, signed_by

log = logging.getLogger("proctor.witness")
MAX_PROOF_LINES = 63  # the spec: a client sends no more
SIZE_TYPE = "text/x.tlog.size"
TEXT_TYPE = "text/plain; charset=utf-8"
MAX_BODY_BYTES = 64 * 1024  # 63 hashes and a checkpoint with a few dozen signatures fit many times over


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    text: str
    media_type: str = TEXT_TYPE
    outcome: str = ""  # the metric label: cosigned, conflict, bad-request, unknown-log, forbidden, inconsistent


class WitnessService:
    """One witness key over the logs it knows (origin → the log's note verifier), its state under ``state``."""

    def __init__(self, logs: dict[str, Verifier], signer: Signer, state: Path,
                 clock: Callable[[], float] = time.time) -> None:
        self._logs, self._signer, self._state, self._clock = logs, signer, state, clock
        self._lock = threading.Lock()

    def add_checkpoint(self, body: bytes) -> Answer:
        try:
            old, proof, note_text = _parse_request(body)
            checkpoint = parse_checkpoint(note_text.partition("\n\n")[0] + "\n")
        except (ValueError, NoteError) as exc:
            return Answer(400, f"malformed request: {exc}\n", outcome="bad-request")
        verifier = self._logs.get(checkpoint.origin)
        if verifier is None:
            return Answer(404, f"this witness does not know the log {checkpoint.origin!r}\n", outcome="unknown-log")
        try:  # the spec: no valid signature of the log's key, or a malformed one of it, is 403
            note = parse_note(note_text)
            signed = signed_by(note, verifier) is not None
        except NoteError as exc:
            return Answer(403, f"{exc}\n", outcome="forbidden")
        if not signed:
            return Answer(403, f"the checkpoint carries no signature of {checkpoint.origin}'s key\n",
                          outcome="forbidden")
        if old > checkpoint.size:
            return Answer(400, f"old size {old} is past the checkpoint's {checkpoint.size}\n", outcome="bad-request")
        path = state_file(self._state, checkpoint.origin)
        with self._lock:
            seen = last_seen(path)
            seen_size, seen_root = (seen.size, seen.root) if seen is not None else (0, EMPTY_ROOT)
            if old != seen_size:
                return Answer(409, f"{seen_size}\n", SIZE_TYPE, outcome="conflict")
            problem = _inconsistency(old, checkpoint.size, proof, seen_root, checkpoint.root)
            if problem:
                log.warning("refused %s at %d records (from %d): %s", checkpoint.origin, checkpoint.size, old, problem)
                return Answer(422, f"{problem}\n", outcome="inconsistent")
            remember(path, note.text)  # persisted before the cosignature leaves
        line = self._signer.signature_line(note.text, int(self._clock()))
        log.info("cosigned %s at %d records", checkpoint.origin, checkpoint.size)
        return Answer(200, line if line.endswith("\n") else line + "\n", outcome="cosigned")


def _parse_request(body: bytes) -> tuple[int, list[bytes], str]:
    """``old N``, up to 63 base64 hash lines, a blank line, then the checkpoint note."""
    text = body.decode("utf-8")
    head, blank, note = text.partition("\n\n")
    if not blank:
        raise ValueError("no blank line between the proof and the checkpoint")
    lines = head.split("\n")
    size_text = lines[0].removeprefix("old ")
    if lines[0] == size_text or not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
        raise ValueError("the first line must be 'old <size>' in decimal with no leading zeroes")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise ValueError(f"{len(lines) - 1} proof lines (at most {MAX_PROOF_LINES})")
    try:
        proof = [base64.b64decode(line, validate=True) for line in lines[1:]]
    except binascii.Error as exc:
        raise ValueError(f"a proof line is not base64: {exc}") from None
    if any(len(digest) != 32 for digest in proof):
        raise ValueError("a proof line is not a 32-byte hash")
    return int(size_text), proof, note


def _inconsistency(old: int, size: int, proof: list[bytes], old_root: bytes, root: bytes) -> str:
    """Why the checkpoint is not consistent with the one cosigned (empty when it is), the spec's 422 cases."""
    if size == 0 and root != EMPTY_ROOT:
        return "a checkpoint of size 0 must carry the empty tree's root"
    if old == 0:
        return "a proof from size 0 must be empty" if proof else ""
    if old == size:
        return "" if root == old_root else f"two different roots for {size} records: the log was forked or rewritten"
    try:
        verify_consistency(old, size, proof, old_root, root)
    except ProofError as exc:
        return f"the consistency proof from {old} to {size} records does not verify: {exc}"
    return ""
