"""The server package's import graph: no circle between modules, no arrow from a lower layer to a higher one.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a lazy import is still a
dependency. The layers, lowest first, are written once here (docs/architecture.md explains them), with the layers
inside a package where it has some, and the packages that have one face.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "service"
PACKAGE = ROOT / "proctor"
# A module may import its own package and any lower layer, never a higher one nor another package of its layer.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"deferred_imports"}),  # third-party import-time work put off (the package's import runs it)
    frozenset({"__init__", "config", "domain", "cpus", "offline"}),  # facts: settings, request types, the host
    frozenset({"observability"}),
    frozenset({"constraints"}),  # grammars compiled into token masks (a tokenizer in, no model); see INNER_LAYERS
    frozenset({"decoding", "contracts"}),  # the per-step pipeline over logits; contract templates and checks
    frozenset({"executor"}),  # the model run behind one protocol: weights, kernels, families, the slot cache
    frozenset({"engine"}),  # the loop, the batch, the step: schedule, execute (an executor's forward), update
    frozenset({"models"}),  # loading a model into what the engine runs
    frozenset({"audit"}),
    frozenset({"api"}),  # servicers: convert and check, never torch
    frozenset({"openai_http"}),  # the OpenAI-compatible HTTP door over the call layer (no gRPC, no protobuf)
    frozenset({"app", "health_probe"}),  # the composition root; the health probe (a client of the server)
    frozenset({"cli"}),  # the entry point over both
)
# Layers inside a package, lowest first (by the name under it); a module or package of it not named is in the top one.
INNER_LAYERS: dict[str, tuple[frozenset[str], ...]] = {
    "constraints": (
        # leaves: the spec, the compile error, the engines' table, the output rule the engine sees
        frozenset({"spec", "errors", "engines", "output_rule"}),
        frozenset({"json_schema"}),  # JSON Schema: reads schemas; no adapter, cache, compile or worker
    ),  # then the adapters, the compile service, its cache and workers, the registry
}
# Packages with one face: a module outside one imports the package itself (its __init__), never a module inside.
FACES = ("proctor.constraints.json_schema",)


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The ``proctor`` modules ``path`` imports (``from a import b`` counts ``a.b`` when that is a module)."""
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(target for target in targets if target in modules)
    return found


def _graph() -> dict[str, set[str]]:
    paths = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    modules = {_name(p) for p in paths}
    return {_name(p): _imports(p, modules) - {_name(p)} for p in paths}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for rank, members in enumerate(LAYERS):
        if top in members:
            return rank
    raise AssertionError(f"{module}: its top-level name {top!r} is in no layer (add it to LAYERS)")


# The HTTP door translates between HTTP and the call layer; it neither speaks gRPC nor builds protobuf messages.
WIRE_FREE = ("openai_http",)
WIRE_MODULES = ("grpc", "grpc_health", "grpc_status", "grpc_reflection", "google.protobuf", "google.rpc",
                "proctor_client.v1")


def _wire_imports(path: Path) -> list[str]:
    """The gRPC and protobuf modules ``path`` imports (any import: lazy, under TYPE_CHECKING, any spelling)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [name for name in names if name.split(".")[-1].endswith("_pb2") or name.endswith("_pb2_grpc")
                  or any(name == wire or name.startswith(f"{wire}.") for wire in WIRE_MODULES)]
    return found


def _top(module: str) -> str:
    return module.split(".")[1] if "." in module else "__init__"


def _inner(module: str) -> tuple[str, str, int] | None:
    """(package, the name under it, its rank) for a module inside a package of ``INNER_LAYERS``."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in INNER_LAYERS:
        return None
    layers = INNER_LAYERS[parts[1]]
    return parts[1], parts[2], next((rank for rank, names in enumerate(layers) if parts[2] in names), len(layers))


def _inner_offenders(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in graph.items():
        for target in targets:
            low, high = _inner(target), _inner(source)
            if low and high and low[0] == high[0] and low[1] != high[1] and low[2] > high[2]:
                found.append(f"{source} -> {target}")
    return sorted(found)


def _behind_a_face(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a module inside a package of ``FACES`` from outside that package."""
    return sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets for face in FACES
                  if target.startswith(face + ".") and source != face and not source.startswith(face + "."))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_import_circle() -> None:
    graph = _graph()
    assert len(graph) > 100
    assert _cycles(graph) == []


def test_no_upward_or_sideways_arrow_between_packages() -> None:
    offenders = sorted(f"{source} -> {target}" for source, targets in _graph().items() for target in targets
                       if _top(source) != _top(target) and _layer(target) >= _layer(source))
    assert offenders == []


def test_no_upward_arrow_inside_a_package() -> None:
    assert _inner_offenders(_graph()) == []


def test_a_package_with_one_face_is_imported_through_it() -> None:
    graph = _graph()
    assert all(face in graph for face in FACES)
    assert _behind_a_face(graph) == []


def test_the_http_door_imports_neither_grpc_nor_protobuf() -> None:
    offenders = {f"{_name(p)}: {', '.join(found)}" for top in WIRE_FREE for p in (PACKAGE / top).rglob("*.py")
                 if (found := _wire_imports(p))}
    assert offenders == set()


def test_the_checks_see_a_circle_and_an_upward_arrow() -> None:
    """Guard: the graph walk must report what it is there to catch."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("proctor.api.servicer") > _layer("proctor.engine.engine") > _layer("proctor.decoding.pipeline")
    graph = _graph()
    assert "proctor.engine.loaded_model" in graph["proctor.engine.engine"]  # a plain import is seen
    assert "proctor.decoding.forbidden" in graph["proctor.engine.preprocess"]  # so is one inside a function
    face = FACES[0]
    assert _behind_a_face({"proctor.engine.x": {f"{face}.closer"}, f"{face}.rule": {f"{face}.closer"},
                           "proctor.api.y": {face}}) == [f"proctor.engine.x -> {face}.closer"]
    assert _inner_offenders({f"{face}.support": {"proctor.constraints.compiler", "proctor.constraints.spec"},
                             "proctor.constraints.service": {f"{face}.support"}}) \
        == [f"{face}.support -> proctor.constraints.compiler"]
    assert _wire_imports(PACKAGE / "api" / "servicer.py")  # the gRPC door's imports are seen
    assert _wire_imports(PACKAGE / "api" / "errors.py")
