"""The committed client stubs are exactly what `make proto` generates from proto/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers.requirements import require_module

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "clients" / "python" / "src" / "proctor_client" / "v1"
STALE = "stubs are stale: run `make proto`"


def _generator():  # type: ignore[no-untyped-def]
    require_module("grpc_tools", "grpcio-tools (a dev dependency) is needed to regenerate stubs")
    spec = importlib.util.spec_from_file_location("_proctor_gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_stubs_are_fresh(tmp_path: Path) -> None:
    written = _generator().generate(tmp_path / "v1")
    assert written, "gen_proto.generate wrote nothing"
    fresh = _files(tmp_path / "v1")
    committed = _files(COMMITTED)
    assert "generation_pb2.py" in fresh
    missing = sorted(set(fresh) - set(committed))
    extra = sorted(set(committed) - set(fresh))
    changed = sorted(name for name in set(fresh) & set(committed) if fresh[name] != committed[name])
    if missing or extra or changed:
        pytest.fail(f"{STALE} (missing: {missing}, not generated: {extra}, different: {changed})")
