"""The audit trail: one tamper-evident record per call, with its tokens (see docs/audit-format.md).

``records`` builds a record from a call, ``canonical`` serialises it (RFC 8785), ``chain`` hashes
and signs, ``sqlite_store`` and ``postgres_store`` keep them append-only, ``sink`` writes them off
the request path, ``verify`` and ``export`` read them back.
"""

FORMAT_V1 = "proctor.audit/1"  # the row hash covers seq, prev_hash and body; verify parses the body for the columns
FORMAT_V2 = "proctor.audit/2"  # the row hash also covers the filter columns (docs/audit-format.md)
FORMAT = FORMAT_V2  # what the writer writes; verify reads both
