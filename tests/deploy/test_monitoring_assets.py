"""deploy/prometheus and deploy/grafana: the alert rules pass ``promtool check`` and their unit tests (each
alert fires past its threshold, not below it), the dashboard JSON is what its generator writes, every
dashboard query parses, and every metric the rules and the dashboard name is one a real metrics endpoint
of the server exports (scraped over HTTP), or, for the witness's ``proctor_witness_*``, a real witness's.
The Compose stack's scrape config and its jobs: test_compose_files.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from helpers.requirements import missing

from proctor.config import Settings
from proctor.observability.setup import Observability

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "proctor-dashboard.json"
METRIC = re.compile(r"\bproctor:[a-z0-9_]+")
WITNESS_METRIC = re.compile(r"\bproctor_witness_[a-z0-9_]+")  # the witness's own names (no colon)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    if found is None:
        missing("promtool is not installed (scripts/deploy-tools.sh installs it; `make test` runs that)")
    return subprocess.run([str(found), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboard", DEPLOY / "grafana" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def test_the_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    checked = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    names = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert {"ProctorTimeToFirstTokenP99High", "ProctorRequestRateDropped", "ProctorRepetitionStopsHigh",
            "ProctorAuditWriteFailed", "ProctorErrorRateHigh"} <= names
    covered = {test["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
               for test in case["alert_rule_test"]}
    assert covered == names, f"alerts without a unit test: {sorted(names - covered)}"


def test_the_rule_unit_tests_fail_when_a_threshold_moves(tmp_path: Path) -> None:
    """The unit tests can fail: the TTFT threshold moved from 2 s to 10 s no longer fires where they expect."""
    moved = RULES.read_text().replace("rate(proctor:time_to_first_token_seconds_bucket[5m]))) > 2",
                                      "rate(proctor:time_to_first_token_seconds_bucket[5m]))) > 10")
    assert moved != RULES.read_text()
    (tmp_path / RULES.name).write_text(moved)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0 and "ProctorTimeToFirstTokenP99High" in tested.stdout + tested.stderr


def test_the_dashboard_json_is_what_its_generator_writes() -> None:
    assert DASHBOARD.read_text() == generator().render(), "run `python deploy/grafana/dashboard.py`"
    dashboard = json.loads(DASHBOARD.read_text())
    titles = [panel["title"] for panel in dashboard["panels"] if panel["type"] != "row"]
    assert len(titles) == len(set(titles))
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for wanted in ("Time to first token", "Time per output token", "Requests waiting and running", "KV cache used",
                   "Errors per second by code", "Constraint cache hit ratio", "Audit lag: records waiting for "
                   "the writer", "Decode step time", "Generated tokens per second"):
        assert wanted in titles


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses each query as a recording rule's expression (Grafana's $__rate_interval made concrete)."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{number}", "expr": expr.replace("$__rate_interval", "1m")}
        for number, expr in enumerate(dashboard_queries())]}]}
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", "queries.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def exported_names() -> set[str]:
    """Sample names a real metrics endpoint serves (scraped over HTTP), and those of its registry's families
    that have no sample yet (a labelled counter before its first call)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    observability = Observability.from_settings(Settings(metrics_port=port), environ={})
    observability.serve(Settings(metrics_port=port))
    assert observability.metrics is not None
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        families = list(observability.metrics.registry.collect())
    finally:
        observability.close()
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and line[0] != "#"}
    assert "proctor:num_requests_waiting" in names  # the endpoint really serves the server's metrics
    for family in families:
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def test_every_metric_the_rules_and_the_dashboard_name_is_exported() -> None:
    exported = exported_names()
    assert "proctor:requests_total" in exported and "proctor:num_requests_waiting" in exported
    named = {name for expr in rule_expressions() + dashboard_queries() for name in METRIC.findall(expr)}
    assert named, "no metric found in the queries"
    assert named <= exported, f"not exported by the server: {sorted(named - exported)}"


def test_every_witness_metric_the_rules_name_is_one_the_witness_exports(tmp_path: Path) -> None:
    """The rules also read the witness's own endpoint (``proctor audit witness --metrics-port``, the
    ``proctor-witness`` job: ProctorAuditLogInconsistent); a real witness serves every such name."""
    from proctor.audit.chain import load_or_create_signing_key, log_signer

    named = {name for expr in rule_expressions() for name in WITNESS_METRIC.findall(expr)}
    assert "proctor_witness_inconsistent" in named
    vkey = log_signer(load_or_create_signing_key(tmp_path / "log.key")).verifier.vkey()
    port, nowhere = free_port(), free_port()  # the log it watches does not answer: the endpoint serves anyway
    log = tmp_path / "witness.log"
    with log.open("w") as stderr:
        witness = subprocess.Popen([sys.executable, "-m", "proctor.cli", "audit", "witness", "--log",
                                    f"127.0.0.1:{nowhere}", "--log-key", vkey, "--key", str(tmp_path / "witness.key"),
                                    "--state", str(tmp_path / "state"), "--interval", "3600", "--timeout", "2",
                                    "--metrics-port", str(port)], stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        text = ""
        while not text:
            assert witness.poll() is None, f"the witness exited {witness.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"no metrics on {port}: {log.read_text()}"
            with contextlib.suppress(OSError):
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            time.sleep(0.2)
    finally:
        witness.terminate()
        witness.wait(30)
    exported = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and line[0] != "#"}
    assert named <= exported, f"not exported by the witness: {sorted(named - exported)}"


@pytest.mark.parametrize("path", ["provisioning/dashboards/proctor.yaml", "provisioning/datasources/prometheus.yaml"])
def test_grafana_provisioning_files_parse(path: str) -> None:
    provisioning = yaml.safe_load((DEPLOY / "grafana" / path).read_text())
    assert provisioning["apiVersion"] == 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def prometheus_api(port: int, path: str) -> dict[str, Any]:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=10).read())


def test_a_real_prometheus_scrape_keeps_the_names_and_every_rule_and_query_evaluates(tmp_path: Path) -> None:
    """A real Prometheus (Debian's, from scripts/deploy-tools.sh) scrapes a real metrics endpoint with the
    alert rules loaded: the ``proctor:`` names arrive as they are (prometheus_client's OpenMetrics answer
    once turned them into ``proctor_…``, and every rule matched nothing), the rules evaluate without an
    error, and so does every dashboard query."""
    binary = shutil.which("prometheus")
    if binary is None:
        missing("prometheus is not installed (scripts/deploy-tools.sh installs it; `make test` runs that)")
    metrics_port, web_port = free_port(), free_port()
    observability = Observability.from_settings(Settings(metrics_port=metrics_port), environ={})
    observability.serve(Settings(metrics_port=metrics_port))
    metrics = observability.metrics
    assert metrics is not None
    metrics.requests.labels("proctor.v1.Generation", "Generate", "OK").inc(3)  # a few samples to find
    metrics.ttft.observe(0.2)
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [RULES.name],
        "scrape_configs": [{"job_name": "proctor", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }))
    server = subprocess.Popen([str(binary), f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{web_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        names: list[str] = []
        while "proctor:requests_total" not in names:
            assert time.monotonic() < deadline, f"no proctor:requests_total scraped; names: {names[:20]}"
            time.sleep(0.5)
            with contextlib.suppress(OSError):
                names = prometheus_api(web_port, "label/__name__/values")["data"]
        assert not [name for name in names if name.startswith("proctor_")], names  # no escaped names
        time.sleep(2.5)  # a few rule evaluations
        rules = [rule for group in prometheus_api(web_port, "rules")["data"]["groups"] for rule in group["rules"]]
        assert len(rules) == len(rule_expressions())
        assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]
        for expr in rule_expressions() + [q.replace("$__rate_interval", "1m") for q in dashboard_queries()]:
            query = urllib.parse.urlencode({"query": expr})
            assert prometheus_api(web_port, f"query?{query}")["status"] == "success", expr
        found = prometheus_api(web_port, "query?" + urllib.parse.urlencode({"query": "proctor:requests_total"}))
        assert [sample["value"][1] for sample in found["data"]["result"]] == ["3"]
    finally:
        server.terminate()
        server.wait(30)
        observability.close()
