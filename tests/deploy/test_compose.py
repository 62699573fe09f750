"""The Compose stack (deploy/compose/), run: opt-in (``make compose-check``, or ``PROCTOR_COMPOSE_CHECK=1``).

``podman-compose`` brings up ``postgres``, ``audit-init``, ``proctor-1``, ``proctor-2`` and ``prometheus``
from ``deploy/compose/compose.yaml`` as it is, with fresh secrets from ``make-secrets.sh`` in a temporary
directory (a small override file points the compose ``secrets:`` there, so ``deploy/compose/secrets/`` is
left alone), under its own project name. Then:

* real gRPC calls over TLS with the operator's bearer token to BOTH replicas (127.0.0.1:50051 and :50061);
  without the token, or with another one, UNAUTHENTICATED; without TLS, no answer;
* one shared audit chain: each call's record is read through the OTHER replica (GetRecord), ``proctor audit
  verify --dsn ...`` run inside each replica says intact with at least those records, ``proctor audit show``
  finds them, and the server's PostgreSQL role may not DELETE or UPDATE a record;
* Prometheus (127.0.0.1:9090) has scraped both replicas (``up == 1`` in the ``proctor`` job, their request
  counters), lists every alert rule of deploy/prometheus/alerts.yml with health ``ok`` (evaluated without error
  against this scrape), each rule's ``expr`` and each Grafana dashboard query evaluates through ``/api/v1/query``;
  and that the replicas' answer to Prometheus' request keeps the ``proctor:`` names (prometheus_client's
  OpenMetrics answer wrote ``proctor_``, which this check found: observability/endpoint.py);
* ``podman-compose stop -t 30`` drains both replicas, which exit 0.

Only what needs the running stack is asserted here. What the files say (compose.yaml, prometheus.yml, the
alert rules, make-secrets.sh) and what audit-init's command prints and creates (run for real against the test
PostgreSQL) are checked in every ``make test`` by tests/deploy/test_compose_files.py and
test_monitoring_assets.py, so that a change of the product that outgrows this check is seen by CI, not at the
next ``make compose-check``.

The stack is always torn down (``down -v``: containers, volumes, network), also on failure. It takes one
to two minutes (deploy/compose/README.md has the figures), so it is not part of ``make test``. When asked
for and podman, podman-compose or the images are missing it fails under CI and skips elsewhere.

Grafana is not started: it has no Debian package and its public image cannot be pulled on the project's
machines (no registry reachable); its provisioning is checked statically (tests/deploy/test_compose_files.py,
test_monitoring_assets.py) and its dashboard's queries are evaluated here against the real Prometheus.
PostgreSQL and Prometheus run from the local images of ``deploy/compose/images/build.sh``
(``POSTGRES_IMAGE`` / ``PROMETHEUS_IMAGE`` choose others).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from helpers.requirements import missing

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
CONTAINERS_CONF = ROOT / "deploy" / "docker" / "containers.conf"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "proctor-dashboard.json"
PROJECT = "proctor-compose-check"   # its own containers, volumes and network: proctor-compose-check_*
SERVICES = ("postgres", "audit-init", "proctor-1", "proctor-2", "prometheus")
# The images compose.yaml takes from these variables; here the local builds are the defaults.
IMAGES = {"PROCTOR_IMAGE": "localhost/proctor:dev", "POSTGRES_IMAGE": "localhost/proctor-postgres:15",
          "PROMETHEUS_IMAGE": "localhost/proctor-prometheus:2.42"}
PROMETHEUS = "http://127.0.0.1:9090"
REPLICA_JOB = "proctor"    # prometheus.yml's job for the replicas, the one ProctorReplicaDown names
READY_TIMEOUT_S = 420.0    # both replicas load the model side by side; 55 s on 2 cores
SCRAPE_TIMEOUT_S = 120.0   # scrape and evaluation intervals are 15 s
STOP_TIMEOUT_S = 30        # the replicas' stop_grace_period: drain notice 5 s + grace 10 s + the audit flush

compose_check = pytest.mark.skipif(
    os.environ.get("PROCTOR_COMPOSE_CHECK", "") not in ("1", "true", "yes"),
    reason="runs the Compose stack with podman-compose (minutes): `make compose-check`")
pytestmark = compose_check


def _compose_spec() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _replica_ports() -> dict[str, int]:
    """Each replica's gRPC port as published on this machine's loopback ("127.0.0.1:50061:50051" → 50061;
    test_compose_files.py checks that every published port is on loopback)."""
    return {name: int(svc["ports"][0].rsplit(":", 2)[1])
            for name, svc in _compose_spec()["services"].items() if name.startswith("proctor-")}


def _env() -> dict[str, str]:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}
    for key, default in IMAGES.items():
        env.setdefault(key, default)
    return env


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], env=_env(), capture_output=True, text=True, timeout=timeout,
                            check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return result


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _prometheus(path: str, **params: str) -> Any:
    """GET a Prometheus API path; the ``data`` of a success, else AssertionError with Prometheus' error."""
    url = f"{PROMETHEUS}{path}?{urllib.parse.urlencode(params)}" if params else f"{PROMETHEUS}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
    except urllib.error.HTTPError as error:  # 400/422: a bad expression, with Prometheus' reason
        body = json.loads(error.read() or b"{}")
        raise AssertionError(f"{path} {params}: HTTP {error.code} {body.get('errorType')}: {body.get('error')}") \
            from None
    assert body["status"] == "success", body
    return body["data"]


def _eventually(what: str, probe: Any, timeout_s: float, every_s: float = 2.0) -> Any:
    """``probe()`` until it returns something truthy (its value) or ``timeout_s`` passes (its last error)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except Exception as error:  # not yet: NOT_FOUND, a refused connection, an assertion
            last = error
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s:.0f} s (last: {last!r})")
        time.sleep(every_s)


# --- the stack -----------------------------------------------------------------------------------------

@dataclass
class Stack:
    override: Path
    secrets: Path
    ports: dict[str, int]
    started: float = field(default_factory=time.monotonic)
    figures: dict[str, float] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)   # service → container name
    up_output: str = ""                                   # podman-compose exits 0 even when a run failed

    @property
    def ca(self) -> Path:
        return self.secrets / "ca.crt"

    @property
    def token(self) -> str:
        return (self.secrets / "client.token").read_text().strip()

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["podman-compose", "-p", PROJECT, "-f", str(COMPOSE_FILE), "-f", str(self.override), *args]
        result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=timeout,
                                check=False, cwd=COMPOSE_DIR)
        if check and result.returncode != 0:
            raise AssertionError(f"podman-compose {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def find_containers(self) -> None:
        listed = json.loads(podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}",
                                   "--format", "json").stdout or "[]")
        for container in listed:
            service = (container.get("Labels") or {}).get("com.docker.compose.service")
            if service:
                self.names[service] = container["Names"][0]

    def state(self, service: str) -> dict[str, Any]:
        result = podman("inspect", "--format", "{{json .State}}", self.names[service], check=False)
        return json.loads(result.stdout) if result.returncode == 0 else {}

    def logs(self, service: str, tail: int = 60) -> str:
        result = podman("logs", "--tail", str(tail), self.names[service], check=False)
        return result.stdout + result.stderr

    def exec(self, service: str, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.names[service], *command, timeout=timeout, check=False)

    def client(self, replica: str, *, token: str | None = "", tls: bool = True, **kwargs: Any) -> Any:
        from proctor_client import ProctorClient, tls_credentials

        return ProctorClient(f"127.0.0.1:{self.ports[replica]}",
                             credentials=tls_credentials(self.ca) if tls else None,
                             token=self.token if token == "" else token, **kwargs)


def _write_secrets_and_override(tmp: Path) -> tuple[Path, Path]:
    """make-secrets.sh into ``tmp/secrets``, and an override that points compose's secrets there."""
    if shutil.which("openssl") is None:
        missing("openssl is not installed (make-secrets.sh)")
    secrets = tmp / "secrets"
    result = subprocess.run(["bash", str(COMPOSE_DIR / "make-secrets.sh")], env={**os.environ,
                            "SECRETS_DIR": str(secrets)}, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"make-secrets.sh: {result.stdout}{result.stderr}"
    declared = _compose_spec()["secrets"]
    override = {"secrets": {name: {"file": str(secrets / Path(spec["file"]).name)} for name, spec in declared.items()}}
    for spec in override["secrets"].values():
        assert Path(spec["file"]).is_file(), f"make-secrets.sh did not write {spec['file']}"
    path = tmp / "compose.secrets.yaml"
    path.write_text("# tests/deploy/test_compose.py: this run's secrets\n" + yaml.safe_dump(override))
    return secrets, path


def _tear_down(stack: Stack) -> None:
    stack.compose("down", "-v", "-t", str(STOP_TIMEOUT_S), timeout=600, check=False)
    # podman-compose 1.0 leaves its network and the volumes of services it did not create.
    for volume in podman("volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}",
                         check=False).stdout.split():
        podman("volume", "rm", "-f", volume, check=False)
    podman("network", "rm", "-f", f"{PROJECT}_default", check=False)


def _wait_ready(stack: Stack, up_issued: float) -> None:
    """Both replicas' readiness (proctor.v1.Generation SERVING over TLS: model loaded, audit store up)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from proctor_client import tls_credentials

    pending = dict(stack.ports)
    deadline = up_issued + READY_TIMEOUT_S
    last = ""
    while pending:
        for replica, port in list(pending.items()):
            with grpc.secure_channel(f"127.0.0.1:{port}", tls_credentials(stack.ca)) as channel:
                try:
                    status = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service="proctor.v1.Generation"), timeout=2).status
                    last = f"{replica}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
                except grpc.RpcError as error:
                    status, last = None, f"{replica}: {error.code().name}"
            if status == health_pb2.HealthCheckResponse.SERVING:
                stack.figures[f"{replica} ready after up"] = time.monotonic() - up_issued
                del pending[replica]
                continue
            state = stack.state(replica)
            if state.get("Status") != "running":  # after `up -d` returned: created means it failed to start
                raise AssertionError(f"{replica} is {state.get('Status')} (exit {state.get('ExitCode')}):\n"
                                     f"{stack.logs(replica)}\npodman-compose up:\n{stack.up_output[-3000:]}")
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"not ready after {READY_TIMEOUT_S:.0f} s: {sorted(pending)} (last: {last})\n"
                                 + "\n".join(stack.logs(r, 20) for r in pending))
        if pending:
            time.sleep(1)
    stack.figures["both replicas ready after up"] = time.monotonic() - up_issued


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    for tool in ("podman", "podman-compose"):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed: run deploy/docker/install-tools.sh --compose")
    env = _env()
    for key in IMAGES:
        if podman("image", "exists", env[key], check=False).returncode != 0:
            missing(f"image {env[key]} ({key}) is not built: `make compose-check` builds the local images")
    ports = _replica_ports()
    for port in (*ports.values(), 9090):
        if _port_in_use(port):
            pytest.fail(f"127.0.0.1:{port} is taken (another Proctor or Compose stack?); the check publishes it")
    secrets, override = _write_secrets_and_override(tmp_path_factory.mktemp("compose"))
    stack = Stack(override, secrets, ports)
    failed_before = request.session.testsfailed
    _tear_down(stack)  # what a killed earlier run may have left under this project name
    try:
        up_issued = time.monotonic()
        up = stack.compose("up", "-d", *SERVICES, timeout=600)
        stack.up_output = up.stdout + up.stderr
        stack.figures["compose up -d"] = time.monotonic() - up_issued
        stack.find_containers()
        assert set(stack.names) == set(SERVICES), f"created: {stack.names}"
        _wait_ready(stack, up_issued)
        yield stack
    finally:
        if request.session.testsfailed > failed_before or not stack.figures.get("both replicas ready after up"):
            stack.find_containers()
            for service in stack.names:
                print(f"\n--- {service} ({stack.state(service).get('Status')}) ---\n{stack.logs(service, 40)}")
        started = time.monotonic()
        _tear_down(stack)
        stack.figures["down -v"] = time.monotonic() - started
        stack.figures["whole check"] = time.monotonic() - stack.started
        print("\ncompose check figures: " + ", ".join(f"{k} {v:.1f} s" for k, v in stack.figures.items()))


@dataclass
class Call:
    replica: str
    audit_id: str
    text: str


@pytest.fixture(scope="module")
def calls(stack: Stack) -> list[Call]:
    """Two audited generations on each replica, over TLS with the operator's token."""
    made = []
    for replica in stack.ports:
        with stack.client(replica, timeout_s=120) as client:
            plain = client.generate("The capital of France is", max_new_tokens=8, temperature=0)
            dated = client.generate("Effective date:", regex="[0-9]{4}-[0-9]{2}-[0-9]{2}", max_new_tokens=16)
        assert plain.text.strip() and plain.audit_id, plain
        assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", dated.text), dated.text
        made += [Call(replica, plain.audit_id, plain.text), Call(replica, dated.audit_id, dated.text)]
    assert len({c.audit_id for c in made}) == len(made)
    return made


# --- the checks ----------------------------------------------------------------------------------------

def test_stack_came_up_with_the_audit_table_and_healthy_containers(stack: Stack) -> None:
    init = stack.state("audit-init")
    # What it prints and creates: test_compose_files.py runs its command against the test PostgreSQL.
    assert init.get("Status") == "exited" and init.get("ExitCode") == 0, f"{init}\n{stack.logs('audit-init')}"
    # The image's HEALTHCHECK (proctor health on the plaintext health-only port) and PostgreSQL's.
    for service in ("postgres", *stack.ports):
        result = podman("healthcheck", "run", stack.names[service], check=False)
        assert result.returncode == 0, f"{service} HEALTHCHECK: {result.stdout}{result.stderr}"
    for replica in stack.ports:
        assert stack.exec(replica, "id", "-u").stdout.strip() == "10001", f"{replica} runs as another user"
    print(f"\ncompose up -d: {stack.figures['compose up -d']:.1f} s; both replicas ready "
          f"{stack.figures['both replicas ready after up']:.1f} s after up was issued")


def test_both_replicas_answer_over_tls_with_the_token_only(stack: Stack, calls: list[Call]) -> None:
    from proctor_client import ProctorError

    assert {c.replica for c in calls} == set(stack.ports)
    for replica in stack.ports:
        with stack.client(replica, timeout_s=30) as client:
            info = client.model_info()
            assert info.model_id and info.weights in ("q8", "q4"), info
        for token in (None, "not-the-operator-token"):
            with stack.client(replica, token=token, timeout_s=30) as client, pytest.raises(ProctorError) as refused:
                client.generate("Hello", max_new_tokens=2)
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED, refused.value
        with stack.client(replica, tls=False, timeout_s=5, retries=0) as client, pytest.raises(ProctorError) as plain:
            client.model_info()
        assert plain.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), plain.value


def test_the_replicas_share_one_verified_audit_chain(stack: Stack, calls: list[Call]) -> None:
    other = {a: b for a, b in zip(stack.ports, reversed(list(stack.ports)), strict=True)}
    # A record written by one replica is read through the other: one store.
    for call in calls:
        with stack.client(other[call.replica], timeout_s=30) as client:
            record = _eventually(f"{call.audit_id} through {other[call.replica]}",
                                 lambda c=client, a=call.audit_id: c.audit_record(a), timeout_s=30)
        body = json.loads(record.record_json)
        assert record.audit_id == body["audit_id"] == call.audit_id
        assert body["caller"]["identity"] == "operator"
    dsn = _compose_spec()["x-proctor"]["environment"]["PROCTOR_AUDIT_DSN"]
    for replica in stack.ports:
        verify = stack.exec(replica, "proctor", "audit", "verify", "--dsn", dsn)
        assert verify.returncode == 0, f"{replica}: {verify.stdout}{verify.stderr[-2000:]}"
        found = re.search(r"intact: (\d+) records", verify.stdout)
        assert found and int(found.group(1)) >= len(calls), verify.stdout
        print(f"\nproctor audit verify in {replica}: {verify.stdout.strip()}")
        with stack.client(replica, timeout_s=60) as client:
            server_side = client.verify_log()
        assert server_side.ok and server_side.records >= len(calls), server_side
    for call in calls:
        show = stack.exec(other[call.replica], "proctor", "audit", "show", "--dsn", dsn, call.audit_id)
        assert show.returncode == 0 and call.audit_id in show.stdout, show.stdout + show.stderr
    # The servers' role appends and reads; it may not rewrite the history.
    for statement in ("DELETE FROM audit_log", "UPDATE audit_log SET caller = caller"):
        denied = stack.exec("postgres", "sh", "-c", 'PGPASSWORD="$(cat /run/secrets/pg_appender_password)" psql '
                            f'-h 127.0.0.1 -U proctor_appender -d proctor -v ON_ERROR_STOP=1 -c "{statement}"')
        assert denied.returncode != 0 and "permission denied" in denied.stderr, denied.stdout + denied.stderr


def _alert_rules() -> dict[str, str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def test_prometheus_scrapes_both_replicas_and_evaluates_every_alert_rule(stack: Stack, calls: list[Call]) -> None:
    # The replicas' job (the witness has its own, and is not started here: SERVICES).
    scrape = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    (job,) = [job for job in scrape["scrape_configs"] if job["job_name"] == REPLICA_JOB]
    instances = {target for config in job["static_configs"] for target in config["targets"]}

    def both_up() -> bool:
        result = _prometheus("/api/v1/query", query=f'up{{job="{REPLICA_JOB}"}}')["result"]
        return {r["metric"]["instance"] for r in result if r["value"][1] == "1"} == instances

    _eventually("up == 1 for both replicas", both_up, SCRAPE_TIMEOUT_S)

    def calls_scraped() -> bool:  # the calls made above, in each replica's own counter
        result = _prometheus("/api/v1/query", query="sum by (instance) (proctor:requests_total)")["result"]
        return {r["metric"]["instance"] for r in result if float(r["value"][1]) > 0} == instances

    _eventually("proctor:requests_total from both replicas", calls_scraped, SCRAPE_TIMEOUT_S)
    expected = _alert_rules()

    def evaluated() -> list[dict[str, Any]]:  # every rule evaluated at least once after the first scrape
        rules = [r for g in _prometheus("/api/v1/rules", type="alert")["groups"] for r in g["rules"]]
        return rules if all(r.get("lastEvaluation", "").startswith("20") and r["health"] != "unknown"
                            for r in rules) and rules else []

    rules = _eventually("the alert rules evaluated", evaluated, SCRAPE_TIMEOUT_S)
    assert {r["name"] for r in rules} == set(expected)
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule['health']} {rule.get('lastError')}"
    for name, expr in expected.items():
        result = _prometheus("/api/v1/query", query=expr)
        assert result["resultType"] == "vector", (name, result)
    firing = [r["name"] for r in rules if r["state"] != "inactive"]
    print(f"\nprometheus: both replicas up, {len(rules)} alert rules ok; pending or firing: {firing or 'none'}")


# Prometheus 2.x's scrape Accept header (OpenMetrics first).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def test_the_scrape_keeps_the_proctor_colon_names(stack: Stack) -> None:
    port = _compose_spec()["x-proctor"]["environment"]["PROCTOR_METRICS_PORT"]
    request = f"u.Request('http://127.0.0.1:{port}/metrics', headers={{'Accept': {PROMETHEUS_ACCEPT!r}}})"
    script = f"import urllib.request as u; print(u.urlopen({request}, timeout=10).read().decode())"
    result = stack.exec("proctor-1", "python", "-c", script)
    if result.returncode != 0:
        raise RuntimeError(f"reading the metrics in proctor-1: {result.stdout}{result.stderr}")
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in result.stdout.splitlines()
             if line.startswith("proctor")}
    if not names:
        raise RuntimeError(f"no proctor samples in the scrape:\n{result.stdout[:2000]}")
    escaped = sorted(n for n in names if not n.startswith("proctor:"))
    assert not escaped, f"{len(escaped)} of {len(names)} sample names lost their colon, e.g. {escaped[:3]}"


def test_the_grafana_dashboard_queries_evaluate_against_the_real_scrape(stack: Stack, calls: list[Call]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", []) if t.get("expr")}
    assert exprs
    for expr in sorted(exprs):  # Grafana's $__rate_interval is at least 4 scrape intervals
        _prometheus("/api/v1/query", query=expr.replace("$__rate_interval", "1m"))


def test_stop_drains_both_replicas_and_they_exit_0(stack: Stack, calls: list[Call]) -> None:
    started = time.monotonic()
    stack.compose("stop", "-t", str(STOP_TIMEOUT_S), timeout=600)
    stack.figures["compose stop -t 30"] = time.monotonic() - started
    for replica in stack.ports:
        state = stack.state(replica)
        assert state.get("Status") == "exited" and state.get("ExitCode") == 0, f"{replica}: {state}\n" \
            + stack.logs(replica)
        finished = state["FinishedAt"]
        assert "draining" in stack.logs(replica, 200), stack.logs(replica)
        print(f"\n{replica}: exit {state['ExitCode']} at {finished}")
    # The servers stop one after the other (podman-compose 1.0), each on its own before the timeout.
    assert stack.figures["compose stop -t 30"] < 2 * STOP_TIMEOUT_S
