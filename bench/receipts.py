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

With ``--keystore-before REV`` (issue 54: the key store's file lock and synced files), three more modes seal each
record first as the API does with ``--audit-encryption subject`` (its subject's key of the day from the key store,
then AES-GCM; api/audit_trail.py ``_sealed``, in a pool of ``--sealers`` threads as ``asyncio.to_thread`` runs it),
a new subject every ``--subject-every`` records, then wait on it:

- ``sealed-before``: with the key store of git revision REV (``git show REV:service/proctor/audit/keystore.py``);
- ``sealed``: with this one;
- ``sealed-no-dir-sync``: with this one, its directory sync left out (the locks, the entry files and the walk's
  bookkeeping without the fsync that makes a new key durable before it seals anything).

The target there is ÷ sealed-before ≥ 0.97. It also prints what ``key_for`` takes in one thread alone, a new key
and a known one, with each key store.

    python bench/receipts.py [--records 3000] [--tokens 100] [--rounds 6] [--modes alone,waited,receipts]
                             [--keystore-before REV [--subject-every 10] [--sealers 6]]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

from audit import token_lists  # noqa: E402

from proctor.api.audit_trail import RECEIPT_WINDOW_S  # noqa: E402
from proctor.audit import FORMAT, keystore  # noqa: E402
from proctor.audit.chain import load_or_create_signing_key  # noqa: E402
from proctor.audit.keystore import FileKeyStore  # noqa: E402
from proctor.audit.receipts import ReceiptSigner  # noqa: E402
from proctor.audit.sealing import seal  # noqa: E402
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


def keystore_at(revision: str) -> type[FileKeyStore]:
    """``FileKeyStore`` as git revision ``revision`` had it (a module of its own, beside this one)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:service/proctor/audit/keystore.py"],
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("keystore_before")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{revision}:service/proctor/audit/keystore.py", "exec"), module.__dict__)
    store: type[FileKeyStore] = module.FileKeyStore
    return store


def run_sealed(directory: Path, bodies: list[dict[str, Any]], store: type[FileKeyStore], every: int,
               sealers: int) -> float:
    """Records/s from the first record sealed until every one is committed and waited on, each sealed first as the
    API seals (a new subject every ``every`` records) by a pool of ``sealers`` threads (the API's ``to_thread``)."""
    sink = AuditSink(SQLiteAuditStore(directory / "log.db"), load_or_create_signing_key(directory / "log.key"),
                     checkpoint_file=directory / "log.checkpoints")
    keys = store(directory / "keys")

    def sealed(index: int) -> Any:
        key_id, key = keys.key_for(f"subject-{index // every}", "2026-12-05", "bench")
        return sink.submit(seal(bodies[index], key_id, key))

    start = time.perf_counter()
    with ThreadPoolExecutor(sealers) as pool:
        for submitted in [pool.submit(sealed, index) for index in range(len(bodies))]:
            submitted.result().result()  # as the API does: each commit waited for
    elapsed = time.perf_counter() - start
    sink.close()
    return len(bodies) / elapsed


@contextlib.contextmanager
def directory_sync(on: bool) -> Iterator[None]:
    """This key store with its directory sync (a new key durable before it seals anything) left out unless ``on``:
    what the locks cost apart from it."""
    kept = keystore._sync_directory
    if not on:
        keystore._sync_directory = lambda directory: None
    try:
        yield
    finally:
        keystore._sync_directory = kept


def key_for_costs(store: type[FileKeyStore], new: int = 200, known: int = 5000) -> tuple[float, float]:
    """One thread alone: the median seconds of ``key_for`` making a new subject's key, and finding a known one."""
    with tempfile.TemporaryDirectory() as scratch:
        keys = store(Path(scratch))
        made, found = [], []
        for number in range(new):
            begin = time.perf_counter()
            keys.key_for(f"subject-{number}", "2026-12-05", "bench")
            made.append(time.perf_counter() - begin)
        for number in range(known):
            begin = time.perf_counter()
            keys.key_for(f"subject-{number % new}", "2026-12-05", "bench")
            found.append(time.perf_counter() - begin)
    return statistics.median(made), statistics.median(found)


SEALED = {"sealed-before": True, "sealed": True, "sealed-no-dir-sync": False}  # mode -> its directory sync on


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--modes", default="", help="comma-separated (default: alone,waited,receipts, and with "
                                                    "--keystore-before sealed-before,sealed,sealed-no-dir-sync)")
    parser.add_argument("--keystore-before", metavar="REV", default="",
                        help="seal the records with the key store of git revision REV and with this one")
    parser.add_argument("--subject-every", type=int, default=10, help="sealed modes: a new subject every N records")
    parser.add_argument("--sealers", type=int, default=min(32, (os.cpu_count() or 1) + 4),
                        help="sealed modes: threads sealing (default: as many as asyncio.to_thread's pool)")
    args = parser.parse_args()
    lists = token_lists(64, args.tokens)
    bodies = [body(index, lists[index % len(lists)]) for index in range(args.records)]
    modes = args.modes.split(",") if args.modes else \
        ["alone", "waited", "receipts", *(SEALED if args.keystore_before else ())]
    before = keystore_at(args.keystore_before) if args.keystore_before else None
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    signing: list[float] = []
    groups: list[int] = []
    for round_ in range(args.rounds):
        for mode in modes[round_ % len(modes):] + modes[:round_ % len(modes)]:
            with tempfile.TemporaryDirectory() as scratch:
                if mode in SEALED:
                    store = before if mode == "sealed-before" and before is not None else FileKeyStore
                    with directory_sync(SEALED[mode]):
                        rate = run_sealed(Path(scratch), bodies, store, args.subject_every, args.sealers)
                else:
                    rate, times, sizes = run(Path(scratch), bodies, mode)
                    signing += times
                    groups += sizes
            rates[mode].append(rate)
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{mode} {statistics.median(values):,.0f} records/s"
                                                              for mode, values in rates.items()),
              file=sys.stderr, flush=True)
    report(args, rates, signing, groups)
    if before is not None:
        for name, store in (("before", before), ("this", FileKeyStore), ("before", before), ("this", FileKeyStore)):
            made, found = key_for_costs(store)
            print(f"key_for alone, {name} key store: a new key {made * 1e3:.2f} ms, a known one {found * 1e6:.1f} µs "
                  "(medians)")
    return 0


def report(args: argparse.Namespace, rates: dict[str, list[float]], signing: list[float], groups: list[int]) -> None:
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    print(f"\n{args.records} records of {args.tokens} tokens, {args.rounds} rounds (medians)\n")
    print("| writer | records/s |\n|---|---:|")
    for mode, rate in median.items():
        print(f"| {mode} | {rate:,.0f} |")
    if {"alone", "waited", "receipts"} <= median.keys() and signing:
        print(f"\nreceipts / waited: {median['receipts'] / median['waited']:.3f} (target >= 0.97); receipts / alone: "
              f"{median['receipts'] / median['alone']:.3f}; one receipt (digests and its share of a group's "
              f"signature): median {statistics.median(signing) * 1e6:.1f} µs; receipts signed together: median "
              f"{statistics.median(groups):.0f}, mean {statistics.mean(groups):.1f}")
    if "sealed-before" in median:
        print(f"\na new subject every {args.subject_every} records, {args.sealers} threads sealing; against "
              f"sealed-before ({args.keystore_before}): "
              + ", ".join(f"{mode} {median[mode] / median['sealed-before']:.3f}" for mode in SEALED
                          if mode in median and mode != "sealed-before") + " (target >= 0.97)")


if __name__ == "__main__":
    sys.exit(main())
