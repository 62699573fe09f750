"""deploy/k8s rendered and checked offline: ``kubectl kustomize`` (a missing kubectl is a skip on a developer's
machine, a failure under CI), and custom resources validated against the CRDs vendored in deploy/k8s/crds.

A CRD's ``openAPIV3Schema`` is checked as the API server checks it with strict field validation (kubectl's
default): an unknown field is an error, so every object schema that lists its properties is closed here (the
server's pruning would otherwise drop a typo'd field in silence). The CEL rules (``x-kubernetes-validations``)
are not JSON Schema: ``CEL_RULES`` evaluates each one the vendored CRDs hold, and ``cel_rules`` lists them so a
test fails when a newer CRD brings a rule nobody evaluates.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from helpers.requirements import missing

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
CRDS = K8S / "crds"
Doc = dict[str, Any]


def render(directory: Path, *flags: str) -> list[Doc]:
    """The documents ``kubectl kustomize`` renders from ``directory``."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        missing("kubectl (with its built-in kustomize) is not installed")
    result = subprocess.run([kubectl, "kustomize", *flags, str(directory)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [doc for doc in docs if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@cache
def crds() -> dict[tuple[str, str], Doc]:
    """The vendored CRDs' served versions by (apiVersion, kind): each version's entry of ``spec.versions``."""
    listed = yaml.safe_load((CRDS / "kustomization.yaml").read_text())["resources"]
    found: dict[tuple[str, str], Doc] = {}
    for name in listed:
        crd = yaml.safe_load((CRDS / name).read_text())
        for version in crd["spec"]["versions"]:
            if version["served"]:
                found[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = version
    return found


def _closed(schema: Any) -> Any:
    """``schema`` with every object that lists its properties closed to others (strict field validation)."""
    if isinstance(schema, dict):
        out = {key: _closed(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


def _walk(schema: Any, value: Any) -> Iterator[tuple[str, Any]]:
    """Each (CEL rule, the value it applies to) along ``value``, as the schema places the rules."""
    if not isinstance(schema, dict):
        return
    for rule in schema.get("x-kubernetes-validations", []):
        yield rule["rule"], value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(schema.get("properties", {}).get(key), child)
    elif isinstance(value, list):
        for child in value:
            yield from _walk(schema.get("items"), child)


def _unique_numbers(ports: list[Doc]) -> bool:
    numbers = [port["number"] for port in ports]
    return len(numbers) == len(set(numbers))


# The vendored CRDs' CEL rules, each as Python (with the schema's defaults: an endpointPickerRef's kind is Service).
CEL_RULES: dict[str, Callable[[Any], bool]] = {
    "self.kind != 'Service' || has(self.port)": lambda ref: ref.get("kind", "Service") != "Service" or "port" in ref,
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))": _unique_numbers,
}


def cel_rules() -> set[str]:
    """Every CEL rule in the vendored CRDs' served versions."""
    rules: set[str] = set()

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            rules.update(rule["rule"] for rule in node.get("x-kubernetes-validations", []))
            for child in node.values():
                collect(child)
        elif isinstance(node, list):
            for child in node:
                collect(child)

    for version in crds().values():
        collect(version["schema"]["openAPIV3Schema"])
    return rules


class CustomResourceInvalid(AssertionError):
    """The document is not one the API server would accept under its CRD."""


def validate_custom_resource(doc: Doc) -> None:
    """Raise ``CustomResourceInvalid`` unless ``doc`` validates against its vendored CRD (schema and CEL rules)."""
    version = crds().get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if version is None:
        raise CustomResourceInvalid(f"no vendored CRD serves {doc.get('apiVersion')} {doc.get('kind')}")
    schema = _closed(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        raise CustomResourceInvalid("; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors))
    for rule, value in _walk(version["schema"]["openAPIV3Schema"], doc):
        if rule not in CEL_RULES:
            raise CustomResourceInvalid(f"a CEL rule no test evaluates: {rule}")
        if not CEL_RULES[rule](value):
            raise CustomResourceInvalid(f"CEL rule failed: {rule} on {value}")
