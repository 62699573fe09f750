"""deploy/k8s/overlays/inference-gateway (issue 58): Proctor behind the Gateway API Inference Extension.

Rendered with ``kubectl kustomize``; the built-in kinds validate against the Kubernetes schemas (kubernetes-validate,
strict), the InferencePool and InferenceObjectives against the CRDs vendored in deploy/k8s/crds (strict fields, CEL
rules evaluated). Then the wiring: the pool selects the server pods on their HTTP door, the picker is the one the
pool names, reads the pool it is told, has the rights it needs, reads its configuration where it is mounted, and
scrapes Proctor's metrics port past the NetworkPolicy for metric names Proctor serves.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers.epp import (
    DATA_SOURCE_KEYS,
    ENGINE_KEYS,
    EXTRACTOR_KEYS,
    engine_config,
    parse_spec,
    picker_config,
    plugin,
)
from helpers.k8s import (
    CEL_RULES,
    K8S,
    CustomResourceInvalid,
    cel_rules,
    crds,
    one,
    render,
    validate_custom_resource,
)

from proctor.config import Settings
from proctor.observability.collectors import CACHE_CONFIG_LABELS, StateCollector

OVERLAY = K8S / "overlays" / "inference-gateway"
OLDEST_SUPPORTED = "1.30"  # as tests/deploy/test_k8s_manifests.py (preStop sleep)
POOL_GROUP = "inference.networking.k8s.io"
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render(OVERLAY)


def custom(doc: Doc) -> bool:
    return (doc["apiVersion"], doc["kind"]) in crds()


def settings_env(docs: list[Doc]) -> dict[str, str]:
    """The server's settings: the ConfigMap its pods load (kustomize suffixes the name with a hash)."""
    name = pod(docs, "proctor")["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
    return dict(one(docs, "ConfigMap", name)["data"])


def pod(docs: list[Doc], name: str) -> Doc:
    return dict(one(docs, "Deployment", name)["spec"]["template"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def picker(docs: list[Doc]) -> dict[str, Any]:
    """The EndpointPickerConfig the picker loads: the file its --config-file names, in the ConfigMap mounted there."""
    spec = pod(docs, "proctor-epp")["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "epp")
    path = container["args"][container["args"].index("--config-file") + 1]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    return picker_config(config_map["data"][path.removeprefix(mount["mountPath"] + "/")])


def test_every_resource_validates_against_its_schema(docs: list[Doc]) -> None:
    kinds = {doc["kind"] for doc in docs}
    assert {"InferencePool", "InferenceObjective", "Deployment", "Service", "Role", "RoleBinding"} <= kinds
    for doc in docs:
        if custom(doc):
            validate_custom_resource(doc)
            continue
        for version in (OLDEST_SUPPORTED, kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_crd_check_can_fail(docs: list[Doc]) -> None:
    """A typo'd field, a wrong type, a missing required field and both CEL rules are each refused."""
    pool, objective = one(docs, "InferencePool"), one(docs, "InferenceObjective", "interactive")

    def changed(doc: Doc, edit: Any) -> Doc:
        copy = yaml.safe_load(yaml.safe_dump(doc))
        edit(copy["spec"])
        return copy

    broken = [
        changed(pool, lambda s: s.update(targetPort=s.pop("targetPorts"))),
        changed(pool, lambda s: s["targetPorts"][0].update(number="8000")),
        changed(pool, lambda s: s["targetPorts"].append({"number": s["targetPorts"][0]["number"]})),
        changed(pool, lambda s: s["endpointPickerRef"].pop("port")),
        changed(pool, lambda s: s.update(appProtocol="https")),
        changed(objective, lambda s: s.pop("poolRef")),
        changed(objective, lambda s: s.update(priority="high")),
    ]
    for doc in broken:
        with pytest.raises(CustomResourceInvalid):
            validate_custom_resource(doc)


def test_the_vendored_crds_serve_the_versions_used_and_every_cel_rule_is_evaluated(docs: list[Doc]) -> None:
    assert cel_rules() == set(CEL_RULES)  # a newer CRD's new rule must get a check here
    for doc in docs:
        if doc["kind"] in ("InferencePool", "InferenceObjective"):
            assert crds()[(doc["apiVersion"], doc["kind"])]["storage"], doc["apiVersion"]
    assert one(docs, "InferencePool")["apiVersion"] == f"{POOL_GROUP}/v1"


def test_the_pool_selects_the_server_pods_on_their_http_door(docs: list[Doc]) -> None:
    env = settings_env(docs)
    settings = Settings.load(environ=env)  # every value parses and the combination is accepted
    pool = one(docs, "InferencePool")["spec"]
    server = pod(docs, "proctor")
    container = server["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert [p["number"] for p in pool["targetPorts"]] == [settings.http_port] == [ports["http"]]
    assert pool["appProtocol"] == "http" and settings.http_plaintext  # the pool speaks plaintext to the HTTP door
    assert settings.tls_cert_file and not settings.insecure and settings.callers_file  # gRPC keeps TLS; callers named
    assert selects(pool["selector"]["matchLabels"], server["metadata"]["labels"])
    for other in (d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] != "proctor"):
        assert not selects(pool["selector"]["matchLabels"], other["spec"]["template"]["metadata"]["labels"])
    mounted = {mount["name"] for mount in container["volumeMounts"]}
    assert mounted == {volume["name"] for volume in server["spec"]["volumes"]} and "tls" in mounted
    # The server pods carry the engine type whose metric mapping the picker applies to them.
    extractor = plugin(picker(docs), "core-metrics-extractor")
    engine = server["metadata"]["labels"][extractor["engineLabelKey"]]
    assert engine == extractor["defaultEngine"] and engine_config(picker(docs), engine)


def test_the_picker_is_the_one_the_pool_names_and_reads_that_pool(docs: list[Doc]) -> None:
    pool = one(docs, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    service = one(docs, "Service", ref["name"])
    epp = pod(docs, "proctor-epp")
    assert selects(service["spec"]["selector"], epp["metadata"]["labels"])
    service_port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    container = epp["spec"]["containers"][0]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container_ports[service_port["targetPort"]] == 9002  # the picker's ext-proc port (its chart's)
    assert service_port["appProtocol"] == "kubernetes.io/h2c"
    args = container["args"]

    def flag(name: str) -> str:
        return str(args[args.index(name) + 1])

    assert flag("--pool-name") == pool["metadata"]["name"] and flag("--pool-group") == POOL_GROUP
    assert "--pool-namespace" not in args  # its own namespace (NAMESPACE), where the pool is
    assert {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"]["port"] == int(flag("--grpc-health-port")) == container_ports["grpc-health"]
    assert picker(docs)["kind"] == "EndpointPickerConfig"  # --config-file names a file in the mounted ConfigMap
    # The picker waits for the pool's pods to drain as long as they may take.
    assert epp["spec"]["terminationGracePeriodSeconds"] >= pod(docs, "proctor")["spec"][
        "terminationGracePeriodSeconds"]
    for objective in (d for d in docs if d["kind"] == "InferenceObjective"):
        pool_ref = objective["spec"]["poolRef"]
        assert (pool_ref["group"], pool_ref["name"]) == (POOL_GROUP, pool["metadata"]["name"])
        assert objective["metadata"]["namespace"] == pool["metadata"]["namespace"]


def test_the_picker_may_read_pods_pools_and_objectives(docs: list[Doc]) -> None:
    account = pod(docs, "proctor-epp")["spec"]["serviceAccountName"]
    namespace = one(docs, "InferencePool")["metadata"]["namespace"]
    assert one(docs, "ServiceAccount", account)["metadata"]["namespace"] == namespace
    granted: set[tuple[str, str, str]] = set()
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} in binding["subjects"]:
            role = one(docs, binding["roleRef"]["kind"], binding["roleRef"]["name"])
            granted |= {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
                        for resource in rule["resources"] for verb in rule["verbs"]}
    for group, resource in (("", "pods"), (POOL_GROUP, "inferencepools"), ("llm-d.ai", "inferenceobjectives")):
        for verb in ("get", "list", "watch"):
            assert (group, resource, verb) in granted, (group, resource, verb)
    assert not any(verb in ("create", "update", "patch", "delete") for _, _, verb in granted)


def test_the_picker_scrapes_proctors_metrics_port_for_names_proctor_serves(docs: list[Doc]) -> None:
    config = picker(docs)
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert picker_config() == config  # the rendered ConfigMap is the file in the overlay
    env = settings_env(docs)
    source = plugin(config, "metrics-data-source")
    assert set(source) <= DATA_SOURCE_KEYS, set(source) - DATA_SOURCE_KEYS
    assert (source["scheme"], source["path"], source["port"]) == ("http", "/metrics", int(env["PROCTOR_METRICS_PORT"]))
    extractor = plugin(config, "core-metrics-extractor")
    assert set(extractor) <= EXTRACTOR_KEYS, set(extractor) - EXTRACTOR_KEYS
    engine = engine_config(config, extractor["defaultEngine"])
    assert set(engine) <= ENGINE_KEYS, set(engine) - ENGINE_KEYS
    served = {family.name: family.type for family in StateCollector().collect()}
    for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"):
        spec = parse_spec(engine[key])
        assert served.get(spec.name) == "gauge", (key, spec.name)
        assert not spec.labels
    assert (engine["cacheBlockSizeLabelName"], engine["cacheNumBlocksLabelName"]) == CACHE_CONFIG_LABELS
    sources = config["dataLayer"]["sources"]
    assert [(s["pluginRef"], [e["pluginRef"] for e in s["extractors"]]) for s in sources] == [
        ("metrics-data-source", ["core-metrics-extractor"])]
    named = {p.get("name", p["type"]) for p in config["plugins"]}
    used = {ref["pluginRef"] for profile in config["schedulingProfiles"] for ref in profile["plugins"]}
    assert used == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} and used <= named


def test_the_network_policy_admits_the_gateway_and_the_picker(docs: list[Doc]) -> None:
    env = settings_env(docs)
    policy = one(docs, "NetworkPolicy")["spec"]
    assert selects(policy["podSelector"]["matchLabels"], pod(docs, "proctor")["metadata"]["labels"])
    epp_labels = pod(docs, "proctor-epp")["metadata"]["labels"]

    def admitted(port: int, labels: dict[str, str], same_namespace: bool) -> bool:
        for rule in policy["ingress"]:
            if port not in {p["port"] for p in rule["ports"]}:
                continue
            for peer in rule["from"]:
                in_namespace = "namespaceSelector" not in peer or peer["namespaceSelector"] == {}
                if "podSelector" in peer and selects(peer["podSelector"]["matchLabels"], labels) and \
                        (in_namespace if same_namespace else peer.get("namespaceSelector") == {}):
                    return True
        return False

    assert admitted(int(env["PROCTOR_METRICS_PORT"]), epp_labels, same_namespace=True)
    assert not admitted(int(env["PROCTOR_HTTP_PORT"]), epp_labels, same_namespace=True)  # the picker only scrapes
    assert admitted(int(env["PROCTOR_HTTP_PORT"]), {"proctor-client": "true"}, same_namespace=False)
    assert admitted(int(env["PROCTOR_PORT"]), {"proctor-client": "true"}, same_namespace=False)
