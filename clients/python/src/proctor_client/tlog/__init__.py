"""Transparency-log proofs checked offline: RFC 9162 Merkle proofs, C2SP signed notes, checkpoints,
cosignatures and ``tlog-proof`` files (no server, no store, no torch).

``merkle`` verifies inclusion and consistency proofs, ``note`` signs and verifies notes and
checkpoints, ``proof`` reads, writes and checks ``c2sp.org/tlog-proof@v1`` files.
"""
