"""deploy/k8s: every overlay renders with ``kubectl kustomize``, validates against the Kubernetes schemas
offline (kubernetes-validate, strict), and its numbers agree with each other and with the server's settings.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers import k8s
from helpers.k8s import K8S, one

from proctor.config import Settings

OVERLAYS = ("dev", "production")
OLDEST_SUPPORTED = "1.30"  # preStop `sleep` needs 1.30 (README "Scale out")
OPERATOR_KINDS = {"ServiceMonitor"}  # custom resources: no schema in kubernetes-validate


def render(overlay: str) -> list[dict[str, Any]]:
    return k8s.render(K8S / "overlays" / overlay)


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def settings_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    return dict(one(docs, "ConfigMap")["data"])


def test_every_resource_validates_against_the_kubernetes_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue
        for version in (OLDEST_SUPPORTED, kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_broken_deployment(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """The check above can fail: a typo'd field and a wrong type are both refused."""
    deployment = one(rendered[1], "Deployment")
    typo = yaml.safe_load(yaml.safe_dump(deployment))
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = typo["spec"]["template"]["spec"][
        "containers"][0].pop("readinessProbe")
    wrong_type = yaml.safe_load(yaml.safe_dump(deployment))
    wrong_type["spec"]["replicas"] = "three"
    for broken in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_the_configmap_names_only_real_settings_and_they_load(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    env = settings_env(rendered[1])
    fields = {f"PROCTOR_{field.name.upper()}" for field in dataclasses.fields(Settings)}
    assert set(env) <= fields, f"not settings: {sorted(set(env) - fields)}"
    settings = Settings.load(environ=env)  # every value parses, and the combination is accepted
    assert settings.health_port and settings.metrics_port and settings.port


def test_probes_ports_threads_and_termination_agree_with_the_settings(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    env = settings_env(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": int(env["PROCTOR_PORT"]), "health": int(env["PROCTOR_HEALTH_PORT"]),
                     "metrics": int(env["PROCTOR_METRICS_PORT"])}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["health"], probe  # plaintext: kubelet cannot speak TLS
    assert container["readinessProbe"]["grpc"]["service"] == "proctor.v1.Generation"
    # The CPU limit is what the threads can use; the request equals it (no throttling surprises).
    assert container["resources"]["limits"]["cpu"] == container["resources"]["requests"]["cpu"] == env[
        "PROCTOR_THREADS"]
    # SIGTERM comes after preStop; then the drain notice, then the grace period for calls in flight.
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = pre_stop + float(env["PROCTOR_DRAIN_NOTICE_S"]) + float(env["PROCTOR_GRACE_PERIOD_S"])
    assert pod["terminationGracePeriodSeconds"] >= needed + 5, (pod["terminationGracePeriodSeconds"], needed)
    # The notice lasts at least one readiness period, so the endpoints drop the pod while it still serves.
    assert float(env["PROCTOR_DRAIN_NOTICE_S"]) >= container["readinessProbe"]["periodSeconds"] * \
        container["readinessProbe"]["failureThreshold"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    # The image runs as its proctor user and its entry point is already `proctor serve`: flags only.
    dockerfile = (K8S.parent / "docker" / "Dockerfile").read_text()
    assert f"--uid {pod['securityContext']['runAsUser']} " in dockerfile
    assert 'ENTRYPOINT ["proctor-serve"]' in dockerfile and "serve" not in container.get("args", [])
    # The entry point copies the prebuilt kernels to /tmp on a read-only root: /tmp must be writable.
    assert any(mount["mountPath"] == "/tmp" for mount in container["volumeMounts"])
    mounted = {mount["name"] for mount in container["volumeMounts"]}
    assert mounted == {volume["name"] for volume in pod["volumes"]}, name


def test_services_policies_and_autoscaling_select_the_server_pods(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    deployment = one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in selector.items())

    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"  # headless: clients balance calls, not connections
    assert selects(service["spec"]["selector"])
    assert selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    assert selects(one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"])
    env = settings_env(docs)
    allowed_ports = {port["port"] for rule in one(docs, "NetworkPolicy")["spec"]["ingress"] for port in rule["ports"]}
    assert allowed_ports == {int(env["PROCTOR_PORT"]), int(env["PROCTOR_METRICS_PORT"])}
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["maxReplicas"]
    assert {metric["type"] for metric in hpa["metrics"]} == {"Pods", "Resource"}
    if name == "production":
        assert hpa["minReplicas"] >= 2 and env["PROCTOR_TLS_CERT_FILE"] and env["PROCTOR_CALLERS_FILE"]
        assert not [doc for doc in docs if doc["kind"] == "Secret"], "no secret is kept in the repository"
        assert "PROCTOR_INSECURE" not in env


def test_the_network_policy_peers_are_rendered_as_written(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """The base's labels go on Proctor's own selectors only: the policy's peers stay as networkpolicy.yaml writes
    them (with the selector labels added to them, the PostgreSQL egress rule selected pods named proctor and the
    gRPC rule admitted only clients that also carried Proctor's own labels)."""
    _, docs = rendered
    written = yaml.safe_load((K8S / "base" / "networkpolicy.yaml").read_text())["spec"]
    policy = one(docs, "NetworkPolicy")["spec"]
    assert (policy["ingress"], policy["egress"]) == (written["ingress"], written["egress"])
    assert policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {"proctor-client": "true"}


def test_the_audit_dsn_comes_from_a_secret_and_no_value_holds_a_password(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    dsn = {item["name"]: item for item in container["env"]}["PROCTOR_AUDIT_DSN"]
    assert "secretKeyRef" in dsn["valueFrom"]
    assert not any("postgresql://" in str(value) for value in settings_env(docs).values())


def test_the_witness_cronjob_runs_a_real_witness_command(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """Production runs the audit witness: its command parses as `proctor audit witness`, every file it names
    is mounted, it reaches the servers past their NetworkPolicy, and it never mounts the log's signing key."""
    from proctor.cli import build_parser

    name, docs = rendered
    jobs = [doc for doc in docs if doc["kind"] == "CronJob"]
    if name != "production":
        assert not jobs
        return
    job = one(docs, "CronJob")["spec"]
    pod = job["jobTemplate"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    args = build_parser().parse_args(container["command"][1:])
    assert (args.audit_command, args.logs, args.interval) == ("witness", ["proctor:50051"], 0.0)
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    for path in (*args.log_keys, args.key, args.tls_ca, args.token_file):
        assert str(Path(path).parent) in mounts, path
    assert args.state in mounts and job["concurrencyPolicy"] == "Forbid"
    claim = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)["persistentVolumeClaim"]
    assert claim["claimName"] in {doc["metadata"]["name"] for doc in docs if doc["kind"] == "PersistentVolumeClaim"}
    admitted = one(docs, "NetworkPolicy")["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in admitted.items())
    secrets = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert secrets == {"proctor-witness"}  # not proctor-audit-keys: a witness holds no log key


def test_the_retention_component_renders_validates_and_runs_the_real_sweep_command(tmp_path: Path) -> None:
    """deploy/k8s/components/retention on the base (not in an overlay: only for encrypted logs): a valid CronJob
    whose command line is the real ``proctor audit sweep``'s."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base, component = (os.path.relpath(K8S / part, overlay) for part in ("base", "components/retention"))
    (overlay / "kustomization.yaml").write_text(  # kustomize takes relative paths only
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {component}\n")
    cronjob = one(k8s.render(overlay, "--load-restrictor", "LoadRestrictionsNone"), "CronJob")
    for version in (OLDEST_SUPPORTED, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(cronjob, version, strict=True)
    from proctor.cli import build_parser

    command = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"]
    args = build_parser().parse_args(command[1:])
    assert args.audit_command == "sweep" and args.retention_days >= 183  # the EU AI Act's six months at least
