"""Who read the log: one ``access`` record for every call to the Audit service, let through or refused.

The audit trail is evidence, so reading it is an event the trail itself must show (CloudTrail's data events; SEC
17a-4 asks who did what to the record). The server gate (api/gate.py) hands every ``/proctor.v1.Audit/`` call here
when it ends: the caller (as the generation records name one), the method, what it asked for (the request message:
a record's id, an export's filters, a tree size), how many records or proofs it returned, and its status (a caller
without ``audit:read`` gets no data, and its refusal is recorded). The record goes to the writer like any other and
is chained, checkpointed and proved like any other (audit/kinds.py); ``proctor audit export --kind access`` lists them.

The call does not wait for its access record: a read is answered while its record is queued (the writer commits
it within its next batch). Reads made directly on the database file by ``proctor audit`` are the operator's and
leave no access record (docs/compliance.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from proctor.api.audit_trail import caller_identity, new_audit_id
from proctor.api.grpc_calls import call_info_of
from proctor.audit import FORMAT
from proctor.audit.kinds import ACCESS
from proctor.audit.sink import AuditSink, AuditUnavailable

log = logging.getLogger("proctor.audit")
AUDIT_SERVICE = "/proctor.v1.Audit/"


class AccessLog:
    """Appends the access records to ``sink`` (the gate's ``AccessRecorder``)."""

    def __init__(self, sink: AuditSink) -> None:
        self.sink = sink

    def watches(self, method: str) -> bool:
        return method.startswith(AUDIT_SERVICE)

    def record(self, method: str, request: Any, context: grpc.aio.ServicerContext, returned: int,
               error: BaseException | None) -> None:
        """Queue the access record of a finished call (``returned``: the messages it answered with)."""
        sink = self.sink
        body = {"format": FORMAT, "kind": ACCESS, "audit_id": new_audit_id(), "time_ms": int(time.time() * 1000),
                "caller": caller_identity(call_info_of(context)), "method": method.removeprefix(AUDIT_SERVICE),
                "target": _target(request), "returned": returned, "status": _status(context, error)}
        try:
            if sink.try_submit(body) is None:  # a full queue: off the loop, so no call waits on it
                asyncio.get_running_loop().run_in_executor(None, sink.submit, body)
        except AuditUnavailable as exc:
            log.error("access record of %s not written: %s", method, exc)


def _target(request: Any) -> dict[str, Any]:
    """What the call asked for: its request message's set fields (``{}`` for one that did not decode)."""
    if request is None or not hasattr(request, "DESCRIPTOR"):
        return {}
    return dict(MessageToDict(request, preserving_proto_field_name=True))


def _status(context: grpc.aio.ServicerContext, error: BaseException | None) -> dict[str, str]:
    if error is None:
        return {"code": "OK", "message": ""}
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        details = context.details() if hasattr(context, "details") else ""
        return {"code": code.name, "message": str(details or "")}
    if isinstance(error, asyncio.CancelledError):
        return {"code": "CANCELLED", "message": "the caller went away"}
    return {"code": "UNKNOWN", "message": f"{type(error).__name__}: {error}"}
