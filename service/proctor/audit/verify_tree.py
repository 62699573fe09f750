"""``proctor audit verify``'s checks of the Merkle tree, after the chain walk has checked every row and
every leaf against its row (audit/verify.py, audit/verify_parallel.py).

- The tree has exactly one leaf per row: none missing, none past the log's end.
- Every stored interior node is the hash of its two children, level by level.
- Every checkpoint's signed note (its signature already checked in the walk) names the root of the
  tree of the rows before it, and each is consistent with the next (an RFC 9162 consistency proof
  built from the stored nodes and checked as a third party would, with ``proctor_client.tlog``).
"""

from __future__ import annotations

from proctor.audit import tree
from proctor.audit.store import AuditStore
from proctor_client.tlog.merkle import ProofError, node_hash, verify_consistency
from proctor_client.tlog.note import parse_checkpoint, parse_note

LEVEL_PAGE = 8192  # parent nodes read per query


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
    """Every node complete within the first ``size`` leaves is the hash of its two children."""
    level = 1
    while size >> level:
        count = size >> level
        for first in range(0, count, LEVEL_PAGE):
            n = min(LEVEL_PAGE, count - first)
            parents = store.tree_level(level, first, n)
            children = store.tree_level(level - 1, 2 * first, 2 * n)
            for k in range(n):
                if k >= len(parents) or 2 * k + 1 >= len(children) \
                        or parents[k] != node_hash(children[2 * k], children[2 * k + 1]):
                    index = first + k
                    return (index << level) + 1, (f"Merkle tree node (level {level}, index {index}) is missing or "
                                                  "not the hash of its children (the tree was modified)")
        level += 1
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
