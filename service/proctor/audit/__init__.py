"""The audit trail: one tamper-evident record per call, with its tokens (see docs/audit-format.md).

``records`` builds a record from a call, ``chain`` hashes and signs, ``sqlite_store`` and
``postgres_store`` keep them append-only, ``sink`` writes them off the request path, ``verify``
and ``export`` read them back.
"""

FORMAT = "proctor.audit/1"
