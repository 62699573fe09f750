"""The audit trail: one tamper-evident record per call, with its tokens (see docs/audit-format.md).

``records`` builds a record from a call, ``canonical`` serialises it (RFC 8785), ``stored_body``
compresses it for the store, ``chain`` hashes and signs, ``sqlite_store`` and ``postgres_store``
keep them append-only, ``sink`` writes them off the request path, ``verify`` and ``export`` read
them back.
"""

FORMAT_V1 = "proctor.audit/1"  # the row hash covers seq, prev_hash and body; verify parses the body for the columns
FORMAT_V2 = "proctor.audit/2"  # the row hash also covers the filter columns (docs/audit-format.md)
FORMAT_V3 = "proctor.audit/3"  # as v2, the body stored as a zstd frame of the canonical JSON, hashed as stored
FORMAT = FORMAT_V3  # what the writer writes; verify reads all three
FORMATS = (FORMAT_V1, FORMAT_V2, FORMAT_V3)
