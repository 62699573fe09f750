"""The kinds of rows the log holds, and the filter columns each fills: one home for both.

- ``request``: one call through the generation API (api/audit_trail.py), whatever its outcome.
- ``access``: one call to the Audit service, which reads the log (api/access_log.py): who read what, and whether
  they were let (the trail of the trail, as CloudTrail's data events).
- ``erasure``: keys destroyed (audit/erasure.py, audit/retention.py): who, when, which subject, how many records,
  why.
- ``hold`` and ``release``: a legal hold placed on a subject, a caller or a time range, and its end
  (audit/holds.py): erasure and retention leave what a hold covers alone.
- ``checkpoint``: the writer's signed checkpoint over every row before it (audit/sink.py).

Every row, whatever its kind, is a link of the chain and a leaf of the Merkle tree.
"""

from __future__ import annotations

from typing import Any

from proctor.audit import FORMAT
from proctor.audit.records import finish_reason_of

REQUEST, ACCESS, ERASURE, HOLD, RELEASE = "request", "access", "erasure", "hold", "release"
CHECKPOINT = "checkpoint"
RECORD_KINDS = (REQUEST, ACCESS, ERASURE, HOLD, RELEASE)  # what the writer takes from its callers
KINDS = (*RECORD_KINDS, CHECKPOINT)

Columns = tuple[str, str, int, str, str, str]  # kind, audit_id, time_ms, caller, request_id, finish_reason


def filter_columns(body: dict[str, Any]) -> Columns:
    """The columns a record's row copies from it (what export filters on). ``KeyError``/``TypeError``/``ValueError``
    for a record that lacks them."""
    kind = body.get("kind")
    if body.get("format") != FORMAT or kind not in RECORD_KINDS:
        raise ValueError(f"this writer writes {FORMAT} records of kinds {', '.join(RECORD_KINDS)}, not "
                         f"{body.get('format')!r} {kind!r}")
    if kind != REQUEST:
        return kind, str(body["audit_id"]), int(body["time_ms"]), str(body["caller"]["identity"]), "", ""
    return (REQUEST, str(body["audit_id"]), int(body["received_ms"]), str(body["caller"]["identity"]),
            str(body["request_id"]), finish_reason_of(body))
