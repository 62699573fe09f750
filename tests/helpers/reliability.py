"""Reliability scenarios (issue 14), shared by the fast tests (tests/integration/test_reliability_real.py)
and the full-size benchmark (bench/reliability.py): each drives a real ``proctor serve`` process over
gRPC and returns what it saw, for the caller to assert on or print.

- ``overload``: far more calls at once than the server can hold: every excess call must be refused with
  RESOURCE_EXHAUSTED and a RetryInfo hint, quickly, and none may fail otherwise.
- ``sigterm_under_load``: SIGTERM while streams run: health NOT_SERVING visible to a poller through the
  drain notice before the port closes, the running streams finish, every response is in the audit log.
- ``kill_under_load``: kill -9 while calls run, then restart on the same audit log: it verifies, and
  every response a client received is in it with all its tokens.
- ``postgres_restart_under_load``: PostgreSQL stopped and started under a server auditing into it: calls
  fail closed meanwhile, resume after, and every response a client received is in the log.
- ``soak``: concurrent streams for a while: errors, and resident memory after warm-up vs at the end.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proctor.audit.store import AuditStore
from proctor_client import AsyncProctorClient, ProctorClient, ProctorError

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ("Write a short note about the sea.", "List three colours and say why you like them.",
           "Explain what a contract is in two sentences.", "Describe a quiet morning in a small town.")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServedProcess:
    """``proctor serve`` as a child process on free ports (main and health-only), logging to a file."""

    def __init__(self, directory: Path, *extra: str, audit_db: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.directory = directory
        self.port, self.health_port = free_port(), free_port()
        self.audit_db = audit_db or directory / "audit.db"
        env = {**os.environ, **(env or {}),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT / "clients/python/src")])}
        self.log_path = directory / f"server-{self.port}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "proctor.cli", "serve", "--port", str(self.port), "--health-port",
                 str(self.health_port), "--audit-db", str(self.audit_db), "--no-reflection",
                 "--drain-notice", "0", *extra],  # (a later --drain-notice in extra wins)
                stdout=log, stderr=subprocess.STDOUT, env=env)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 300) -> None:
        """Until the server is SERVING; raises with its log's end when it exits first."""
        end = time.monotonic() + timeout_s
        while health(self.address) != "SERVING":
            if self.process.poll() is not None:
                raise RuntimeError(f"proctor serve exited with {self.process.returncode}:\n{self.log[-2000:]}")
            if time.monotonic() > end:
                raise TimeoutError(f"proctor serve not ready after {timeout_s:.0f} s:\n{self.log[-2000:]}")
            time.sleep(0.2)

    def rss_mb(self) -> float:
        """Resident memory now (VmRSS), MB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self, timeout_s: float = 60) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)


def access_durations_ms(log: str, code: str) -> list[float]:
    """Server-side durations (the access log's duration_ms: the call's arrival at the interceptors to its
    status) of the calls that ended with ``code``."""
    return [float(line.rsplit("duration_ms=", 1)[1].split()[0]) for line in log.splitlines()
            if "proctor.access" in line and f" code={code} " in line and "duration_ms=" in line]


def health(address: str, service: str = "", timeout_s: float = 1.0) -> str:
    """The health status name, or the gRPC code name when the check itself fails."""
    with grpc.insecure_channel(address) as channel:
        try:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=timeout_s).status
        except grpc.RpcError as exc:
            return exc.code().name  # type: ignore[attr-defined, no-any-return]
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)


@dataclass
class Outcome:
    """One call: its gRPC code name, seconds to its answer, and what came back."""

    code: str
    seconds: float
    audit_id: str = ""
    token_ids: tuple[int, ...] = ()
    retry_hint: bool = False
    message: str = ""
    retry_after_s: float = 0.0


async def _call(client: AsyncProctorClient, prompt: str, tokens: int, request_id: str) -> Outcome:
    start = time.perf_counter()
    try:
        response = await client.generate(prompt, max_new_tokens=tokens, temperature=0, ignore_eos=True,
                                         request_id=request_id)
    except ProctorError as exc:
        return Outcome(exc.code.name, time.perf_counter() - start, retry_hint=exc.retry_after_s is not None,
                       message=exc.message, retry_after_s=exc.retry_after_s or 0.0)
    return Outcome("OK", time.perf_counter() - start, response.audit_id, tuple(response.token_ids))


def count_codes(outcomes: list[Outcome]) -> dict[str, int]:
    """How many of the calls ended with each code."""
    return dict(collections.Counter(outcome.code for outcome in outcomes))


# --- overload ----------------------------------------------------------------------------------------------
@dataclass
class OverloadResult:
    calls: int
    outcomes: list[Outcome]

    def by_code(self) -> dict[str, int]:
        return count_codes(self.outcomes)

    @property
    def refusals(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.code == "RESOURCE_EXHAUSTED"]


def overload(address: str, calls: int, tokens: int = 24, seconds: float = 0.0, ramp_s: float = 0.0) -> OverloadResult:
    """``calls`` clients at once (no client retries), their starts spread over ``ramp_s``. With ``seconds``,
    each keeps calling until then, waiting out the server's retry hint after a refusal (a well-behaved
    client under sustained overload); else each sends one call."""
    async def client_loop(client: AsyncProctorClient, number: int, end: float) -> list[Outcome]:
        await asyncio.sleep(ramp_s * number / max(1, calls))
        outcomes = []
        while True:
            outcome = await _call(client, PROMPTS[number % len(PROMPTS)], tokens, f"overload-{number}-{len(outcomes)}")
            outcomes.append(outcome)
            if time.monotonic() >= end:
                return outcomes
            if outcome.code == "RESOURCE_EXHAUSTED":
                await asyncio.sleep(outcome.retry_after_s * random.uniform(0.5, 1.5))  # the hint, jittered

    async def run() -> list[Outcome]:
        end = time.monotonic() + seconds
        async with AsyncProctorClient(address, timeout_s=600, retries=0) as client:
            per_client = await asyncio.gather(*(client_loop(client, i, end) for i in range(calls)))
        return [outcome for outcomes in per_client for outcome in outcomes]
    return OverloadResult(calls, asyncio.run(run()))


# --- load in the background ----------------------------------------------------------------------------
@dataclass
class Load:
    """Closed-loop generate calls from ``streams`` threads until stopped; every outcome kept."""

    address: str
    streams: int
    tokens: int
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for number in range(self.streams):
            thread = threading.Thread(target=self._run, args=(number,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, number: int) -> None:
        with ProctorClient(self.address, timeout_s=600, retries=0) as client:
            sent = 0
            while not self._stop.is_set():
                sent += 1
                start = time.perf_counter()
                try:
                    response = client.generate(PROMPTS[(number + sent) % len(PROMPTS)], max_new_tokens=self.tokens,
                                               temperature=0, ignore_eos=True, request_id=f"load-{number}-{sent}")
                    outcome = Outcome("OK", time.perf_counter() - start, response.audit_id, tuple(response.token_ids))
                except ProctorError as exc:
                    outcome = Outcome(exc.code.name, time.perf_counter() - start, message=exc.message)
                self.outcomes.append(outcome)
                if outcome.code in ("UNAVAILABLE", "CANCELLED") and self._stop.wait(0.2):
                    return

    def stop(self, timeout_s: float = 120) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        return self.outcomes


# --- the audit log after the fact ---------------------------------------------------------------------------
@dataclass
class LogCheck:
    verified: bool
    problem: str
    records: int
    missing: list[str]  # audit ids of responses a client received that are not in the log
    mismatched: list[str]  # ... whose recorded tokens differ from what the client received


def check_log(audit_db: Path, received: list[Outcome]) -> LogCheck:
    from proctor.audit.sqlite_store import SQLiteAuditStore

    return check_store(SQLiteAuditStore(audit_db, readonly=True), Path(f"{audit_db}.checkpoints"), received)


def check_store(store: AuditStore, checkpoints: Path, received: list[Outcome]) -> LogCheck:
    """``verify_log`` over the store, and every response a client received looked up in it."""
    from proctor.audit.verify import verify_log

    result = verify_log(store, checkpoint_file=checkpoints)
    missing, mismatched = [], []
    for outcome in received:
        if outcome.code != "OK":
            continue
        row = store.get(outcome.audit_id)
        if row is None:
            missing.append(outcome.audit_id)
        elif tuple(t["id"] for t in json.loads(row.record_json())["tokens"]) != outcome.token_ids:
            mismatched.append(outcome.audit_id)
    return LogCheck(result.ok, result.problem or "", result.records, missing, mismatched)


# --- SIGTERM under load ------------------------------------------------------------------------------------------
@dataclass
class SigtermResult:
    exit_code: int | None
    timeline: list[tuple[float, str, str]]  # (seconds after SIGTERM, main port status, health port status)
    not_serving_s: float  # how long NOT_SERVING was seen on the main port before it stopped answering
    outcomes: list[Outcome]
    log: LogCheck


def sigterm_under_load(directory: Path, streams: int, tokens: int, notice_s: float, *extra: str) -> SigtermResult:
    served = ServedProcess(directory, "--drain-notice", str(notice_s), *extra)
    try:
        served.wait_ready()
        load = Load(served.address, streams, tokens).start()
        time.sleep(2.0)  # calls in flight
        served.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        timeline = []
        while served.process.poll() is None and time.monotonic() - signalled < notice_s + 120:
            timeline.append((time.monotonic() - signalled, health(served.address, timeout_s=0.5),
                             health(f"127.0.0.1:{served.health_port}", timeout_s=0.5)))
            time.sleep(0.05)
        outcomes = load.stop()
        exit_code = served.process.wait(timeout=60)
    finally:
        served.stop()
    seen = [at for at, status, _ in timeline if status == "NOT_SERVING"]
    return SigtermResult(exit_code, timeline, (seen[-1] - seen[0]) if seen else 0.0, outcomes,
                         check_log(served.audit_db, outcomes))


# --- kill -9 under load ----------------------------------------------------------------------------------------
@dataclass
class KillRound:
    killed_after_s: float
    outcomes: list[Outcome]
    log: LogCheck
    restart_s: float


def kill_under_load(directory: Path, rounds: int, streams: int, tokens: int, seed: int = 14,
                    *extra: str) -> list[KillRound]:
    """Each round: start on the same audit log, load, kill -9 after a random 1-4 s, then check the log
    with the next start (a restart must open it) and ``verify_log``."""
    rng = random.Random(seed)
    audit_db = directory / "audit.db"
    results: list[KillRound] = []
    received: list[Outcome] = []
    for _ in range(rounds):
        served = ServedProcess(directory, *extra, audit_db=audit_db)
        try:
            started = time.monotonic()
            served.wait_ready()
            restart_s = time.monotonic() - started
            load = Load(served.address, streams, tokens).start()
            delay = rng.uniform(1.0, 4.0)
            time.sleep(delay)
            served.process.kill()
            served.process.wait(timeout=30)
            outcomes = load.stop()
        finally:
            served.stop()
        received.extend(outcomes)
        results.append(KillRound(delay, outcomes, check_log(audit_db, received), restart_s))
    return results


# --- PostgreSQL restarted under load ------------------------------------------------------------------------------
@dataclass
class PostgresRestartResult:
    before: list[Outcome]  # calls that ended before PostgreSQL stopped
    during: list[Outcome]  # ... while it was stopped or starting
    after: list[Outcome]  # ... after it answered again
    log: LogCheck


def postgres_restart_under_load(directory: Path, owner_dsn: str, restart: tuple[list[str], list[str]],
                                streams: int, tokens: int, down_s: float, after_s: float) -> PostgresRestartResult:
    """A server auditing into PostgreSQL (its own schema, the appender role) under load; PostgreSQL is
    stopped for ``down_s`` and started again with the ``restart`` commands (stop, start). Every call that
    ended OK must be in the log, which must verify; while it is down calls must fail closed."""
    from helpers.postgres import audit_schema
    from proctor.audit.postgres_store import PostgresAuditStore

    _, app_dsn = audit_schema(owner_dsn)
    checkpoints = directory / "pg.checkpoints"
    served = ServedProcess(directory, "--audit-dsn", app_dsn, "--audit-signing-key", str(directory / "pg.key"),
                           env={"PROCTOR_AUDIT_CHECKPOINT_FILE": str(checkpoints)})
    try:
        served.wait_ready()
        load = Load(served.address, streams, tokens).start()
        time.sleep(3.0)
        stopped_at = len(load.outcomes)
        subprocess.run(restart[0], check=True, capture_output=True, timeout=120)
        time.sleep(down_s)
        subprocess.run(restart[1], check=True, capture_output=True, timeout=120)
        started_at = len(load.outcomes)
        time.sleep(after_s)
        outcomes = load.stop()
    finally:
        served.stop()
    return PostgresRestartResult(outcomes[:stopped_at], outcomes[stopped_at:started_at], outcomes[started_at:],
                                 check_store(PostgresAuditStore(app_dsn), checkpoints, outcomes))


# --- soak -----------------------------------------------------------------------------------------------------
@dataclass
class SoakResult:
    seconds: float
    outcomes: list[Outcome]
    rss_after_warmup_mb: float
    rss_end_mb: float
    samples: list[tuple[float, float]]  # (seconds, VmRSS MB)


def soak(directory: Path, streams: int, tokens: int, seconds: float, warmup_s: float, *extra: str) -> SoakResult:
    served = ServedProcess(directory, *extra)
    try:
        served.wait_ready()
        load = Load(served.address, streams, tokens).start()
        start, samples = time.monotonic(), []
        warm = 0.0
        while (elapsed := time.monotonic() - start) < seconds:
            samples.append((elapsed, served.rss_mb()))
            if not warm and elapsed >= warmup_s:
                warm = samples[-1][1]
            time.sleep(min(5.0, max(0.5, seconds / 100)))
        end = served.rss_mb()
        outcomes = load.stop()
    finally:
        served.stop()
    return SoakResult(seconds, outcomes, warm or samples[0][1], end, samples)
