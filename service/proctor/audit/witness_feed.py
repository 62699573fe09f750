"""The log's side of c2sp.org/tlog-witness: each new signed checkpoint posted to the witnesses of
``--audit-witness-url``, and the cosignatures they answer kept with it once they verify against ``--audit-witnesses``.

Per witness, the feed remembers the size it last cosigned (in memory: a restarted server starts from 0, and the
witness's 409 says its size, from which the feed sends the consistency proof at once). Answers, as the spec defines
them: 200 the cosignature lines (each checked and kept: ``/tlog/checkpoint``, ``GetCheckpoint`` and every proof in
that checkpoint then carry it); 409 the witness's size (resync); 422 the witness holds a checkpoint of this log that
this one is not consistent with (a forked or rolled-back log: an alert); 403 it does not trust this log's key; 404 it
does not know this origin; anything else, or no answer, is retried with a growing pause (up to ``MAX_BACKOFF_S``).
Every answer is counted by witness and outcome (observability/metrics.py), and the last cosigned size and time kept
as gauges, so an alert sees a witness that stopped answering.
"""

from __future__ import annotations

import base64
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from proctor.audit.proofs import CosignatureRefused, ProofUnavailable, add_cosignature, checkpoint_note, consistency
from proctor.audit.store import AuditStore
from proctor_client.tlog.note import NoteError, Verifier, parse_checkpoint, parse_note, parse_vkey

log = logging.getLogger("proctor.audit.witness")
WITNESS_FEED_S = 1.0  # how often the server looks for a checkpoint a witness has not cosigned yet
TIMEOUT_S = 10.0
MAX_BACKOFF_S = 300.0
SIZE_TYPE = "text/x.tlog.size"


class WitnessObserver(Protocol):
    def witness_answer(self, witness: str, outcome: str) -> None: ...

    def witness_cosigned(self, witness: str, size: int, at_s: float) -> None: ...


@dataclass
class _Witness:
    url: str  # the submission prefix
    size: int = 0  # the size it last cosigned, as far as this process knows
    retry_at: float = 0.0
    backoff_s: float = 0.0


class WitnessFeed:
    """Run ``run_once`` every second or so (audit/periodic.py): it posts the latest checkpoint to every witness that has
    not cosigned it yet and whose pause is over."""

    def __init__(self, store: AuditStore, urls: tuple[str, ...], witness_vkeys: tuple[str, ...],
                 observer: WitnessObserver | None = None, *, timeout_s: float = TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._witnesses = [_Witness(url.rstrip("/")) for url in urls]
        self._vkeys = witness_vkeys
        self._verifiers: list[Verifier] = [parse_vkey(vkey) for vkey in witness_vkeys]
        self._observer = observer
        self._timeout_s = timeout_s
        self._clock = clock

    def run_once(self) -> None:
        row = self._store.last_checkpoint()
        while row is not None and checkpoint_note(row) is None:
            row = self._store.last_checkpoint(row.seq)
        if row is None:
            return
        note = checkpoint_note(row)
        assert note is not None
        size = parse_checkpoint(parse_note(note).text).size
        now = self._clock()
        for witness in self._witnesses:
            if witness.size != size and now >= witness.retry_at:
                self._post(witness, size, note)

    def _post(self, witness: _Witness, size: int, note: str, resynced: bool = False) -> None:
        outcome, status, text = "unreachable", 0, ""
        try:
            if witness.size > size:
                outcome = "ahead"
                log.error("witness %s cosigned %d records of this log, more than its latest checkpoint (%d): "
                          "a log restored from an older copy, or a second log with this key", witness.url,
                          witness.size, size)
            else:
                status, text = self._send(witness.url, self._body(witness.size, size, note))
                outcome = self._answered(witness, size, status, text)
        except (OSError, ProofUnavailable, ValueError) as exc:
            log.warning("witness %s: %s", witness.url, exc)
        if self._observer is not None:
            self._observer.witness_answer(witness.url, outcome)
        if outcome == "conflict" and not resynced and witness.size <= size:
            self._post(witness, size, note, resynced=True)  # from the size it named, at once
            return
        if outcome in ("cosigned", "conflict"):
            witness.backoff_s, witness.retry_at = 0.0, 0.0
        else:
            witness.backoff_s = min(MAX_BACKOFF_S, max(1.0, 2 * witness.backoff_s))
            witness.retry_at = self._clock() + witness.backoff_s

    def _body(self, old: int, size: int, note: str) -> bytes:
        proof = consistency(self._store, old, size)[0] if 0 < old < size else []
        return (f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof) + "\n" + note).encode()

    def _send(self, url: str, body: bytes) -> tuple[int, str]:
        request = urllib.request.Request(url + "/add-checkpoint", data=body, method="POST",
                                         headers={"Content-Type": "text/plain; charset=utf-8"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as answer:
                return int(answer.status), answer.read(64 * 1024).decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return int(error.code), error.read(64 * 1024).decode("utf-8", "replace")

    def _answered(self, witness: _Witness, size: int, status: int, text: str) -> str:
        if status == 200:
            kept = self._keep(size, text)
            if not kept:
                log.error("witness %s answered no cosignature of a key in --audit-witnesses: %r", witness.url,
                          text[:300])
                return "unverified"
            witness.size = size
            if self._observer is not None:
                self._observer.witness_cosigned(witness.url, size, time.time())
            return "cosigned"
        if status == 409:
            named = text.strip()
            if not named.isdigit():
                raise ValueError(f"a 409 whose body is not a tree size: {text[:100]!r}")
            log.info("witness %s last cosigned %s records of this log: resyncing from there", witness.url, named)
            witness.size = int(named)
            return "conflict"
        outcome = {422: "inconsistent", 403: "forbidden", 404: "unknown-log", 400: "bad-request"}.get(status, "error")
        level = logging.ERROR if status in (422, 403, 404, 400) else logging.WARNING
        log.log(level, "witness %s refused the checkpoint of %d records (HTTP %d): %s", witness.url, size, status,
                text.strip()[:300])
        return outcome

    def _keep(self, size: int, text: str) -> int:
        """Keep every line of the answer that is a valid cosignature by one of the allowed witnesses; how many."""
        kept = 0
        for line in (line for line in text.split("\n") if line.strip()):
            for verifier in self._verifiers:
                if not line.startswith(f"\u2014 {verifier.name} "):
                    continue
                try:
                    add_cosignature(self._store, size, verifier.vkey(), line, self._vkeys)
                    kept += 1
                    break
                except (CosignatureRefused, NoteError, ProofUnavailable):
                    continue  # another key of the same name, or not a valid line: ignored, as the spec says
        return kept
