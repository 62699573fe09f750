"""The first-start build of the Merkle tree over a log written before it (``setup.ensure_tree``).

Reading every stored body and hashing it is the work (a 100-token record is ~13 KB stored): it runs in
a process per core for a large log, each opening its own reader of the store (as verify's processes
do) and returning its chunk's leaf hashes, 32 bytes a row; this process appends them in order and
inserts the nodes they complete, one write transaction a chunk, while the next chunks are hashed.
Rows never change, so hashes read outside the write transaction are still those of the rows the
transaction appends; a chunk is appended only where the tree stands at its first row (another server
may be building too), so an interrupted or concurrent build resumes where the tree stands.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import closing

from proctor.audit.readahead import Readahead
from proctor.audit.store import AuditStore
from proctor.audit.tree import row_leaf_hash
from proctor.audit.verify_parallel import PROCESSES_MIN_ROWS, StoreOpener, process_count

CHUNK_ROWS = 20_000  # rows hashed per task and appended per write transaction
PAGE_ROWS = 500
AHEAD_CHUNKS = 4  # chunks out (hashed, being hashed, queued) per process, at most: memory and read-ahead bound


def chunk_leaves(open_store: StoreOpener, first_seq: int, last_seq: int) -> list[bytes]:
    """The leaf hashes of rows ``first_seq``..``last_seq``, read through a store of this process's own."""
    store = open_store()
    try:
        return _read_leaves(store, first_seq, last_seq)
    finally:
        store.close()


def _read_leaves(store: AuditStore, first_seq: int, last_seq: int) -> list[bytes]:
    leaves: list[bytes] = []
    seq = first_seq
    while seq <= last_seq:
        rows = [row for row in store.read_page(seq, min(PAGE_ROWS, last_seq - seq + 1)) if row[0] <= last_seq]
        if not rows or rows[0][0] != seq:
            raise RuntimeError(f"row {seq} is missing from the log; the tree cannot grow past it")
        leaves += [row_leaf_hash(row) for row in rows]
        seq = rows[-1][0] + 1
    return leaves


def build_tree(store: AuditStore, progress: Callable[[int], None] | None = None,
               processes: int | None = None) -> int:
    """Append leaves for every row the tree lacks; the number appended by this call."""
    size, last = store.tree_size() or 0, store.last()
    rows = last.seq if last is not None else 0
    chunks = [(first, min(first + CHUNK_ROWS - 1, rows)) for first in range(size + 1, rows + 1, CHUNK_ROWS)]
    if processes is None:
        processes = process_count() if rows - size >= PROCESSES_MIN_ROWS and hasattr(store, "reader") else 1
    added = 0
    with Readahead(store.local_file(), rows) as readahead, \
            closing(_hashed(store, chunks, processes, readahead)) as hashed:
        for (first, _), leaves in zip(chunks, hashed, strict=True):
            grown = store.append_leaves(first - 1, leaves)
            if grown != first - 1 + len(leaves):  # the tree was elsewhere (another server builds too): catch up
                break
            added += len(leaves)
            if progress is not None:
                progress(len(leaves))
    return added + _catch_up(store, progress)


def _hashed(store: AuditStore, chunks: list[tuple[int, int]], processes: int,
            readahead: Readahead) -> Generator[list[bytes], None, None]:
    """Each chunk's leaves, in order. In processes: ``processes + 1`` chunks are being hashed or queued at any
    time (a process that finishes one takes the next, even while an earlier one is still out), at most
    ``AHEAD_CHUNKS`` a process counted from the one appended next; the file is read ahead of the last one handed
    out."""
    if processes <= 1:
        for first, last in chunks:
            readahead.through(last)
            yield _read_leaves(store, first, last)
        return
    context = multiprocessing.get_context("spawn")  # no fork: the caller may be a threaded server
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        opener, upcoming = store.reader(), iter(chunks)
        out: deque[Future[list[bytes]]] = deque()

        def hand_out() -> None:
            while len(out) < AHEAD_CHUNKS * processes and sum(not f.done() for f in out) <= processes:
                chunk = next(upcoming, None)
                if chunk is None:
                    return
                readahead.through(chunk[1])
                out.append(pool.submit(chunk_leaves, opener, *chunk))

        hand_out()
        while out:
            if not out[0].done():
                wait([f for f in out if not f.done()], return_when=FIRST_COMPLETED)
                hand_out()
                continue
            leaves = out.popleft().result()
            hand_out()
            yield leaves


def _catch_up(store: AuditStore, progress: Callable[[int], None] | None) -> int:
    """Whatever the chunks did not append (rows written meanwhile, a concurrent build), in this process."""
    added = 0
    while True:
        size, last = store.tree_size() or 0, store.last()
        rows = last.seq if last is not None else 0
        if size >= rows:
            return added
        leaves = _read_leaves(store, size + 1, min(rows, size + CHUNK_ROWS))
        grown = store.append_leaves(size, leaves)
        if grown == size + len(leaves):
            added += len(leaves)
            if progress is not None:
                progress(len(leaves))
