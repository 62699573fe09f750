"""What the inference gateway's endpoint picker reads from a Proctor server, as llm-d-router v0.10.0's
``core-metrics-extractor`` reads it (pkg/epp/framework/plugins/datalayer/extractor/metrics: spec.go, extractor.go,
factories.go), written here from that code so the shipped picker configuration can be tried on a real scrape.

A spec is a PromQL instant selector without operators (``name`` or ``name{label=value,...}``); the picker takes the
matching sample with the latest timestamp (Proctor's carry none: the last one), a gauge's or counter's value, and
for the cache info the block size and block count from two labels parsed as integers (``strconv.Atoi``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "overlays" / "inference-gateway" / "epp-config.yaml"
# The parameters each plugin decodes (its Go struct's json tags); anything else would be ignored in silence.
DATA_SOURCE_KEYS = {"scheme", "path", "port", "insecureSkipVerify", "caCertPath", "clientCertPath", "clientKeyPath",
                    "interval"}
EXTRACTOR_KEYS = {"engineLabelKey", "defaultEngine", "engineConfigs"}
ENGINE_KEYS = {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec",
               "cacheBlockSizeLabelName", "cacheNumBlocksLabelName", "cacheBlockSizeSpec", "cacheNumBlocksSpec",
               "customMetrics"}
_SPEC = re.compile(r"^\s*(\S+?)\s*(?:\{([^}]*)\})?\s*$")
_PAIR = re.compile(r'^\s*(\w+)\s*=\s*"?([^",}]*)"?\s*$')


def picker_config(text: str | None = None) -> dict[str, Any]:
    """The EndpointPickerConfig: ``text`` (e.g. a rendered ConfigMap's), or the overlay's file."""
    config: dict[str, Any] = yaml.safe_load(text if text is not None else CONFIG.read_text())
    return config


def plugin(config: dict[str, Any], plugin_type: str) -> dict[str, Any]:
    found = [p for p in config["plugins"] if p["type"] == plugin_type]
    assert len(found) == 1, f"expected one {plugin_type} plugin, found {len(found)}"
    parameters: dict[str, Any] = found[0].get("parameters", {})
    return parameters


def engine_config(config: dict[str, Any], engine: str) -> dict[str, Any]:
    engines = [e for e in plugin(config, "core-metrics-extractor")["engineConfigs"] if e["name"] == engine]
    assert len(engines) == 1, f"expected one engine config named {engine}"
    return engines[0]


@dataclass(frozen=True)
class Spec:
    name: str
    labels: dict[str, str]


def parse_spec(text: str) -> Spec:
    match = _SPEC.match(text)
    assert match, f"not a metric spec: {text!r}"
    labels: dict[str, str] = {}
    for pair in filter(None, (match.group(2) or "").split(",")):
        found = _PAIR.match(pair)
        assert found, f"not a label pair: {pair!r} in {text!r}"
        labels[found.group(1)] = found.group(2)
    return Spec(match.group(1), labels)


@dataclass(frozen=True)
class Endpoint:
    """The standard attributes the picker's scorers read for one pod."""

    waiting: int
    running: int
    kv_usage: float
    block_size: int
    num_blocks: int


def _latest(families: dict[str, Any], spec: Spec) -> Any:
    family = families.get(spec.name)
    assert family is not None and family.samples, f"the picker finds no {spec.name}"
    matching = [s for s in family.samples if all(s.labels.get(k) == v for k, v in spec.labels.items())]
    assert matching, f"the picker finds no {spec.name} with labels {spec.labels}"
    assert family.type in ("gauge", "counter"), f"{spec.name} is a {family.type}: the picker reads gauges"
    return matching[-1]


def read_endpoint(metrics_text: str, engine: dict[str, Any]) -> Endpoint:
    """What the picker's extractor records for a pod whose metrics endpoint answered ``metrics_text``."""
    families = {f.name: f for f in text_string_to_metric_families(metrics_text)}
    info = _latest(families, parse_spec(engine["cacheInfoSpec"])).labels
    return Endpoint(
        waiting=int(_latest(families, parse_spec(engine["queuedRequestsSpec"])).value),
        running=int(_latest(families, parse_spec(engine["runningRequestsSpec"])).value),
        kv_usage=float(_latest(families, parse_spec(engine["kvUsageSpec"])).value),
        block_size=int(info[engine.get("cacheBlockSizeLabelName") or "block_size"]),
        num_blocks=int(info[engine.get("cacheNumBlocksLabelName") or "num_gpu_blocks"]))
