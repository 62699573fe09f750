"""Rules of the house that the code's shape must keep (DESIGN.md rules 1 and 12)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "service" / "proctor"
API_MODULES = ("proctor.api.servicer", "proctor.api.contracts_servicer", "proctor.api.convert", "proctor.api.errors",
               "proctor.api.validation", "proctor.openai_http.routes", "proctor.openai_http.server")
PROTO_ALLOWED = {"api/convert.py", "api/check_request.py", "api/size_limits.py",
                 "api/servicer.py", "api/audit_servicer.py", "api/contracts_servicer.py",
                 "api/errors.py", "api/readiness.py", "app.py"}
MAX_LINES = 400
PROTO_IMPORT = re.compile(r"^\s*(from|import)\s+[^\n#]*(proctor_client\.v1|generation_pb2)", re.M)


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_api_layer_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in API_MODULES)
        + "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        + "print(','.join(heavy))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src"), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"the API layer imports {result.stdout.strip()}"


def test_protobuf_types_stay_in_the_api_layer() -> None:
    offenders = []
    for path in _modules():
        relative = path.relative_to(PACKAGE).as_posix()
        if relative not in PROTO_ALLOWED and PROTO_IMPORT.search(path.read_text(encoding="utf-8")):
            offenders.append(relative)
    assert not offenders, f"modules outside the API layer import the generated stubs: {offenders}"


def test_the_proto_import_pattern_catches_the_usual_spellings() -> None:
    """Guard: the grep above must recognise the ways a module could import the stubs."""
    for line in ("from proctor_client.v1 import generation_pb2 as pb",
                 "import proctor_client.v1.generation_pb2",
                 "    from proctor_client.v1.generation_pb2 import GenerateRequest"):
        assert PROTO_IMPORT.search(line), line
    assert not PROTO_IMPORT.search("from proctor_client.cli import add_client_commands")


def test_modules_stay_small() -> None:
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules()}
    assert len(sizes) > 10
    offenders = {name: n for name, n in sizes.items() if n >= MAX_LINES}
    assert not offenders, f"modules of {MAX_LINES}+ lines (split them): {offenders}"


def test_proofs_are_checked_with_the_client_package_alone() -> None:
    """A counterparty installs proctor-client only: verify-proof and verify-receipt need no server, torch or store."""
    code = ("import sys\n"
            "from proctor_client.tlog.proof import verify_proof\n"
            "from proctor_client.tlog.cli import run_verify_proof, run_verify_receipt\n"
            "from proctor_client.tlog.receipt import verify_receipt\n"
            "from proctor_client.cli import main\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('proctor', 'torch', 'transformers', "
            "'sqlite3', 'psycopg'))\n"
            "print(','.join(loaded))\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "clients" / "python" / "src"), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"checking a proof loads {result.stdout.strip()}"

