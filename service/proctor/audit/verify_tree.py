"""``proctor audit verify``'s checks of the Merkle tree, after the chain walk has checked every row and
every leaf against its row (audit/verify.py, audit/verify_parallel.py).

- The tree has exactly one leaf per row: none missing, none past the log's end.
- Every interior node is stored and is the hash of its two children (one pass in stored order).
- Every checkpoint's signed note (its signature already checked in the walk) names the root of the
  tree of the rows before it, and each is consistent with the next (an RFC 9162 consistency proof
  built from the stored nodes and checked as a third party would, with ``proctor_client.tlog``).
"""

from __future__ import annotations

from proctor.audit import tree
from proctor.audit.store import AuditStore
from proctor_client.tlog.merkle import ProofError, node_hash, verify_consistency
from proctor_client.tlog.note import parse_checkpoint, parse_note

SPAN_NODES = 16384  # nodes read per query


def tree_problem(store: AuditStore, rows: int, notes: dict[int, str]) -> tuple[int, str] | None:
    """(first row concerned, what is wrong) or None when the tree over the ``rows`` rows walked is intact
    (or there is none yet and no checkpoint signed one: a log no server with the tree has opened)."""
    size = store.tree_size() or 0
    if not size and not notes:
        return None
    if size < rows:
        return size + 1, f"the Merkle tree has {size} leaves for {rows} rows: it misses the last rows' leaves"
    last = store.last()
    if size > (last.seq if last is not None else 0):  # rows appended while verifying are in the log too
        return rows + 1, f"the Merkle tree has {size} leaves, past the log's last row"
    return _interior_problem(store, rows) or _checkpoint_problem(store, notes)


def _interior_problem(store: AuditStore, size: int) -> tuple[int, str] | None:
    """Every node complete within the first ``size`` leaves is stored and is the hash of its two children: the
    nodes read in stored (post-order) order, each parent checked against the two border nodes before it."""
    border: list[bytes] = []
    expected = tree.post_order(0, size)
    total = tree.nodes_for(size)
    for first in range(0, total, SPAN_NODES):
        last = min(total, first + SPAN_NODES) - 1
        span = store.tree_span(first, last)
        for position, (level, index) in zip(range(first, last + 1), expected, strict=False):
            at = position - first
            if at >= len(span) or span[at][0] != position:
                return (index << level) + 1, (f"Merkle tree node (level {level}, index {index}) is missing "
                                              "(the tree was modified)")
            digest = span[at][1]
            if level:
                right, left = border.pop(), border.pop()
                if digest != node_hash(left, right):
                    return (index << level) + 1, (f"Merkle tree node (level {level}, index {index}) is not the hash "
                                                  "of its children (the tree was modified)")
            border.append(digest)
    return None


def _checkpoint_problem(store: AuditStore, notes: dict[int, str]) -> tuple[int, str] | None:
    previous: tuple[int, bytes] | None = None
    for size in sorted(notes):
        checkpoint = parse_checkpoint(parse_note(notes[size]).text)
        root = tree.root(size, store.tree_nodes)
        if checkpoint.root != root:
            return size + 1, (f"the checkpoint's signed root for {size} rows is not the Merkle tree's "
                              "(the log was rewritten after it was signed)")
        if previous is not None:
            old, old_root = previous
            try:
                verify_consistency(old, size, tree.consistency_proof(old, size, store.tree_nodes), old_root, root)
            except ProofError as exc:
                return size + 1, f"the checkpoints for {old} and {size} rows are not consistent: {exc}"
        previous = (size, root)
    return None
