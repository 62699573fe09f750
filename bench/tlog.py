"""The audit log as a C2SP tiled log and its witnesses over HTTP (issue 58): what a tile costs to serve, and what a
checkpoint's round trip to a witness costs.

1. **Tiles** — a log of ``--rows`` small rows with a valid chain, tree and signed checkpoint (bench/audit_proofs.py's
   bulk load), served by ``tlog_app`` (what ``proctor audit serve-tiles`` and the server's ``/tlog/`` answer) on
   loopback under uvicorn, read over one keep-alive connection: the checkpoint, full level-0 tiles read for the first
   time (from the store) and again (from the cache), level-1 and level-2 tiles, the partial tiles. Medians and p99.
   The reference measured in the same run: ``proofs.consistency`` between two random sizes in process, what the gRPC
   ``GetConsistencyProof`` computes per call (a tile client needs a handful of tiles for the same proof).
2. **Witness round trip** — a log grown by the real sink (a checkpoint every 10 records), each checkpoint in turn
   posted by ``WitnessFeed`` to ``proctor audit witness --listen``'s app on loopback: the consistency proof, the HTTP
   request, the witness's checks, its state written and synced, its cosignature, the log's check and insert of it.
   The reference: ``WitnessService.add_checkpoint`` called directly on the same checkpoints (no HTTP, no log side).

    python bench/tlog.py [--rows 1000000] [--reads 2000] [--checkpoints 40]
"""

from __future__ import annotations

import argparse
import http.client
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src"), str(ROOT / "bench")]

import uvicorn  # noqa: E402
from audit_proofs import big_log  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from proctor.audit import FORMAT  # noqa: E402
from proctor.audit.chain import load_or_create_signing_key, log_signer  # noqa: E402
from proctor.audit.proofs import checkpoint_note, consistency  # noqa: E402
from proctor.audit.sink import AuditSink  # noqa: E402
from proctor.audit.sqlite_store import SQLiteAuditStore  # noqa: E402
from proctor.audit.tiles import encode_index, hashes_at  # noqa: E402
from proctor.audit.tlog_http import tlog_app  # noqa: E402
from proctor.audit.tlog_read import TlogReader  # noqa: E402
from proctor.audit.witness import witness_signer  # noqa: E402
from proctor.audit.witness_feed import WitnessFeed, _Witness  # noqa: E402
from proctor.audit.witness_http import witness_app  # noqa: E402
from proctor.audit.witness_server import WitnessService  # noqa: E402
from proctor_client.tlog.note import parse_checkpoint, parse_note, parse_vkey  # noqa: E402


def serve(app: object) -> tuple[uvicorn.Server, int, threading.Thread]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, port, thread


def timed_gets(port: int, paths: list[str]) -> list[float]:
    """Each path over one keep-alive connection: seconds per answer (all 200)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    seconds = []
    for path in paths:
        began = time.perf_counter()
        connection.request("GET", path)
        answer = connection.getresponse()
        answer.read()
        seconds.append(time.perf_counter() - began)
        assert answer.status == 200, (path, answer.status)
    connection.close()
    return seconds


def row(label: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"| {label} | {len(seconds)} | {statistics.median(seconds) * 1e3:.3f} | {p99 * 1e3:.3f} |"


def tiles(args: argparse.Namespace, directory: Path) -> list[str]:
    began = time.perf_counter()
    store, _, _ = big_log(directory / "big.db", args.rows)
    print(f"log of {args.rows:,} rows built in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    reader_store = SQLiteAuditStore(directory / "big.db", readonly=True)
    server, port, thread = serve(tlog_app(TlogReader(reader_store, public=True)))
    rng = random.Random(7)
    full0 = hashes_at(0, args.rows) // 256
    picked = rng.sample(range(full0), min(args.reads, full0))
    first = timed_gets(port, [f"/tlog/tile/0/{encode_index(n)}" for n in picked])
    again = timed_gets(port, [f"/tlog/tile/0/{encode_index(n)}" for n in picked])
    level1 = [f"/tlog/tile/1/{encode_index(n)}" for n in range(max(1, hashes_at(1, args.rows) // 256))]
    upper = timed_gets(port, [*level1, "/tlog/tile/2/000.p/" + str(hashes_at(2, args.rows) % 256 or 1)])
    counts = {level: hashes_at(level, args.rows) for level in range(3)}
    partial = [f"/tlog/tile/{level}/{encode_index(count // 256)}.p/{count % 256}"
               for level, count in counts.items() if count % 256]
    partials = timed_gets(port, partial * 50)
    checkpoints = timed_gets(port, ["/tlog/checkpoint"] * args.reads)
    proofs = []
    for _ in range(300):
        old, new = sorted(rng.sample(range(1, args.rows + 1), 2))
        began = time.perf_counter()
        consistency(store, old, new)
        proofs.append(time.perf_counter() - began)
    server.should_exit = True
    thread.join(10)
    return ["| read | requests | median ms | p99 ms |", "|---|---|---|---|",
            row("checkpoint (cached 1 s)", checkpoints), row("full level-0 tile, first read (store)", first),
            row("the same tiles again (cache)", again), row("level-1 and level-2 tiles", upper),
            row("partial tiles (cache)", partials),
            row("reference: proofs.consistency in process (GetConsistencyProof's work)", proofs)]


def grow(store: SQLiteAuditStore, key: Path, count: int) -> None:
    sink = AuditSink(store, load_or_create_signing_key(key), checkpoint_file=None, checkpoint_every=10,
                     checkpoint_interval_s=3600)
    futures = [sink.submit({"format": FORMAT, "kind": "request", "audit_id": f"w-{n}", "method": "Generate",
                            "request_id": f"w{n}", "received_ms": 1_764_000_000_000 + n,
                            "caller": {"identity": "bench"}, "finish": {"reason": "length", "detail": ""}})
               for n in range(count)]
    for future in futures:
        future.result(60)
    sink.close()


def witness_trip(args: argparse.Namespace, directory: Path) -> list[str]:
    store, key = SQLiteAuditStore(directory / "w.db"), directory / "w.key"
    grow(store, key, 10 * args.checkpoints)
    notes = []
    row_ = store.last_checkpoint()
    while row_ is not None:
        note = checkpoint_note(row_)
        if note is not None:
            notes.append((parse_checkpoint(parse_note(note).text).size, note))
        row_ = store.last_checkpoint(row_.seq)
    notes.sort()
    log_key = log_signer(load_or_create_signing_key(key)).verifier
    signer = witness_signer(Ed25519PrivateKey.generate(), "bench.example/witness")
    logs = {log_key.name: parse_vkey(log_key.vkey())}
    server, port, thread = serve(witness_app(WitnessService(logs, signer, directory / "state"), CollectorRegistry()))
    feed = WitnessFeed(store, (f"http://127.0.0.1:{port}",), (signer.verifier.vkey(),))
    witness = feed._witnesses[0]  # bench-only: each historical checkpoint in turn, as run_once posts the latest
    trips = []
    for size, note in notes:
        began = time.perf_counter()
        feed._post(witness, size, note)
        trips.append(time.perf_counter() - began)
        assert isinstance(witness, _Witness) and witness.size == size, "the witness did not cosign"
    server.should_exit = True
    thread.join(10)
    direct, service = [], WitnessService(logs, signer, directory / "state-direct")
    previous = 0
    for size, note in notes:
        proof = consistency(store, previous, size)[0] if 0 < previous < size else []
        body = (f"old {previous}\n" + "".join(__import__("base64").b64encode(h).decode() + "\n" for h in proof)
                + "\n" + note).encode()
        began = time.perf_counter()
        assert service.add_checkpoint(body).status == 200
        direct.append(time.perf_counter() - began)
        previous = size
    return ["| step | checkpoints | median ms | p99 ms |", "|---|---|---|---|",
            row("log → witness over HTTP, cosignature kept (WitnessFeed)", trips),
            row("reference: WitnessService.add_checkpoint in process", direct)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--checkpoints", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proctor-tlog-") as scratch:
        directory = Path(scratch)
        lines = [*tiles(args, directory), "", *witness_trip(args, directory)]
    print(f"\n`python bench/tlog.py --rows {args.rows} --reads {args.reads} --checkpoints {args.checkpoints}`\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
