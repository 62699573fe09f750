"""Audit proofs (issue 29): the writer with the Merkle tree against without it, the first-start tree
build, and inclusion proofs and their offline check at a million records.

1. **Writer** — the real sink and SQLite store (WAL, ``synchronous=FULL``), ``--records`` synthetic
   100-token records (bench/audit.py's: real vocabulary texts, 5 alternatives a token) submitted at
   once, alternating rounds with the tree and without it (the store as before issue 29: no leaf hashes,
   no nodes, no signed note; bench-only baseline). Median records/s and the ratio (target ≥ 0.95).
2. **First-start build** — a log of ``--build-records`` records written without the tree (the store as before
   issue 29), then ``ensure_tree`` as at the first start after the upgrade (a process per core from 100,000
   rows): records/s (target ≥ 100,000), for 100-token records (~13 KB stored) and for 20-token ones (~3 KB);
   once with the file dropped from the page cache ("cold"), once with it cached ("cached").
3. **Proofs at scale** — a log of ``--proof-records`` small rows (1,000,000) built straight into SQLite
   (valid chain, tree and a signed checkpoint; a few seconds), then ``proofs.inclusion`` for random
   records (target ≤ 5 ms) and ``verify_proof`` of each file (target ≤ 10 ms): median and p99.

    python bench/audit_proofs.py [--records 5000] [--rounds 3] [--build-records 100000] [--build-tokens 100,20]
                                 [--proof-records 1000000] [--proofs 300]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src"), str(ROOT / "bench")]

from audit import token_lists  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from proctor.audit import FORMAT  # noqa: E402
from proctor.audit.canonical import canonical  # noqa: E402
from proctor.audit.chain import GENESIS, log_signer, row_hash, row_head  # noqa: E402
from proctor.audit.proofs import inclusion  # noqa: E402
from proctor.audit.sink import AuditSink  # noqa: E402
from proctor.audit.sqlite_store import SQLiteAuditStore  # noqa: E402
from proctor.audit.store import COLUMNS, Build, Row  # noqa: E402
from proctor.audit.stored_body import compress  # noqa: E402
from proctor.audit.tree import TABLE as TREE_TABLE  # noqa: E402
from proctor.audit.tree import CompactRange, insert_sql, stored  # noqa: E402
from proctor.audit.tree_build import build_tree  # noqa: E402
from proctor_client.tlog.merkle import leaf_hash  # noqa: E402
from proctor_client.tlog.note import Checkpoint, sign_checkpoint  # noqa: E402
from proctor_client.tlog.proof import verify_proof  # noqa: E402


class _NoTree(CompactRange):
    """The baseline's border: appends nothing, signs a zero root (the writer as before the tree)."""

    def __init__(self) -> None:
        super().__init__(0, [])

    def append(self, digest: bytes) -> None:
        return None


class TreelessStore(SQLiteAuditStore):
    """The SQLite store as it was before issue 29: rows only (bench-only baseline)."""

    def append_chained(self, build: Build) -> list[Row]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                head = self._db.execute("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
                rows = build(*(head if head else (0, GENESIS)), _NoTree())
                self._db.executemany(f"INSERT INTO audit_log ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                     [(r.seq, r.audit_id, r.kind, r.time_ms, r.caller, r.request_id,
                                       r.finish_reason, r.body, r.prev_hash, r.hash) for r in rows])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return rows


def records(count: int, lists: list[list[dict[str, object]]], base: int) -> list[dict[str, object]]:
    return [{"format": FORMAT, "kind": "request", "audit_id": f"r{base + i:08d}", "method": "Generate",
             "request_id": f"q{base + i}", "received_ms": 1_764_000_000_000 + i, "caller": {"identity": "bench"},
             "status": {"code": "OK", "message": ""}, "finish": {"reason": "length", "detail": ""},
             "tokens": lists[i % len(lists)]} for i in range(count)]


def write_rate(store: SQLiteAuditStore, batch: list[dict[str, object]]) -> float:
    sink = AuditSink(store, Ed25519PrivateKey.generate(), checkpoint_file=None, checkpoint_every=1000,
                     checkpoint_interval_s=3600, queue_size=len(batch) + 1)
    start = time.perf_counter()
    futures = [sink.submit(record) for record in batch]
    for future in futures:
        future.result(600)
    seconds = time.perf_counter() - start
    sink.close()
    return len(batch) / seconds


def writer(args: argparse.Namespace, directory: Path) -> dict[str, list[float]]:
    lists = token_lists(256, 100)
    rates: dict[str, list[float]] = {"tree": [], "no tree": []}
    for round_ in range(args.rounds):
        for kind in (("tree", "no tree") if round_ % 2 == 0 else ("no tree", "tree")):
            path = directory / f"{kind.replace(' ', '-')}-{round_}.db"
            store = SQLiteAuditStore(path) if kind == "tree" else TreelessStore(path)
            rates[kind].append(write_rate(store, records(args.records, lists, 0)))
            store.close()
            path.unlink()
            print(f"  round {round_ + 1} writer {kind:<8} {rates[kind][-1]:8,.0f} records/s", flush=True)
    return rates


def build_rate(directory: Path, count: int, tokens: int) -> dict[str, tuple[float, float]]:
    """``ensure_tree``'s records/s over ``count`` records of ``tokens`` tokens written without the tree: overall
    (the processes' start included) and once the first chunk is in (the rate a long build runs at); first with
    the file dropped from the page cache (a server restarted onto a log on disk), then again with the tree
    dropped and the file read into the page cache first (a log the server has just been writing)."""
    lists = token_lists(256, tokens)
    path = directory / f"build-{tokens}.db"
    writing = TreelessStore(path)
    for first in range(0, count, 20_000):
        write_rate(writing, records(min(20_000, count - first), lists, first))
    writing.close()
    rates = {}
    for cache in ("cold", "cached"):
        if cache == "cold":
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        else:
            db = sqlite3.connect(path, isolation_level=None)
            db.execute(f"DROP TABLE {TREE_TABLE}")  # its triggers go with it; bench only
            db.close()
            with path.open("rb") as file:  # all of it in the page cache (as memory allows), whatever ran before
                while file.read(8 << 20):
                    pass
        store = SQLiteAuditStore(path)  # creates the empty tree table, as a server upgraded in place does
        marks: list[tuple[float, int]] = []
        start = time.perf_counter()
        built = build_tree(store, lambda n: marks.append((time.perf_counter(), n)))  # noqa: B023
        seconds = time.perf_counter() - start
        store.close()
        steady = sum(n for _, n in marks[1:]) / (marks[-1][0] - marks[0][0]) if len(marks) > 2 else 0.0
        rates[cache] = (built / seconds, steady)
        print(f"  build over {count:,} {tokens}-token records, {cache}: {built / seconds:,.0f} records/s "
              f"({steady:,.0f} once the processes run)", flush=True)
    path.unlink()
    return rates


def big_log(path: Path, rows: int) -> tuple[SQLiteAuditStore, str, list[str]]:
    """``rows`` small request rows with a valid chain and tree, then a signed checkpoint over them."""
    key = Ed25519PrivateKey.generate()
    signer = log_signer(key)
    store = SQLiteAuditStore(path)
    tree, prev, buffer, nodes_at = CompactRange(0, []), GENESIS, [], 0
    ids = []
    db = store._db  # bench-only bulk load: the writer's rows and nodes, without the sink's per-record work
    db.execute("PRAGMA synchronous=OFF")
    for seq in range(1, rows + 1):
        audit_id = f"b{seq:08d}"
        data = compress(canonical({"format": FORMAT, "kind": "request", "audit_id": audit_id, "n": seq}))
        head = row_head(seq, prev, "request", audit_id, seq, "bench", f"q{seq}", "length")
        digest = hashlib.sha256(head + data).hexdigest()
        tree.append(leaf_hash(head + data))
        buffer.append((seq, audit_id, "request", seq, "bench", f"q{seq}", "length", data, prev, digest))
        prev = digest
        ids.append(audit_id)
        if len(buffer) == 50_000 or seq == rows:
            db.execute("BEGIN")
            db.executemany(f"INSERT INTO audit_log ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", buffer)
            db.executemany(insert_sql("?"), stored(tree.nodes[nodes_at:]))
            db.execute("COMMIT")
            buffer, nodes_at = [], len(tree.nodes)
            print(f"  {seq:,} rows", end="\r", file=sys.stderr, flush=True)
    note = sign_checkpoint(Checkpoint(signer.name, tree.size, tree.root()), signer)
    seq = rows + 1
    data = compress(canonical({"format": FORMAT, "kind": "checkpoint", "checkpoint_seq": rows, "checkpoint_hash": prev,
                               "time_ms": 0, "public_key": "", "signature": "", "note": note}))
    row = (seq, f"checkpoint-{seq}", "checkpoint", 0, "", "", "", data, prev,
           row_hash(seq, prev, "checkpoint", f"checkpoint-{seq}", 0, "", "", "", data))
    db.execute("BEGIN")
    db.execute(f"INSERT INTO audit_log ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    db.execute("COMMIT")
    return store, signer.verifier.vkey(), ids


def _p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:  # spawned build processes import this module: everything runs under __main__
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5000, help="records per writer round (default 5000)")
    parser.add_argument("--rounds", type=int, default=3, help="writer rounds of each kind (default 3)")
    parser.add_argument("--build-records", type=int, default=100_000)
    parser.add_argument("--build-tokens", default="100,20", help="tokens a record in the build's logs (default 100,20)")
    parser.add_argument("--proof-records", type=int, default=1_000_000)
    parser.add_argument("--proofs", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        print(f"writer: {args.records:,} records of 100 tokens a round, {args.rounds} rounds each way")
        rates = writer(args, directory)
        builds = {int(tokens): build_rate(directory, args.build_records, int(tokens))
                  for tokens in args.build_tokens.split(",")}
        start = time.perf_counter()
        store, vkey, ids = big_log(directory / "big.db", args.proof_records)
        print(f"built a {args.proof_records:,}-row log in {time.perf_counter() - start:.0f} s")
        rng = random.Random(29)
        prove_ms, check_ms = [], []
        for audit_id in rng.sample(ids, args.proofs):
            start = time.perf_counter()
            text = inclusion(store, audit_id).render()
            prove_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            report = verify_proof(text, vkey)
            check_ms.append((time.perf_counter() - start) * 1000)
            assert report.ok, report.failed
    tree, flat = statistics.median(rates["tree"]), statistics.median(rates["no tree"])
    print("\n| measure | figure | target |")
    print("|---|---:|---|")
    print(f"| writer with the tree, records/s (median of {args.rounds}) | {tree:,.0f} | |")
    print(f"| writer without the tree, records/s | {flat:,.0f} | |")
    print(f"| writer with ÷ without | {tree / flat:.3f} | ≥ 0.95 |")
    for tokens, caches in builds.items():
        for cache, (rate, steady) in caches.items():
            print(f"| first-start tree build, records/s ({args.build_records:,} records of {tokens} tokens, {cache}): "
                  f"overall / once the processes run | {rate:,.0f} / {steady:,.0f} | ≥ 100,000 |")
    print(f"| inclusion proof at {args.proof_records:,} records, ms (median / p99 of {args.proofs}) | "
          f"{statistics.median(prove_ms):.2f} / {_p(prove_ms, 0.99):.2f} | ≤ 5 |")
    print(f"| verify-proof, ms (median / p99) | {statistics.median(check_ms):.2f} / {_p(check_ms, 0.99):.2f} | "
          "≤ 10 |")


if __name__ == "__main__":
    main()
