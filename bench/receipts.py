"""What signing a receipt for every record costs the audit writer (issue 44: target, the writer ≥ 0.97× without it).

The server signs each answer's receipt on the call's side (audit/receipts.py: the request's digest, the output's,
an Ed25519 note signature), not on the writer's thread; but in one process the two share the GIL. So this runs the
real sink (SQLite WAL, ``synchronous=FULL``, a checkpoint every 1000 records) on ``--records`` records of
``--tokens`` tokens, as bench/audit.py builds them, three ways a round, in rotating order:

- ``alone``: the writer, nobody waiting on the commits (``--no-audit-compliance --no-audit-receipts``);
- ``waited``: a second thread waits for each record's commit, as the API does in compliance mode (the default);
- ``receipts``: that thread also signs the receipts of the records committed together, one signature a group, as
  the API does with receipts (api/audit_trail.py ``receipt``).

It prints the writer's records/s each way (medians over ``--rounds``), the ratios, and the time one receipt takes.
The issue's target is receipts ÷ waited ≥ 0.97: signing, the only work receipts add to a compliance-mode call.

    python bench/receipts.py [--records 3000] [--tokens 100] [--rounds 6]
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

from proctor.api.audit_trail import RECEIPT_WINDOW_S  # noqa: E402
from proctor.audit import FORMAT  # noqa: E402
from proctor.audit.chain import load_or_create_signing_key  # noqa: E402
from proctor.audit.receipts import ReceiptSigner  # noqa: E402
from proctor.audit.sink import AuditSink  # noqa: E402
from proctor.audit.sqlite_store import SQLiteAuditStore  # noqa: E402


def body(index: int, tokens: list[dict[str, object]]) -> dict[str, Any]:
    text = "".join(str(token["text"]) for token in tokens)
    return {"format": FORMAT, "kind": "request", "audit_id": f"s{index}", "request_id": f"r{index}",
            "received_ms": 1_764_000_000_000 + index, "caller": {"identity": "bench"}, "status": {"code": "OK"},
            "request": {"prompt": f"Summarise contract {index}.", "sampling": {"seed": str(index)}},
            "output": {"text": text}, "finish": {"reason": "length", "detail": ""}, "tokens": tokens}


def run(directory: Path, bodies: list[dict[str, Any]], mode: str) -> tuple[float, list[float], list[int]]:
    """Records/s from the first submit until every record is committed (and waited on, and its receipt signed, as
    ``mode`` says); the receipts' times, in seconds."""
    sink = AuditSink(SQLiteAuditStore(directory / "log.db"), load_or_create_signing_key(directory / "log.key"),
                     checkpoint_file=directory / "log.checkpoints")
    signer = ReceiptSigner(sink.signer)
    signing: list[float] = []  # per receipt
    sizes: list[int] = []  # receipts signed together
    start = time.perf_counter()
    futures = [sink.submit(record) for record in bodies]

    def wait_each() -> None:
        """As the API does: each commit waited for; with receipts, those committed within RECEIPT_WINDOW_S of the
        first signed as one group."""
        index = 0
        while index < len(futures):
            committed = [futures[index].result()]
            if mode == "receipts":
                time.sleep(RECEIPT_WINDOW_S)
            while index + len(committed) < len(futures) and futures[index + len(committed)].done():
                committed.append(futures[index + len(committed)].result())
            if mode == "receipts":
                begin = time.perf_counter()
                group = bodies[index:index + len(committed)]
                signer.sign_all([signer.receipt(record["audit_id"], record, done, record["output"]["text"])
                                 for record, done in zip(group, committed, strict=True)])
                signing.append((time.perf_counter() - begin) / len(committed))
                sizes.append(len(committed))
            index += len(committed)

    if mode == "alone":
        for future in futures:
            future.result()
    else:
        waiter = threading.Thread(target=wait_each)
        waiter.start()
        waiter.join()
    elapsed = time.perf_counter() - start
    sink.close()
    return len(bodies) / elapsed, signing, sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    lists = token_lists(64, args.tokens)
    bodies = [body(index, lists[index % len(lists)]) for index in range(args.records)]
    modes = ["alone", "waited", "receipts"]
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    signing: list[float] = []
    groups: list[int] = []
    for round_ in range(args.rounds):
        for mode in modes[round_ % 3:] + modes[:round_ % 3]:
            with tempfile.TemporaryDirectory() as scratch:
                rate, times, sizes = run(Path(scratch), bodies, mode)
            rates[mode].append(rate)
            signing += times
            groups += sizes
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{mode} {statistics.median(values):,.0f} records/s"
                                                              for mode, values in rates.items()),
              file=sys.stderr, flush=True)
    alone, waited, receipts = (statistics.median(rates[mode]) for mode in modes)
    print(f"\n{args.records} records of {args.tokens} tokens, {args.rounds} rounds (medians)\n")
    print("| writer | records/s |\n|---|---:|")
    for mode in modes:
        print(f"| {mode} | {statistics.median(rates[mode]):,.0f} |")
    print(f"\nreceipts / waited: {receipts / waited:.3f} (target >= 0.97); receipts / alone: {receipts / alone:.3f}; "
          f"one receipt (digests and its share of a group's signature): median {statistics.median(signing) * 1e6:.1f} "
          f"µs; receipts signed together: median {statistics.median(groups):.0f}, mean {statistics.mean(groups):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
