"""The API's side of the audit trail: exactly one record per call, whatever its outcome.

``begin`` opens a record when a call arrives (audit id, server time, caller identity); the servicer
fills it as the call runs; ``commit`` submits it once. In compliance mode ``commit`` waits until
the record is durably written and raises ``AuditWriteFailed`` otherwise, so the caller gets an
error instead of unaudited output. With receipts (``--audit-receipts``, the default) an answered call
waits for its commit too, and gets the log's signed receipt (proctor_client.tlog.receipt): where the
record sits and the digests of its request and of the output answered. Without a sink (audit off)
every method is a no-op.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

from proctor.api.call_info import ASSERTED_CALLER, CallInfo
from proctor.api.failures import failure_of
from proctor.audit.keystore import KeyStore
from proctor.audit.receipts import ReceiptSigner
from proctor.audit.records import CallRecord, PrivacyPolicy, build_body, subject_of
from proctor.audit.sealing import seal
from proctor.audit.sink import AuditSink, AuditUnavailable, Committed
from proctor.domain import EngineFault, ShuttingDown
from proctor.observability.calls import AUDIT_COMMIT, bind_call, stage
from proctor_client.tlog.receipt import Receipt

MODEL_FIELDS = ("model_id", "weights_sha256", "tokenizer_sha256", "dtype", "weights", "weights_revision",
                "sampler_revision", "closing_revision", "device", "prefill_chunk_tokens", "batch_invariant",
                "model_signature", "model_signer")
ASSERTED = "metadata (asserted by the client)"
DEADLINE_SLACK_S = 0.05  # gRPC cancels a call at its deadline; a cancel this close to it is the deadline
# Receipts of records committed within this window are signed together, one signature a group: under load the
# writer commits records in batches, and one signature for a batch keeps signing off its back (bench/receipts.py).
RECEIPT_WINDOW_S = 0.002


class AuditWriteFailed(EngineFault):
    """The record could not be committed: the output is withheld (INTERNAL)."""


class AuditStoreUnavailable(ShuttingDown):
    """Compliance mode while the store takes no records: a call is refused before it runs (UNAVAILABLE,
    so clients retry elsewhere or later) instead of failing after its tokens were generated."""


class AuditTrailDown(AuditWriteFailed, AuditStoreUnavailable):
    """The sink takes no record at all (its writer thread is gone, or it is closed): any output is withheld, and
    the call is answered UNAVAILABLE (retry on another replica), so a refusal stays a refusal, not INTERNAL."""


def new_audit_id() -> str:
    """Time-ordered (ms prefix) and unique: sorts like the log, and needs no coordination."""
    return f"{int(time.time() * 1000):013x}{uuid.uuid4().hex[:19]}"


def caller_identity(call: CallInfo) -> dict[str, str]:
    """Who called: the caller the gate authenticated, else (open mode) what the call itself shows.

    Open mode records a bearer token's fingerprint, a TLS client certificate name or the peer
    address. ``x-proctor-caller`` metadata is recorded too, always marked as asserted by the client.
    """
    metadata, peer = call.metadata, call.peer
    asserted = metadata.get(ASSERTED_CALLER)
    if call.identity is not None:
        found = {"identity": call.identity.caller.name, "source": f"authenticated ({call.identity.source})",
                 "peer": peer}
    elif metadata.get("authorization"):
        fingerprint = hashlib.sha256(metadata["authorization"].encode()).hexdigest()[:16]
        found = {"identity": f"token:{fingerprint}", "source": "authorization", "peer": peer}
    elif names := call.certificate.get("x509_common_name") or []:
        found = {"identity": names[0].decode(), "source": "tls", "peer": peer}
    elif asserted:
        return {"identity": asserted, "source": ASSERTED, "peer": peer}
    else:
        found = {"identity": peer, "source": "peer", "peer": peer}
    if asserted:
        found["asserted_caller"] = f"{asserted} ({ASSERTED})"
    return found


class AuditTrail:
    def __init__(self, sink: AuditSink | None, policy: PrivacyPolicy, *, compliance: bool, top_n: int,
                 receipts: bool = False, keys: KeyStore | None = None) -> None:
        self.sink = sink
        self.keys = keys  # --audit-encryption subject: each record's content sealed under its subject's key
        self.policy = policy
        self.compliance = compliance
        self.top_n = top_n
        self.receipts = receipts
        self._receipts: ReceiptSigner | None = None  # the log's key for receipts, made at the first
        self._unsigned: list[tuple[Receipt, asyncio.Future[str]]] = []  # receipts of records committed together
        self.model: dict[str, Any] = {}
        self.server: dict[str, Any] = {}  # server-side context of every call (version, server-wide ban list)

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def check_available(self) -> None:
        """Raise AuditStoreUnavailable in compliance mode while the store takes no records."""
        if self.compliance and self.sink is not None and not self.sink.alive:
            raise AuditStoreUnavailable("the audit writer has stopped; in compliance mode calls are refused "
                                        "(retry on another replica)")
        if self.compliance and self.sink is not None and not self.sink.store_healthy:
            raise AuditStoreUnavailable("the audit store is not taking records; in compliance mode calls are "
                                        "refused until it recovers (retry later or on another replica)")

    def begin(self, method: str, call: CallInfo) -> CallRecord:
        """Open the call's record (bound to the call's observation: its trace id, the per-call log line)."""
        return bind_call(CallRecord(audit_id=new_audit_id() if self.enabled else "", method=method,
                                    received_ms=int(time.time() * 1000), caller=caller_identity(call),
                                    model=self.model))

    async def commit(self, call: CallRecord, *, wait: bool | None = None, answered: str | None = None) -> None:
        """Submit the call's record (once). Waits for the commit in compliance mode (or when asked), and, with
        receipts, for a call answered with text ``answered``: then ``call.receipt`` is the log's signed receipt."""
        if self.sink is None or call.submitted:
            return
        receipt = self.receipts and answered is not None and wait is not False
        wait = True if receipt else wait
        call.submitted = True
        body = build_body(call, int(time.time() * 1000), self.policy)
        body["server"] = self.server
        try:
            with stage(AUDIT_COMMIT) as attributes:
                # sealing may make a subject's key of the day (files, synced): off the loop
                stored = await asyncio.to_thread(self._sealed, body, call) if self.keys is not None else body
                try:
                    future = self.sink.try_submit(stored)  # on the loop while the queue has room (no thread hop)
                    if future is None:
                        future = await asyncio.to_thread(self.sink.submit, stored)  # a full queue blocks, off the loop
                except AuditUnavailable as exc:
                    raise AuditTrailDown(f"{exc}: calls are refused (retry on another replica)") from exc
                attributes["proctor.audit.waited"] = bool(self.compliance if wait is None else wait)
                if attributes["proctor.audit.waited"]:
                    # A cancel here (the client left, the deadline passed) stops the wait, not the write.
                    committed = await asyncio.wrap_future(future)
                    if receipt and answered is not None:
                        call.receipt = await self.receipt(call.audit_id, body, committed, answered)
        except AuditTrailDown:
            raise
        except Exception as exc:
            raise AuditWriteFailed(f"the audit record could not be written, so the output is withheld: {exc}") from exc

    def _sealed(self, body: dict[str, Any], call: CallRecord) -> dict[str, Any]:
        """The record as stored: its content sealed under its subject's key of the day it arrived (the subject: the
        request's ``subject_id``, else the caller: records.subject_of)."""
        assert self.keys is not None
        caller = str(call.caller.get("identity", ""))
        subject = subject_of(call.request, call.caller, call.raw_request)
        day = time.strftime("%Y-%m-%d", time.gmtime(call.received_ms / 1000))
        key_id, key = self.keys.key_for(subject, day, caller)
        return seal(body, key_id, key)

    async def receipt(self, audit_id: str, body: dict[str, Any], committed: Committed, answered: str) -> str:
        """The log's signed receipt of record ``audit_id`` (``body``), committed as ``committed``, answered with
        ``answered`` (docs/audit-format.md "Receipts"). The receipts of the calls whose records committed within
        ``RECEIPT_WINDOW_S`` of this one are signed as one group, one signature for all of them."""
        if self._receipts is None:
            assert self.sink is not None
            self._receipts = ReceiptSigner(self.sink.signer)
        loop = asyncio.get_running_loop()
        signed: asyncio.Future[str] = loop.create_future()
        self._unsigned.append((self._receipts.receipt(audit_id, body, committed, answered), signed))
        if len(self._unsigned) == 1:  # the first of a group: the others committed with it join within the window
            loop.call_later(RECEIPT_WINDOW_S, self._sign_unsigned)
        return await signed

    def _sign_unsigned(self) -> None:
        unsigned, self._unsigned = self._unsigned, []
        assert self._receipts is not None
        try:
            notes = self._receipts.sign_all([receipt for receipt, _ in unsigned])
        except Exception as exc:  # each waiting call fails as its record's commit would
            for _, signed in unsigned:
                if not signed.done():
                    signed.set_exception(exc)
            return
        for (_, signed), note in zip(unsigned, notes, strict=True):
            if not signed.done():
                signed.set_result(note)

    def status_from(self, call: CallRecord, exc: BaseException) -> None:
        """Record how a failed call ended (the status name and message of api/failures.py's table)."""
        if isinstance(exc, asyncio.CancelledError):
            deadline = call.request.deadline if call.request is not None else None
            if deadline is not None and time.monotonic() >= deadline - DEADLINE_SLACK_S:
                call.status_code, call.status_message = "DEADLINE_EXCEEDED", "the call's deadline passed"
            else:
                call.status_code, call.status_message = "CANCELLED", "the client cancelled the call"
            return
        failure = failure_of(exc)
        call.status_code, call.status_message = failure.code, failure.message
