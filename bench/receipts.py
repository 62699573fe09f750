"""What signing a receipt for every record costs the audit writer (issue 44: target, the writer ≥ 0.97× without it).

The server signs each answer's receipt on the call's side (api/audit_trail.py ``receipt``: the request's digest,
the output's, an Ed25519 note signature), not on the writer's thread; but in one process the two share the GIL.
So this runs the real sink (SQLite WAL, ``synchronous=FULL``, a checkpoint every 1000 records) on ``--records``
records of ``--tokens`` tokens, as bench/audit.py builds them, twice a round in alternating order: alone, and with
a second thread signing every record's receipt as its commit resolves (what the API does). It prints the writer's
records/s each way (medians over ``--rounds``), their ratio, and the time one receipt takes.

    python bench/receipts.py [--records 5000] [--tokens 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

from audit import token_lists  # noqa: E402

from proctor.api.audit_trail import AuditTrail  # noqa: E402
from proctor.audit import FORMAT  # noqa: E402
from proctor.audit.chain import load_or_create_signing_key  # noqa: E402
from proctor.audit.records import PrivacyPolicy  # noqa: E402
from proctor.audit.sink import AuditSink  # noqa: E402
from proctor.audit.sqlite_store import SQLiteAuditStore  # noqa: E402


def body(index: int, tokens: list[dict[str, object]]) -> dict[str, Any]:
    text = "".join(str(token["text"]) for token in tokens)
    return {"format": FORMAT, "kind": "request", "audit_id": f"s{index}", "request_id": f"r{index}",
            "received_ms": 1_764_000_000_000 + index, "caller": {"identity": "bench"}, "status": {"code": "OK"},
            "request": {"prompt": f"Summarise contract {index}.", "sampling": {"seed": str(index)}},
            "output": {"text": text}, "finish": {"reason": "length", "detail": ""}, "tokens": tokens}


def run(directory: Path, bodies: list[dict[str, Any]], receipts: bool) -> tuple[float, list[float]]:
    """Records/s from the first submit until every record is committed (and its receipt signed); the receipts'
    times, in seconds."""
    sink = AuditSink(SQLiteAuditStore(directory / "log.db"), load_or_create_signing_key(directory / "log.key"),
                     checkpoint_file=directory / "log.checkpoints")
    trail = AuditTrail(sink, PrivacyPolicy(), compliance=False, top_n=5, receipts=True)
    signing: list[float] = []
    start = time.perf_counter()
    futures = [sink.submit(record) for record in bodies]

    def sign_each() -> None:
        for record, future in zip(bodies, futures, strict=True):
            committed = future.result()
            begin = time.perf_counter()
            trail.receipt(record["audit_id"], record, committed, record["output"]["text"])
            signing.append(time.perf_counter() - begin)

    signer = threading.Thread(target=sign_each) if receipts else None
    if signer is not None:
        signer.start()
        signer.join()
    else:
        for future in futures:
            future.result()
    elapsed = time.perf_counter() - start
    sink.close()
    return len(bodies) / elapsed, signing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lists = token_lists(64, args.tokens)
    bodies = [body(index, lists[index % len(lists)]) for index in range(args.records)]
    rates: dict[str, list[float]] = {"writer alone": [], "receipts signed alongside": []}
    signing: list[float] = []
    for round_ in range(args.rounds):
        order = [False, True] if round_ % 2 == 0 else [True, False]
        for receipts in order:
            with tempfile.TemporaryDirectory() as scratch:
                rate, times = run(Path(scratch), bodies, receipts)
            rates["receipts signed alongside" if receipts else "writer alone"].append(rate)
            signing += times
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{mode} {statistics.median(values):,.0f} records/s"
                                                              for mode, values in rates.items()),
              file=sys.stderr, flush=True)
    alone, alongside = (statistics.median(values) for values in rates.values())
    print(f"\n{args.records} records of {args.tokens} tokens, {args.rounds} rounds (medians)\n")
    print("| writer | records/s |\n|---|---:|")
    print(f"| alone | {alone:,.0f} |\n| receipts signed alongside | {alongside:,.0f} |")
    print(f"\nratio (alongside / alone): {alongside / alone:.3f}; one receipt (digests and signature): "
          f"median {statistics.median(signing) * 1e6:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
