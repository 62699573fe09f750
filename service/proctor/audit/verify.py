"""``proctor audit verify``: recompute the chain, check every checkpoint signature and the checkpoint file.

The result names the first bad sequence number and what is wrong with it; an intact log is
``ok``. Checks, per row in order: the sequence number follows the previous one (a deleted or
inserted row), ``prev_hash`` is the previous row's hash (a swapped or inserted row), the hash
matches the row's content (an edited byte or column), and a checkpoint's signature and the hash it
covers. After the rows: every checkpoint in the checkpoint file is in the store with the same hash
(the tail was not cut off).

A ``proctor.audit/2`` or ``/3`` row's hash covers its filter columns, so a request row is checked
without parsing (or, in v3, inflating) its body: only the stored bytes are hashed, a third of the
JSON in v3. Two threads each read a page of rows and hash it (SQLite's and psycopg's reads
and hashlib's sha256 of a large body release the GIL, so both cores work) while this one walks the
chain through the pages in order; a third thread is slower on 2 cores (measured, bench/README.md).
Checkpoints (one in ``checkpoint_every`` rows) are parsed and their signature checked, once each.
A ``proctor.audit/1`` row (a log written before issue 13; a log may hold v1 rows, then v2 rows) is
recognised by its hash and checked the v1 way: its body is parsed and its columns compared with it.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from proctor.audit.chain import ChainWalk, public_key_text
from proctor.audit.store import AuditStore, RawRow
from proctor.audit.tree import first_problem, hashed_page, leaf_problem
from proctor.audit.verify_parallel import (
    PAGE_ROWS,
    PROCESSES_MIN_ROWS,
    Merged,
    StoreOpener,
    process_count,
    verify_in_processes,
)
from proctor.audit.verify_tree import tree_problem

WORKERS = 2  # threads reading and hashing pages


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    records: int
    checkpoints: int
    first_bad_seq: int | None = None
    problem: str = ""
    seconds: float = 0.0
    tree_leaves: int = 0  # leaves of the Merkle tree checked (0: the log has no tree yet)

    def summary(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        if self.ok:
            tree = (f", Merkle tree of {self.tree_leaves} leaves" if self.tree_leaves
                    else "; no Merkle tree yet (the server builds it at its next start)")
            return (f"intact: {self.records} records, {self.checkpoints} checkpoints verified{tree} "
                    f"({rate:,.0f} records/s)")
        return f"TAMPERED: record {self.first_bad_seq}: {self.problem}"


Page = tuple[list[RawRow], list[str | None], list[bytes], list[bytes]]  # rows, chain hashes, leaf hashes, stored


def _read_and_hash(store: AuditStore, first_seq: int) -> Page:
    rows = store.read_page(first_seq, PAGE_ROWS)
    digests, leaves = hashed_page(rows)
    return rows, digests, leaves, store.tree_leaves(rows[0][0] - 1, len(rows)) if rows else []


def _hashed_pages(store: AuditStore, pool: ThreadPoolExecutor) -> Iterator[Page]:
    """The log's rows in pages, in order, each with its rows' v2/v3 hashes, read ahead by ``pool``.

    Page k asks for the rows from seq ``1 + k * PAGE_ROWS``: in an intact log exactly the next
    page (a gap or a shifted row fails the chain check there anyway). A short page is the end of
    the log as it was when read; rows appended since are read after it, one page at a time, so a
    page read ahead too early cannot leave a hole.
    """
    pending: deque[Future[Page]] = deque()
    next_seq = 1
    while True:
        while len(pending) <= WORKERS:
            pending.append(pool.submit(_read_and_hash, store, next_seq))
            next_seq += PAGE_ROWS
        page = pending.popleft().result()
        rows = page[0]
        if rows:
            yield page
        if len(rows) < PAGE_ROWS:
            break
    for future in pending:
        future.cancel()
    after = rows[-1][0] + 1 if rows else next_seq - (len(pending) + 1) * PAGE_ROWS
    while True:
        page = pool.submit(_read_and_hash, store, after).result()
        if not page[0]:
            return
        yield page
        after = page[0][-1][0] + 1


def verify_log(store: AuditStore, *, public_key: Ed25519PublicKey | None = None, checkpoint_file: Path | None = None,
               progress: Callable[[int], None] | None = None, processes: int | None = None) -> VerifyResult:
    """Check the whole log. Without ``public_key`` checkpoints are checked against the key they name
    (which proves integrity since the checkpoint, not who signed it).

    ``processes``: how many processes read and hash (``verify_parallel``); 1 keeps to this process
    and its threads; None (the default) uses one per core for a log of ``PROCESSES_MIN_ROWS`` rows
    or more whose store can open another reader (``reader()``), else 1.
    """
    start = time.perf_counter()
    opener: StoreOpener | None = store.reader() if hasattr(store, "reader") and processes != 1 else None
    last = store.last() if opener is not None else None
    if processes is None:
        processes = process_count() if last is not None and last.seq >= PROCESSES_MIN_ROWS else 1
    if processes > 1:
        if opener is None:
            raise ValueError(f"{store.description} cannot be opened by another process: verify with processes=1")
        if last is not None:
            merged = verify_in_processes(opener, last.seq, processes,
                                         public_key_text(public_key) if public_key else None, progress)
            return _finish(merged, merged.bad, checkpoint_file, start, store)
    chain = ChainWalk(public_key)
    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="proctor-audit-verify")
    try:
        for rows, digests, leaves, stored in _hashed_pages(store, pool):
            bad = first_problem(chain.page(rows, digests), leaf_problem(rows, leaves, stored))
            if bad is not None:
                return VerifyResult(False, chain.records, chain.checkpoints, bad[0], bad[1],
                                    time.perf_counter() - start)
            if progress is not None:
                progress(len(rows))
    finally:  # the pages read ahead are dropped; a read in progress ends before the caller may close the store
        pool.shutdown(wait=True, cancel_futures=True)
    return _finish(chain, None, checkpoint_file, start, store)


def _finish(chain: ChainWalk | Merged, bad: tuple[int, str] | None, checkpoint_file: Path | None,
            start: float, store: AuditStore) -> VerifyResult:
    """The result, once the rows are checked: ``bad``, else the checkpoint file's verdict, else the tree's."""
    problem = (bad or _checkpoint_file_problem(chain, checkpoint_file)
               or tree_problem(store, chain.expected - 1, chain.notes))
    if problem is not None:
        return VerifyResult(False, chain.records, chain.checkpoints, problem[0], problem[1],
                            time.perf_counter() - start)
    leaves = chain.expected - 1 if store.tree_size() else 0
    return VerifyResult(True, chain.records, chain.checkpoints, seconds=time.perf_counter() - start,
                        tree_leaves=leaves)


def _checkpoint_file_problem(chain: ChainWalk | Merged, checkpoint_file: Path | None) -> tuple[int, str] | None:
    """Every checkpoint the file lists must be in the store with the same hash (the tail was not cut)."""
    if checkpoint_file is None or not checkpoint_file.exists():
        return None
    for line in checkpoint_file.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if chain.checkpoint_hashes.get(entry["seq"]) != entry["hash"]:
            missing = entry["seq"] >= chain.expected
            return (chain.expected if missing else entry["seq"],
                    f"checkpoint {entry['seq']} from the checkpoint file is "
                    f"{'missing from' if missing else 'different in'} the store (the log was cut short or rewritten)")
    return None
