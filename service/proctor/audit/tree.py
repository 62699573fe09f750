"""The Merkle tree (RFC 9162 §2.1) over the audit log: every row, in ``seq`` order, is leaf ``seq - 1``.

A leaf is the row's bytes exactly as the chain hashes them (``leaf_bytes``: the row head, a
newline, the stored body; docs/audit-format.md). The stores keep every node of a *complete*
subtree: ``(level, index)`` is the root of leaves ``[index·2^level, (index+1)·2^level)``, level 0
the leaf hashes. Complete subtrees never change as the log grows, so the table is append-only like
the rows. The root of any prefix, and any range a proof needs, is a fold over O(log n) of them
(``range_keys``), so a proof at a million records is a handful of indexed reads.

A node is stored under its post-order number (``node_id``): the count of nodes completed before it, so
each leaf and the nodes it completes take the next numbers, every insert appends to the table's B-tree
(keyed ``(level, index)``, every level was an insertion point: 3.0 against 2.2 µs a leaf in SQLite), and
verify reads the whole tree in one pass in stored order. The stores still take and answer ``(level, index)``
keys.

The writer keeps the tree with the rows (``CompactRange``: the border of the tree so far, the new
leaves, out come the newly complete nodes), in the same transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import cast

from proctor.audit import FORMAT_V3
from proctor.audit.canonical import canonical
from proctor.audit.chain import chained_format, row_hash, row_head
from proctor.audit.store import RawRow, Row
from proctor_client.tlog.merkle import EMPTY_ROOT, node_hash

Key = tuple[int, int]  # (level, index)
Node = tuple[int, int, bytes]
Lookup = Callable[[list[Key]], dict[Key, bytes]]


class TreeError(RuntimeError):
    """The stored tree is missing nodes or disagrees with the rows."""


def _leaf_head(row: Row | RawRow) -> tuple[bytes, bytes]:
    """The head the chain hashes before a row's body, and the body."""
    seq, audit_id, kind, time_ms, caller, request_id, finish, body, prev, hash_ = (
        row if isinstance(row, tuple) else (row.seq, row.audit_id, row.kind, row.time_ms, row.caller, row.request_id,
                                            row.finish_reason, row.body, row.prev_hash, row.hash))
    form = chained_format(body)
    head = row_head(seq, prev, kind, audit_id, time_ms, caller, request_id, finish, form)
    if form != FORMAT_V3 and row_hash(seq, prev, kind, audit_id, time_ms, caller, request_id, finish,
                                      body) != hash_:
        head = canonical({"seq": seq, "prev": prev}) + b"\n"  # a v1 row (or a tampered one: verify names it)
    return head, body


def leaf_bytes(row: Row | RawRow) -> bytes:
    """The row as the chain hashes it: a ``proctor.audit/2``/``3`` row's head and body; a ``/1`` row's
    ``canonical({"seq", "prev"})``, a newline and its body."""
    head, body = _leaf_head(row)
    return head + body


def row_leaf_hash(row: Row | RawRow) -> bytes:
    """``sha256(0x00 || leaf_bytes(row))``, without copying the body behind the head."""
    head, body = _leaf_head(row)
    digest = hashlib.sha256(b"\x00" + head)
    digest.update(body)
    return digest.digest()


def head_digests(head: bytes, body: bytes) -> tuple[str, bytes]:
    """A v2/v3 row's chain hash (hex) and leaf hash from its head and stored body, the body hashed in place
    (the writer's and verify's inner loops)."""
    chain = hashlib.sha256(head)
    chain.update(body)
    leaf = hashlib.sha256(b"\x00" + head)
    leaf.update(body)
    return chain.hexdigest(), leaf.digest()


def hashed_page(rows: list[RawRow]) -> tuple[list[str | None], list[bytes]]:
    """Each row's v2/v3 chain hash (None for a column of a type no honest row has) and its leaf hash, the
    row head built once for both (verify's inner loop)."""
    digests: list[str | None] = []
    leaves: list[bytes] = []
    for row in rows:
        seq, audit_id, kind, time_ms, caller, request_id, finish, body, prev, hash_ = row
        try:
            head = row_head(seq, prev, kind, audit_id, time_ms, caller, request_id, finish, chained_format(body))
        except (TypeError, ValueError):
            digests.append(None)
            leaves.append(b"")
            continue
        digest, leaf = head_digests(head, body)
        digests.append(digest)
        if digest != hash_ and chained_format(body) != FORMAT_V3:  # a v1 row: its leaf is its v1 input
            leaf = hashlib.sha256(b"\x00" + canonical({"seq": seq, "prev": prev}) + b"\n" + body).digest()
        leaves.append(leaf)
    return digests, leaves


def first_problem(*problems: tuple[int, str] | None) -> tuple[int, str] | None:
    """The problem at the lowest row (the chain's and the tree's checks of one page)."""
    found = [p for p in problems if p is not None]
    return min(found, key=lambda p: p[0]) if found else None


def leaf_problem(rows: list[RawRow], leaves: list[bytes], stored: list[bytes]) -> tuple[int, str] | None:
    """The first row whose leaf hash is not the stored tree's (``stored``: level 0 from the page's first row
    on; rows past its end are the size check's, ``verify_tree``)."""
    for row, leaf, node in zip(rows, leaves, stored, strict=False):
        if node != leaf:
            return row[0], "the Merkle tree's leaf for this row does not match the row (a tree node was modified)"
    return None


def border_keys(size: int) -> list[Key]:
    """The complete subtrees that make up leaves ``[0, size)``, largest first (the compact range)."""
    return range_keys(0, size)


def range_keys(start: int, end: int) -> list[Key]:
    """The complete subtrees making up ``[start, end)`` where ``start`` is a multiple of a power of two
    at least ``end - start`` (every range RFC 9162's proofs hash is one), largest first."""
    keys: list[Key] = []
    offset, left = start, end - start
    for level in range(left.bit_length() - 1, -1, -1):
        if left >> level & 1:
            keys.append((level, offset >> level))
            offset += 1 << level
    return keys


def range_hash(start: int, end: int, nodes: dict[Key, bytes]) -> bytes:
    """RFC 9162's MTH of leaves ``[start, end)``: its complete subtrees folded from the right."""
    keys = range_keys(start, end)
    if not keys:
        return EMPTY_ROOT
    try:
        digest = nodes[keys[-1]]
        for key in reversed(keys[:-1]):
            digest = node_hash(nodes[key], digest)
    except KeyError as exc:
        raise TreeError(f"the stored tree lacks node {exc.args[0]} (level, index)") from None
    return digest


class CompactRange:
    """The tree's right border (the complete subtrees of ``border_keys(size)``) as leaves are appended:
    the writer's view of the tree inside one write transaction. ``nodes`` collects every node that
    became complete, for the store to insert beside the rows."""

    def __init__(self, size: int, border: list[bytes]) -> None:
        self.size = size
        self._stack = [(level, digest) for (level, _), digest in zip(border_keys(size), border, strict=True)]
        self.nodes: list[Node] = []

    def append(self, digest: bytes) -> None:
        """Append one leaf hash."""
        index = self.size
        self.nodes.append((0, index, digest))
        level, merged = 0, digest
        while self._stack and self._stack[-1][0] == level:
            merged = node_hash(self._stack.pop()[1], merged)
            level += 1
            self.nodes.append((level, index >> level, merged))
        self._stack.append((level, merged))
        self.size += 1

    def extend(self, leaves: list[bytes]) -> None:
        """Append many leaf hashes at once, level by level (the first-start build: the same nodes as ``append``
        leaf by leaf, a third of the Python work)."""
        border = dict(self._stack)
        level, start, items = 0, self.size, list(leaves)
        unpaired: dict[int, bytes] = {}
        while items:
            self.nodes.extend((level, start + i, digest) for i, digest in enumerate(items))
            if start & 1:  # the first node's left sibling is this level's border node (stored already)
                items.insert(0, border.pop(level))
                start -= 1
            if len(items) & 1:  # the last node waits for its right sibling: this level's new border
                unpaired[level] = items.pop()
            items = [node_hash(items[i], items[i + 1]) for i in range(0, len(items), 2)]
            level, start = level + 1, start >> 1
        kept = {lvl: digest for lvl, digest in border.items() if lvl >= level}  # nothing reached them
        self._stack = sorted({**kept, **unpaired}.items(), reverse=True)
        self.size += len(leaves)

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        digest = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            digest = node_hash(left, digest)
        return digest


def root(size: int, lookup: Lookup) -> bytes:
    keys = range_keys(0, size)
    return range_hash(0, size, lookup(keys))


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """RFC 9162 §2.1.3.1 PATH(index, D[size]) as the leaf ranges whose hashes it lists, leaf side first."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size} leaves")
    ranges: list[tuple[int, int]] = []
    start, end = 0, size
    while end - start > 1:
        k = 1 << ((end - start - 1).bit_length() - 1)  # the largest power of two below the length
        if index < start + k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
    return ranges[::-1]


def consistency_ranges(old: int, new: int) -> list[tuple[int, int]]:
    """RFC 9162 §2.1.4.1 PROOF(old, D[new]) as leaf ranges, in the proof's order."""
    if not 0 < old <= new:
        raise ValueError(f"no consistency proof from {old} leaves to {new}")
    ranges: list[tuple[int, int]] = []
    start, end, m, whole = 0, new, old, True  # m: the old tree's leaves inside [start, end)
    while m != end - start:
        k = 1 << ((end - start - 1).bit_length() - 1)
        if m <= k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start, m, whole = start + k, m - k, False
    if not whole:
        ranges.append((start, end))
    return ranges[::-1]


def proof_hashes(ranges: list[tuple[int, int]], lookup: Lookup) -> list[bytes]:
    """The hashes of ``ranges``, every node they need fetched in one ``lookup``."""
    keys = sorted({key for start, end in ranges for key in range_keys(start, end)})
    nodes = lookup(keys)
    return [range_hash(start, end, nodes) for start, end in ranges]


def inclusion_proof(index: int, size: int, lookup: Lookup) -> list[bytes]:
    return proof_hashes(inclusion_ranges(index, size), lookup)


def consistency_proof(old: int, new: int, lookup: Lookup) -> list[bytes]:
    return [] if old in (0, new) else proof_hashes(consistency_ranges(old, new), lookup)


# --- the stores' side: the same SQL on SQLite ("?") and PostgreSQL ("%s") -----------------------
Fetch = Callable[[str, list[object]], list[tuple[object, ...]]]
TABLE = "audit_tree_nodes"  # (id: node_id, hash)
SIZE_SQL = f"SELECT COALESCE(MAX(id) + 1, 0) FROM {TABLE}"  # the nodes stored: leaves_for(...) of it
CATCH_UP_ROWS = 2000  # rows read per query when the tree catches up with the log
IN_LIST = 4000  # ids per query (within SQLite's and PostgreSQL's parameter limits)


def node_id(level: int, index: int) -> int:
    """The post-order number of node ``(level, index)``: it completes with leaf ``m - 1``, m = (index+1)·2^level,
    after which ``2m - popcount(m)`` nodes exist; the last is at level ``tz(m)`` and the lower ones just before it."""
    m = (index + 1) << level
    return 2 * m - m.bit_count() - 1 - ((m & -m).bit_length() - 1 - level)


def nodes_for(leaves: int) -> int:
    """The complete subtrees of ``leaves`` leaves: ``2n - popcount(n)``."""
    return 2 * leaves - leaves.bit_count()


def leaves_for(nodes: int) -> int:
    """The most leaves whose complete subtrees number at most ``nodes`` (``nodes_for`` grows by 1 or more a leaf)."""
    low, high = nodes // 2, nodes // 2 + 64
    while low < high:  # the largest n with nodes_for(n) <= nodes; nodes_for(n) >= 2n - 64
        mid = (low + high + 1) // 2
        low, high = (mid, high) if nodes_for(mid) <= nodes else (low, mid - 1)
    return low


def post_order(first_leaf: int, leaves: int) -> Iterator[Key]:
    """The nodes that leaves ``first_leaf``..``first_leaf + leaves - 1`` complete, in stored (id) order."""
    for leaf in range(first_leaf, first_leaf + leaves):
        yield 0, leaf
        m = leaf + 1
        for level in range(1, (m & -m).bit_length()):
            yield level, (m >> level) - 1


def tree_size(nodes: int) -> int:
    """Leaves in a stored tree of ``nodes`` nodes; ``TreeError`` when it ends inside a leaf's nodes."""
    size = leaves_for(nodes)
    if nodes_for(size) != nodes:
        raise TreeError(f"the stored Merkle tree ends inside the nodes of leaf {size} (a node was removed)")
    return size


def stored(nodes: list[Node]) -> list[tuple[int, bytes]]:
    """``CompactRange.nodes`` as the table's rows, in id order (the insert appends)."""
    return sorted((node_id(level, index), digest) for level, index, digest in nodes)


def insert_sql(placeholder: str) -> str:
    return f"INSERT INTO {TABLE} (id, hash) VALUES ({placeholder}, {placeholder})"


def fetch_nodes(fetch: Fetch, keys: list[Key], placeholder: str) -> dict[Key, bytes]:
    """The stored nodes among ``keys`` (absent ones are absent from the answer)."""
    by_id = {node_id(*key): key for key in keys}
    ids = sorted(by_id)
    found: dict[Key, bytes] = {}
    for start in range(0, len(ids), IN_LIST):
        part = ids[start:start + IN_LIST]
        marks = ", ".join([placeholder] * len(part))
        for id_, digest in fetch(f"SELECT id, hash FROM {TABLE} WHERE id IN ({marks})", list(part)):
            found[by_id[int(str(id_))]] = bytes(cast(bytes, digest))
    return found


def node_count(fetch: Fetch) -> int:
    """The nodes stored (``leaves_for`` of it: the tree's size)."""
    return int(str(fetch(SIZE_SQL, [])[0][0]))


def fetch_span(fetch: Fetch, first_id: int, last_id: int, placeholder: str) -> list[tuple[int, bytes]]:
    """The stored nodes with ids ``first_id``..``last_id``, in id order."""
    return [(int(str(id_)), bytes(cast(bytes, digest)))
            for id_, digest in fetch(f"SELECT id, hash FROM {TABLE} WHERE id >= {placeholder} AND id <= {placeholder} "
                                     "ORDER BY id", [first_id, last_id])]


def fetch_leaves(fetch: Fetch, first: int, count: int, placeholder: str) -> list[bytes]:
    """The stored leaves among ``first``..``first + count - 1`` in order, from one range read of the ids between
    them; a missing one is absent, so the ones after it move up (callers compare positions with rows)."""
    if count <= 0:
        return []
    wanted = [node_id(0, leaf) for leaf in range(first, first + count)]
    found = dict(fetch_span(fetch, wanted[0], wanted[-1], placeholder))
    return [found[id_] for id_ in wanted if id_ in found]


def open_range(fetch: Fetch, head_seq: int, placeholder: str, columns: str) -> CompactRange:
    """The tree's compact range read inside the writer's transaction, caught up with the log's ``head_seq``
    rows first (a log written before the tree existed, or by a server without it)."""
    size = tree_size(node_count(fetch))
    if size > head_seq:
        raise TreeError(f"the Merkle tree has {size} leaves but the log only {head_seq} rows (rows were removed)")
    keys = border_keys(size)
    nodes = fetch_nodes(fetch, keys, placeholder)
    missing = [key for key in keys if key not in nodes]
    if missing:
        raise TreeError(f"the stored Merkle tree lacks node {missing[0]} (level, index) of its border")
    compact = CompactRange(size, [nodes[key] for key in keys])
    while compact.size < head_seq:
        rows = fetch(f"SELECT {columns} FROM audit_log WHERE seq > {placeholder} AND seq <= {placeholder} "
                     "ORDER BY seq", [compact.size, min(head_seq, compact.size + CATCH_UP_ROWS)])
        if not rows:
            raise TreeError(f"row {compact.size + 1} is missing from the log; the tree cannot grow past it")
        for raw in rows:
            if int(str(raw[0])) != compact.size + 1:
                raise TreeError(f"row {compact.size + 1} is missing from the log; the tree cannot grow past it")
            compact.append(row_leaf_hash(raw))  # type: ignore[arg-type]
    return compact
