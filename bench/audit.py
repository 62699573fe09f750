"""Audit trail cost: throughput with the full token-level audit vs audit off, and verify speed.

1. **Throughput** — two servers in this process on the real default model, one auditing every
   call (top-5 alternatives per token, compliance mode: each response waits for its committed
   record, SQLite WAL + synchronous=FULL), one with the audit off. The same prompts, greedy,
   alternating between the two, through gRPC. Prints median tokens/s and the ratio.
2. **Verify speed** — ``verify_log`` over the records just written, plus a synthetic log of
   ``--records`` records of ``--tokens`` tokens each (written through the real sink): records/s.

    python bench/audit.py [--rounds 5] [--new-tokens 64] [--records 20000] [--tokens 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

from prompts import PROMPTS  # noqa: E402

from proctor.app import BackgroundServer  # noqa: E402
from proctor.audit.chain import load_or_create_signing_key  # noqa: E402
from proctor.audit.sink import AuditSink  # noqa: E402
from proctor.audit.sqlite_store import SQLiteAuditStore  # noqa: E402
from proctor.audit.verify import verify_log  # noqa: E402
from proctor.config import Settings  # noqa: E402
from proctor_client import ProctorClient  # noqa: E402


def synthetic_log(directory: Path, records: int, tokens: int) -> tuple[SQLiteAuditStore, float]:
    store = SQLiteAuditStore(directory / "synthetic.db")
    sink = AuditSink(store, load_or_create_signing_key(directory / "synthetic.key"),
                     checkpoint_file=directory / "synthetic.checkpoints")
    token = {"step": 0, "id": 7042, "text": " Paris", "logprob": -0.258, "final_logprob": -0.258, "allowed": None,
             "removed_by": "", "top": [{"id": 7042 + i, "text": " x", "logprob": -1.5 - i} for i in range(5)]}
    start = time.perf_counter()
    futures = [sink.submit({"format": "proctor.audit/1", "kind": "request", "audit_id": f"s{i}", "request_id": f"r{i}",
                            "received_ms": 1_764_000_000_000 + i, "caller": {"identity": "bench"},
                            "status": {"code": "OK"}, "finish": {"reason": "length", "detail": ""},
                            "tokens": [{**token, "step": s} for s in range(tokens)]}) for i in range(records)]
    for future in futures:
        future.result()
    sink.close()
    return SQLiteAuditStore(directory / "synthetic.db", readonly=True), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--tokens", type=int, default=100)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="proctor-audit-bench-"))
    base = {"port": 0, "warmup": True}
    audited = BackgroundServer(Settings.load({**base, "audit_db": str(directory / "audit.db")})).start()
    plain = BackgroundServer(Settings.load({**base, "audit": False})).start()
    rates: dict[str, list[float]] = {"audit on": [], "audit off": []}
    try:
        with ProctorClient(audited.address, timeout_s=600) as on, ProctorClient(plain.address, timeout_s=600) as off:
            for round_ in range(args.rounds):
                for number, prompt in enumerate(PROMPTS):
                    order = [("audit on", on), ("audit off", off)]
                    for mode, client in order if (round_ + number) % 2 == 0 else order[::-1]:
                        begin = time.perf_counter()
                        response = client.generate(prompt, max_new_tokens=args.new_tokens,
                                                   min_new_tokens=args.new_tokens, temperature=0)
                        rates[mode].append(response.usage.completion_tokens / (time.perf_counter() - begin))
                print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
                    f"{m} {statistics.median(r):.1f} tok/s" for m, r in rates.items()), file=sys.stderr, flush=True)
    finally:
        audited.stop()
        plain.stop()
    real = verify_log(SQLiteAuditStore(directory / "audit.db", readonly=True),
                      checkpoint_file=directory / "audit.db.checkpoints")
    assert real.ok, real.problem
    store, write_s = synthetic_log(directory, args.records, args.tokens)
    synthetic = verify_log(store, checkpoint_file=directory / "synthetic.checkpoints")
    assert synthetic.ok, synthetic.problem
    on_rate, off_rate = statistics.median(rates["audit on"]), statistics.median(rates["audit off"])
    print(f"\nAudit trail, greedy, {args.new_tokens} new tokens, {len(PROMPTS)} prompts x {args.rounds} rounds, "
          f"through gRPC (`python bench/audit.py --rounds {args.rounds} --new-tokens {args.new_tokens} "
          f"--records {args.records} --tokens {args.tokens}`):\n")
    print("| audit | tokens/s (median) | vs off |")
    print("|---|---|---|")
    print(f"| off | {off_rate:.1f} | 1.00x |")
    print(f"| on: every token, top-5 alternatives, compliance mode, SQLite FULL | {on_rate:.1f} | "
          f"{on_rate / off_rate:.2f}x |")
    print(f"\nVerify: {real.records} real records in {real.seconds * 1000:.0f} ms; synthetic log of "
          f"{synthetic.records} records x {args.tokens} tokens: written at {args.records / write_s:,.0f} records/s, "
          f"verified at {synthetic.records / synthetic.seconds:,.0f} records/s "
          f"({synthetic.checkpoints} signed checkpoints).")


if __name__ == "__main__":
    main()
