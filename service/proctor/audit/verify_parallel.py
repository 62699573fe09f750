"""Verify a large log in several processes, each over one range of sequence numbers.

Threads share one GIL. The threaded verifier's readers hand it over around every row (SQLite's
step and sha256 release it), and on a 2-core VM each hand-over costs about as much as the Python
around it: ~45,000 records/s of 100-token ``proctor.audit/3`` records, where one process alone
reads and hashes ~55,000/s. A process per range has its own interpreter and runs the plain loop,
no threads. Starting one (spawn: a fresh interpreter importing the audit modules, ~0.3 s) costs
more than it saves on a small log, so ``verify_log`` uses processes from ``PROCESSES_MIN_ROWS``
rows (bench/README.md has the figures).

Each process checks its range as the sequential walk does, except that it takes its first row's
``seq`` and ``prev_hash`` as given; the parent then checks every boundary (the range's first row
follows the previous range's last, and its ``prev_hash`` is that row's hash), so the first bad
row it names is the one the sequential walk would name. The last range is open-ended: rows
appended while verifying are read, as in the threaded walk.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.sharedctypes import Synchronized

from proctor.audit.chain import GENESIS, ChainWalk, gap_problem, link_problem
from proctor.audit.store import AuditStore
from proctor.audit.tree import first_problem, hashed_page, leaf_problem
from proctor_client.tlog.note import load_public_key

PROCESSES_MIN_ROWS = 100_000  # ~2 s of the threaded walk: the processes' start-up is then < 15% of it
MAX_PROCESSES = 8  # each holds a store connection; past this the disk, not the hashing, is the limit
POLL_S = 0.2  # how often the parent reports progress while the processes run
PAGE_ROWS = 64  # rows per page: ~2 MB of 100-token records, still in the reading thread's cache when it hashes
StoreOpener = Callable[[], AuditStore]  # picklable: the store's ``reader()``


def process_count() -> int:
    """Processes for a large log: one per core this process may use, at most ``MAX_PROCESSES``."""
    return max(1, min(MAX_PROCESSES, len(os.sched_getaffinity(0))))


@dataclass(slots=True)
class RangeResult:
    """What one process found in its range (``first``/``last``: (seq, prev_hash) / (seq, hash))."""

    first: tuple[int, str] | None = None
    last: tuple[int, str] | None = None
    records: int = 0
    checkpoints: int = 0
    checkpoint_hashes: dict[int, str] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)
    bad: tuple[int, str] | None = None


@dataclass(slots=True)
class Merged:
    """The ranges put back together: as the sequential walk's ``ChainWalk`` ends."""

    records: int = 0
    checkpoints: int = 0
    checkpoint_hashes: dict[int, str] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)
    expected: int = 1
    bad: tuple[int, str] | None = None


def verify_range(open_store: StoreOpener, first_seq: int, last_seq: int | None, public_key: str | None,
                 done: Synchronized[int] | None = None) -> RangeResult:
    """Check rows ``first_seq``..``last_seq`` (None: to the end) in this process, page by page."""
    store = open_store()
    try:
        chain = ChainWalk(load_public_key(public_key) if public_key else None)
        result, seq = RangeResult(), first_seq
        while True:
            rows = store.read_page(seq, PAGE_ROWS)
            if last_seq is not None:
                rows = [row for row in rows if row[0] <= last_seq]
            if not rows:
                break
            if result.first is None:
                result.first = (rows[0][0], rows[0][8])
                if first_seq > 1:  # taken as given here; the parent checks the boundary
                    chain.expected, chain.prev_hash = result.first
            digests, leaves = hashed_page(rows)
            result.bad = first_problem(chain.page(rows, digests),
                                       leaf_problem(rows, leaves, store.tree_leaves(rows[0][0] - 1, len(rows))))
            if done is not None:
                with done.get_lock():
                    done.value += len(rows)
            if result.bad is not None:
                break
            result.last, seq = (rows[-1][0], rows[-1][9]), rows[-1][0] + 1
        result.records, result.checkpoints, result.checkpoint_hashes = (chain.records, chain.checkpoints,
                                                                         chain.checkpoint_hashes)
        result.notes = chain.notes
        return result
    finally:
        store.close()


def _range_main(open_store: StoreOpener, first_seq: int, last_seq: int | None, public_key: str | None,
                done: Synchronized[int], out: Connection) -> None:
    try:
        out.send(("ok", verify_range(open_store, first_seq, last_seq, public_key, done)))
    except BaseException as exc:  # the parent raises it: a store error reaches the caller
        out.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        out.close()


def verify_in_processes(open_store: StoreOpener, last_seq: int, processes: int, public_key: str | None,
                        progress: Callable[[int], None] | None) -> Merged:
    """Split 1..``last_seq`` into ``processes`` ranges, check them at once, and merge."""
    context = multiprocessing.get_context("spawn")  # no fork: the caller may be a threaded server
    size = -(-last_seq // processes)
    bounds = [(1 + k * size, (k + 1) * size if k < processes - 1 else None) for k in range(processes)]
    bounds = [(a, b) for a, b in bounds if a <= last_seq]
    counters = [context.Value("q", 0) for _ in bounds]
    pipes = [context.Pipe(duplex=False) for _ in bounds]
    workers = [context.Process(target=_range_main, args=(open_store, a, b, public_key, counter, sender),
                               name=f"proctor-audit-verify-{a}", daemon=True)
               for (a, b), counter, (_, sender) in zip(bounds, counters, pipes, strict=True)]
    results: dict[int, RangeResult] = {}
    reported = 0
    try:
        for worker in workers:
            worker.start()
        for _, sender in pipes:
            sender.close()  # the child holds its end: EOF here once it exits
        waiting = {receiver: k for k, (receiver, _) in enumerate(pipes)}
        while waiting:
            for ready in wait(list(waiting), timeout=POLL_S):
                if ready not in waiting:  # a later range, dropped this round once an earlier one found the bad row
                    continue
                k = waiting.pop(ready)
                try:
                    status, payload = ready.recv()
                except EOFError:
                    status, payload = "error", f"the process exited with status {workers[k].exitcode}"
                if status != "ok":
                    first, last = bounds[k]
                    raise RuntimeError(f"verifying records {first}..{last or 'end'} failed: {payload}")
                results[k] = payload
                if payload.bad is not None:  # the ranges after this one cannot name an earlier row
                    for later in [r for r, j in waiting.items() if j > k]:
                        del waiting[later]
            if progress is not None:
                total = sum(counter.value for counter in counters)
                if total > reported:
                    progress(total - reported)
                    reported = total
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join()
    return merge([results[k] for k in sorted(results)])


def merge(results: list[RangeResult]) -> Merged:
    """The ranges in order, each boundary checked as the sequential walk checks a row."""
    merged, prev_hash = Merged(), GENESIS
    for result in results:
        if result.first is not None:
            seq, prev = result.first
            if seq != merged.expected:
                merged.bad = (min(seq, merged.expected), gap_problem(merged.expected, seq))
                return merged
            if prev != prev_hash:
                merged.bad = (seq, link_problem())
                return merged
        merged.records += result.records
        merged.checkpoints += result.checkpoints
        merged.checkpoint_hashes.update(result.checkpoint_hashes)
        merged.notes.update(result.notes)
        if result.bad is not None:
            merged.bad = result.bad
            return merged
        if result.last is not None:
            merged.expected, prev_hash = result.last[0] + 1, result.last[1]
    return merged
