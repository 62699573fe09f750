"""Reliability suite (issue 14), full size, with figures for bench/README.md ("Reliability").

Every scenario drives a real ``proctor serve`` process (the real model, audit on in compliance mode,
SQLite) over gRPC; the scenarios live in tests/helpers/reliability.py and tests/helpers/fuzz.py, where
the fast tests (tests/integration/test_reliability_real.py) run them small.

- **soak**: ``--soak-streams`` closed-loop streams for ``--soak-s`` seconds: errors, and VmRSS after
  ``--warmup-s`` vs at the end (target: 0 errors, growth <= 5%).
- **overload**: 3x as many clients as the server holds (``--max-batch-size`` + ``--max-waiting``) for
  ``--overload-s``, each waiting out the retry hint after a refusal: codes, and how fast the excess is
  refused, in the server (its access log) and as the client saw it (target: every excess call
  RESOURCE_EXHAUSTED + RetryInfo within 50 ms, 0 INTERNAL).
- **sigterm**: SIGTERM under load: how long health reports NOT_SERVING before the port closes (target:
  at least the drain notice), in-flight calls finished, records lost (target: 0).
- **kill**: kill -9 under load, ``--kill-rounds`` times on one audit log: after each, the log verifies and
  holds every response a client received, with its tokens (target: every round).
- **pgrestart**: a server auditing into PostgreSQL (the throwaway cluster of ``scripts/postgres.sh``) under
  load; PostgreSQL stopped for ``--pg-down-s`` and started again: calls fail closed while it is down,
  come back by themselves after, and every response a client received is in the log, which verifies.
- **fuzz**: ``--fuzz-examples`` generated requests per RPC (hypothesis over the protobuf descriptors, one
  in eight raw bytes): 0 INTERNAL/UNKNOWN, every INVALID_ARGUMENT with a field violation, healthy after.
- **interleavings** (issue 30): issue 30's exact sequence, then ``--interleavings`` random interleavings of
  bursts, deadlines (before, in and after admission), cancels and disconnects, ``--interleaving-calls`` calls
  each, on 2 rows and 2 waiting places with two callers (one limited to 3 concurrent generations): every
  call ends as its kind allows, every admission counter returns to 0 and an 8-token request is served after
  each (tests/helpers/admission.py).

    python bench/reliability.py [--only soak,overload,sigterm,kill,pgrestart,fuzz] [--soak-s 600] [--soak-streams 32]
        [--kill-rounds 20] [--fuzz-examples 10000] [--interleavings 100] [--interleaving-calls 40]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

import grpc  # noqa: E402
from helpers.admission import (  # noqa: E402
    codes,
    issue30_sequence,
    random_plan,
    run_plan,
    served,
    settled,
    unexpected,
)
from helpers.fuzz import RPCS, FuzzTally, fuzz_rpc  # noqa: E402
from helpers.reliability import (  # noqa: E402
    ServedProcess,
    access_durations_ms,
    count_codes,
    free_port,
    health,
    kill_under_load,
    overload,
    postgres_restart_under_load,
    sigterm_under_load,
    soak,
)

from proctor_client import ProctorClient  # noqa: E402

SCENARIOS = ("soak", "overload", "sigterm", "kill", "pgrestart", "fuzz", "interleavings")
rows: list[tuple[str, str, str, str]] = []  # (scenario, target, measured, met)


def note(scenario: str, target: str, measured: str, met: bool) -> None:
    rows.append((scenario, target, measured, "yes" if met else "**no**"))
    print(f"{scenario}: {measured} ({'met' if met else 'NOT met'}: {target})", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_soak(args: argparse.Namespace, directory: Path) -> None:
    result = soak(directory, args.soak_streams, args.soak_tokens, args.soak_s, args.warmup_s)
    errors = [o for o in result.outcomes if o.code != "OK"]
    growth = result.rss_end_mb / result.rss_after_warmup_mb - 1
    tokens = sum(len(o.token_ids) for o in result.outcomes)
    note("soak", f"{args.soak_streams} streams for {args.soak_s:.0f} s: 0 errors, RSS growth <= 5% after "
         f"{args.warmup_s:.0f} s", f"{len(result.outcomes)} calls, {tokens / result.seconds:.0f} tokens/s, "
         f"{len(errors)} errors {sorted({o.code for o in errors})}; VmRSS {result.rss_after_warmup_mb:.0f} -> "
         f"{result.rss_end_mb:.0f} MB ({growth:+.1%})", not errors and growth <= 0.05)


def run_overload(args: argparse.Namespace, directory: Path) -> None:
    capacity = args.max_batch_size + args.max_waiting
    server = ServedProcess(directory, "--max-batch-size", str(args.max_batch_size),
                           "--max-waiting", str(args.max_waiting))
    try:
        server.wait_ready()
        overload(server.address, capacity, tokens=8)  # warm: the first calls' costs are not the figure
        result = overload(server.address, 3 * capacity, tokens=64, seconds=args.overload_s, ramp_s=2.0)
        served_ms = access_durations_ms(server.log, "RESOURCE_EXHAUSTED")
    finally:
        server.stop()
    refusals = result.refusals
    client_ms = [r.seconds * 1000 for r in refusals]
    codes = result.by_code()
    bad = {code: n for code, n in codes.items() if code not in ("OK", "RESOURCE_EXHAUSTED")}

    def spread(values: list[float]) -> str:
        return (f"p50 {pct(values, 0.5):.1f} / p99 {pct(values, 0.99):.1f} / max {max(values):.1f} ms, "
                f"{sum(v > 50 for v in values)} over 50 ms")

    note("overload", "3x capacity: every excess call RESOURCE_EXHAUSTED + RetryInfo within 50 ms (server side), "
         "0 INTERNAL", f"{result.calls} clients for {args.overload_s:.0f} s on {args.max_batch_size} rows + "
         f"{args.max_waiting} waiting, each waiting out the retry hint: {codes}; "
         f"{sum(not r.retry_hint for r in refusals)} without RetryInfo; refusal time in the server "
         f"{spread(served_ms)}; as the client saw it "
         f"{spread(client_ms)}", not bad and all(r.retry_hint for r in refusals) and pct(served_ms, 0.99) <= 50)


def run_sigterm(args: argparse.Namespace, directory: Path) -> None:
    result = sigterm_under_load(directory, args.sigterm_streams, 96, args.drain_notice_s)
    codes = count_codes(result.outcomes)
    lost = len(result.log.missing) + len(result.log.mismatched)
    note("sigterm", f"NOT_SERVING visible >= the {args.drain_notice_s:.0f} s notice before the port closes; "
         "in-flight calls finish; 0 records lost",
         f"exit {result.exit_code}; NOT_SERVING for {result.not_serving_s:.1f} s on the main port; calls {codes}; "
         f"log {'verifies' if result.log.verified else 'FAILS: ' + result.log.problem}, {lost} responses missing",
         result.exit_code == 0 and result.not_serving_s >= args.drain_notice_s - 0.5 and result.log.verified
         and not lost and "INTERNAL" not in codes)


def run_kill(args: argparse.Namespace, directory: Path) -> None:
    rounds = kill_under_load(directory, args.kill_rounds, args.kill_streams, 24)
    failed = [i for i, r in enumerate(rounds) if not r.log.verified or r.log.missing or r.log.mismatched]
    received = sum(o.code == "OK" for r in rounds for o in r.outcomes)
    restarts = [r.restart_s for r in rounds[1:]]
    note("kill -9", f"{args.kill_rounds} rounds: after each restart the log verifies and holds every response",
         f"{len(rounds) - len(failed)}/{len(rounds)} rounds clean ({received} responses received, "
         f"{rounds[-1].log.records} records); restart to ready p50 {statistics.median(restarts or [0]):.1f} s"
         + (f"; failed rounds {failed}: {rounds[failed[0]].log}" if failed else ""), not failed)


def run_pgrestart(args: argparse.Namespace, directory: Path) -> None:
    script = ["bash", str(ROOT / "scripts" / "postgres.sh")]
    subprocess.run([*script, "start"], check=True, capture_output=True, timeout=300)
    owner = subprocess.run([*script, "dsn"], check=True, capture_output=True, text=True).stdout.strip()
    result = postgres_restart_under_load(directory, owner, ([*script, "stop"], [*script, "start"]),
                                         args.kill_streams, 24, args.pg_down_s, 15.0)

    lost = len(result.log.missing) + len(result.log.mismatched)
    before, during, after = (count_codes(part) for part in (result.before, result.during, result.after))
    verdict = "verifies" if result.log.verified else "FAILS: " + result.log.problem
    note("PostgreSQL restart", f"stopped {args.pg_down_s:.0f} s under load: calls fail closed meanwhile, resume "
         "after, nothing acknowledged lost", f"calls before {before}, while down or starting {during}, "
         f"after {after}; log {verdict} ({result.log.records} records), {lost} received responses missing",
         result.log.verified and not lost and set(during) <= {"OK", "INTERNAL", "UNAVAILABLE"}
         and after.get("OK", 0) > 0)


def run_fuzz(args: argparse.Namespace, directory: Path) -> None:
    """The generating RPCs on one server; the audit RPCs on a second one whose log holds a few records (on
    the first, every fuzzed call adds one, and VerifyLog or an unfiltered export of tens of thousands of
    records per call would make the run hours)."""
    tally = FuzzTally()
    start = time.perf_counter()
    healthy = []
    for part, rpcs in (("generation", [r for r in RPCS if RPCS[r][0].startswith("/proctor.v1.Generation/")]),
                       ("audit", [r for r in RPCS if RPCS[r][0].startswith("/proctor.v1.Audit/")])):
        (directory / part).mkdir()
        server = ServedProcess(directory / part, "--max-new-tokens-limit", "4")
        try:
            server.wait_ready()
            with ProctorClient(server.address, timeout_s=60) as client:  # records for the audit RPCs to find
                for number in range(5):
                    client.generate(f"Record {number}", max_new_tokens=2, temperature=0)
            with grpc.insecure_channel(server.address) as channel:
                for rpc in rpcs:
                    fuzz_rpc(channel, rpc, args.fuzz_examples, tally)
                    print(f"fuzz {rpc}: {tally.codes[rpc]}", file=sys.stderr, flush=True)
            healthy.append(health(server.address))
        finally:
            server.stop()
    total = sum(tally.total(rpc) for rpc in RPCS)
    note("fuzz", f"{args.fuzz_examples:,} generated requests per RPC: 0 INTERNAL/UNKNOWN, every INVALID_ARGUMENT "
         "with a field violation, healthy after",
         f"{total:,} requests over {len(RPCS)} RPCs in {time.perf_counter() - start:.0f} s: "
         + "; ".join(f"{rpc} {dict(sorted(tally.codes[rpc].items()))}" for rpc in RPCS)
         + f"; {len(tally.failures)} broke the oracle; health after: {', '.join(healthy)}",
         not tally.failures and healthy == ["SERVING", "SERVING"])


def run_interleavings(args: argparse.Namespace, directory: Path) -> None:
    tokens = {"svc-a": "bench-token-a", "svc-b": "bench-token-b"}
    callers = directory / "callers.yaml"
    callers.write_text("callers:\n" + "".join(
        f"  - name: {name}\n    token_sha256: {hashlib.sha256(token.encode()).hexdigest()}\n    roles: [generate]\n"
        + ("    limits: {concurrent_streams: 3}\n" if name == "svc-a" else "") for name, token in tokens.items()))
    metadata = [(("authorization", f"Bearer {tokens[name]}"),) for name in sorted(tokens)]
    base = ("--threads", "1", "--max-batch-size", "2", "--max-waiting", "2", "--watchdog-s", "10")
    (directory / "open").mkdir()
    metrics = free_port()
    server = ServedProcess(directory / "open", *base, "--metrics-port", str(metrics))
    try:  # issue 30's sequence, in open mode as reported
        server.wait_ready()
        sequence = issue30_sequence(server.address)
        held = settled(f"127.0.0.1:{metrics}")
    finally:
        server.stop()
    last = sequence[-1]
    note("issue 30 sequence", "the request after the deadlines is served; counters back to 0",
         f"{dict(count_codes(sequence))}; last 8-token request {last.code} in {last.seconds * 1000:.0f} ms; "
         f"counters {'all 0' if not any(held.values()) else held}", last.code == "OK" and not any(held.values()))
    metrics = free_port()
    server = ServedProcess(directory, *base, "--metrics-port", str(metrics), "--callers-file", str(callers))
    rng = random.Random(args.seed)
    failures: list[str] = []
    total: dict[str, int] = {}
    after_ms: list[float] = []
    start = time.perf_counter()
    try:
        server.wait_ready()
        for number in range(args.interleavings):
            results = run_plan(server.address, random_plan(rng, args.interleaving_calls, callers=2), metadata)
            for key, count in codes(results).items():
                total[key] = total.get(key, 0) + count
            held = settled(f"127.0.0.1:{metrics}")
            after = served(server.address, metadata[0])
            after_ms.append(after.seconds * 1000)
            if unexpected(results) or any(held.values()) or after.code != "OK":
                failures.append(f"#{number}: unexpected {unexpected(results)[:3]}, counters {held}, after {after}")
            print(f"interleaving {number + 1}/{args.interleavings}: {dict(codes(results))}; after: {after.code}",
                  file=sys.stderr, flush=True)
        status = health(server.address, "proctor.v1.Generation")
    finally:
        server.stop()
    errors = [line for line in server.log.splitlines() if " ERROR " in line or "Traceback" in line
              or "Segfault" in line or "Fatal Python" in line]
    calls = sum(total.values())
    note("interleavings", f"{args.interleavings} random interleavings: every counter back to 0 and an 8-token "
         "request served after each, no call ending otherwise than its kind allows, nothing logged as an error",
         f"{calls:,} calls in {time.perf_counter() - start:.0f} s: {dict(sorted(total.items()))}; 8-token request "
         f"after each: p50 {pct(after_ms, 0.5):.0f} / max {max(after_ms):.0f} ms; {len(failures)} failed"
         + (f" ({failures[0]})" if failures else "") + f"; health after: {status}; server log: {len(errors)} "
         "ERROR/Traceback/crash lines" + (f" (first: {errors[0][:200]})" if errors else ""),
         not failures and status == "SERVING" and not errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios to run, comma-separated")
    parser.add_argument("--soak-s", type=float, default=600.0)
    parser.add_argument("--soak-streams", type=int, default=32)
    parser.add_argument("--soak-tokens", type=int, default=64)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-waiting", type=int, default=8)
    parser.add_argument("--overload-s", type=float, default=30.0)
    parser.add_argument("--sigterm-streams", type=int, default=8)
    parser.add_argument("--drain-notice-s", type=float, default=5.0)
    parser.add_argument("--kill-rounds", type=int, default=20)
    parser.add_argument("--kill-streams", type=int, default=4)
    parser.add_argument("--pg-down-s", type=float, default=5.0)
    parser.add_argument("--fuzz-examples", type=int, default=10_000)
    parser.add_argument("--interleavings", type=int, default=100)
    parser.add_argument("--interleaving-calls", type=int, default=40)
    parser.add_argument("--seed", type=int, default=30, help="of the interleavings' plans")
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    runners = {"soak": run_soak, "overload": run_overload, "sigterm": run_sigterm, "kill": run_kill,
               "pgrestart": run_pgrestart, "fuzz": run_fuzz, "interleavings": run_interleavings}
    for name in chosen:
        directory = Path(tempfile.mkdtemp(prefix=f"proctor-reliability-{name}-"))
        runners[name](args, directory)
    print(f"\nReliability (`python {' '.join(sys.argv)}`; load average {os.getloadavg()[0]:.1f}):\n")
    print("| scenario | target | measured | met |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
