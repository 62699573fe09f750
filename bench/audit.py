"""Audit trail cost: throughput with the full token-level audit vs audit off, and verify speed.

1. **Throughput** — two servers in this process on the real default model, one auditing every
   call (top-5 alternatives per token, compliance mode: each response waits for its committed
   record, SQLite WAL + synchronous=FULL), one with the audit off. The same prompts, greedy,
   alternating between the two, through gRPC. Prints median tokens/s and the ratio.
2. **Writer and verify speed** — a synthetic log of ``--records`` records of ``--tokens`` tokens
   each (every token with 5 alternatives, ~45 KB of canonical JSON at 100 tokens), submitted at once
   to the real sink (canonical JSON, zstd, hash chain, a signed checkpoint every 1000 records, SQLite
   WAL + ``synchronous=FULL`` commits in batches): records/s from the first submit until every record
   is committed; then ``verify_log`` over it (and over the records the servers wrote): records/s,
   with threads in this process and with one process per core (``audit/verify_parallel.py``).
   The tokens look like the model's: texts of random entries of the real vocabulary and log
   probabilities with all their digits, different in every one of 256 token lists the records take
   in turn (so compression sees what it would in a real log; building them is outside the timing).
   ``--skip-throughput`` runs only this part.

With ``--audit-encryption subject`` the audited server seals every record (audit/sealing.py), each request naming a
new subject, so each call makes its subject's key (audit/keystore.py: the file lock, the synced key, entry and
index files) before its record is written.

    python bench/audit.py [--rounds 5] [--new-tokens 64] [--records 20000] [--tokens 100] [--skip-throughput]
                          [--audit-encryption subject]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

from prompts import PROMPTS  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from proctor.audit import FORMAT  # noqa: E402
from proctor.audit.chain import load_or_create_signing_key  # noqa: E402
from proctor.audit.sink import AuditSink  # noqa: E402
from proctor.audit.sqlite_store import SQLiteAuditStore  # noqa: E402
from proctor.audit.verify import VerifyResult, verify_log  # noqa: E402
from proctor.audit.verify_parallel import process_count  # noqa: E402
from proctor.config import DEFAULT_MODEL_NAME, Settings, default_model_store  # noqa: E402


def token_lists(count: int, tokens: int) -> list[list[dict[str, object]]]:
    """``count`` different per-token audit lists of ``tokens`` steps, as the engine writes them."""
    vocabulary = Tokenizer.from_file(str(default_model_store() / DEFAULT_MODEL_NAME / "tokenizer.json"))
    rng = random.Random(13)
    lists = []
    for _ in range(count):
        steps = []
        for step in range(tokens):
            ids = rng.sample(range(vocabulary.get_vocab_size()), 6)
            logprobs = sorted((-rng.expovariate(1.0) for _ in ids), reverse=True)
            steps.append({"step": step, "id": ids[0], "text": vocabulary.decode([ids[0]]), "logprob": logprobs[0],
                          "final_logprob": logprobs[0], "allowed": None, "removed_by": "",
                          "top": [{"id": i, "text": vocabulary.decode([i]), "logprob": p}
                                  for i, p in zip(ids[1:], logprobs[1:], strict=True)]})
        lists.append(steps)
    return lists


def synthetic_log(directory: Path, records: int, tokens: int) -> tuple[SQLiteAuditStore, float]:
    store = SQLiteAuditStore(directory / "synthetic.db")
    sink = AuditSink(store, load_or_create_signing_key(directory / "synthetic.key"),
                     checkpoint_file=directory / "synthetic.checkpoints")
    lists = token_lists(256, tokens)
    start = time.perf_counter()
    futures = [sink.submit({"format": FORMAT, "kind": "request", "audit_id": f"s{i}", "request_id": f"r{i}",
                            "received_ms": 1_764_000_000_000 + i, "caller": {"identity": "bench"},
                            "status": {"code": "OK"}, "finish": {"reason": "length", "detail": ""},
                            "tokens": lists[i % len(lists)]}) for i in range(records)]
    for future in futures:
        future.result()
    sink.close()
    return SQLiteAuditStore(directory / "synthetic.db", readonly=True), time.perf_counter() - start


def throughput(args: argparse.Namespace, directory: Path) -> tuple[dict[str, list[float]], VerifyResult]:
    """tokens/s with the audit on and off, alternating; and the verify result of the audited server's log."""
    from proctor.app import BackgroundServer  # here: verify's spawned processes import this module, not torch
    from proctor_client import ProctorClient

    base = {"port": 0, "warmup": True}
    sealed = {"audit_encryption": "subject"} if args.audit_encryption == "subject" else {}
    audited = BackgroundServer(Settings.load({**base, "audit_db": str(directory / "audit.db"), **sealed})).start()
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
                                                   min_new_tokens=args.new_tokens, temperature=0,
                                                   subject_id=f"subject-{round_}-{number}" if sealed else "")
                        rates[mode].append(response.usage.completion_tokens / (time.perf_counter() - begin))
                print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
                    f"{m} {statistics.median(r):.1f} tok/s" for m, r in rates.items()), file=sys.stderr, flush=True)
    finally:
        audited.stop()
        plain.stop()
    real = verify_log(SQLiteAuditStore(directory / "audit.db", readonly=True),
                      checkpoint_file=directory / "audit.db.checkpoints")
    assert real.ok, real.problem
    return rates, real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--skip-throughput", action="store_true", help="only the writer and verify speed")
    parser.add_argument("--audit-encryption", choices=["off", "subject"], default="off",
                        help="subject: the audited server seals each record under its subject's key of the day, every "
                             "request a new subject (a new key: the key store's file lock and synced files)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="proctor-audit-bench-") as scratch:  # ~1.3 GB at 100k records
        run_all(args, Path(scratch))


def run_all(args: argparse.Namespace, directory: Path) -> None:
    if not args.skip_throughput:
        rates, real = throughput(args, directory)
        on_rate, off_rate = statistics.median(rates["audit on"]), statistics.median(rates["audit off"])
        print(f"\nAudit trail, greedy, {args.new_tokens} new tokens, {len(PROMPTS)} prompts x {args.rounds} rounds, "
              f"through gRPC (`python bench/audit.py --rounds {args.rounds} --new-tokens {args.new_tokens} "
              f"--records {args.records} --tokens {args.tokens} --audit-encryption {args.audit_encryption}`):\n")
        print("| audit | tokens/s (median) | vs off |")
        print("|---|---|---|")
        print(f"| off | {off_rate:.1f} | 1.00x |")
        sealing = ", sealed, a new subject (key) each call" if args.audit_encryption == "subject" else ""
        print(f"| on: every token, top-5 alternatives, compliance mode, SQLite FULL{sealing} | {on_rate:.1f} | "
              f"{on_rate / off_rate:.2f}x |")
        print(f"\nVerify: {real.records} real records in {real.seconds * 1000:.0f} ms "
              f"({real.records / real.seconds:,.0f} records/s).")
    store, write_s = synthetic_log(directory, args.records, args.tokens)
    stored = store.get("s0")
    assert stored is not None
    verified: dict[int, list[float]] = {1: [], process_count(): []}
    for _ in range(3):  # alternating: threads in this process, then one process per core
        for processes, rates_v in verified.items():
            run = verify_log(store, checkpoint_file=directory / "synthetic.checkpoints", processes=processes)
            assert run.ok and run.records == args.records, run
            rates_v.append(run.records / run.seconds)
    print(f"\nSynthetic log: {args.records} records x {args.tokens} tokens "
          f"(~{len(stored.record_json()) / 1000:.0f} KB of JSON each, {len(stored.body) / 1000:.0f} KB stored; "
          f"{run.checkpoints} signed checkpoints): written at {args.records / write_s:,.0f} records/s; verified at "
          + "; ".join(f"{statistics.median(rates_v):,.0f} records/s with "
                      f"{'threads' if processes == 1 else f'{processes} processes'} "
                      f"(median of 3: {', '.join(f'{r:,.0f}' for r in sorted(rates_v))})"
                      for processes, rates_v in verified.items()) + ".")


if __name__ == "__main__":
    main()
