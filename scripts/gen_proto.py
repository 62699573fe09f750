"""Regenerate the Python stubs that the client distribution owns (``make proto``).

protoc names generated modules after the proto package (``proctor.v1``), which would clash with
the server package ``proctor``; the stubs therefore live under ``proctor_client.v1`` and their
imports are rewritten to match. ``tests/unit/test_stubs_fresh.py`` fails when they are stale.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
DEFAULT_OUT = ROOT / "clients" / "python" / "src" / "proctor_client" / "v1"


def generate(out_dir: Path) -> list[Path]:
    """Generate stubs for every proto under proto/proctor/v1 into out_dir; return the files."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "proctor" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        grpc_include = Path(protoc.__file__).parent / "_proto"
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{grpc_include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "proctor" / "v1").iterdir()):
            text = re.sub(r"^from proctor\.v1 import", "from proctor_client.v1 import", src.read_text(), flags=re.M)
            dest = out_dir / src.name
            dest.write_text(text)
            written.append(dest)
        init = out_dir / "__init__.py"
        init.write_text('"""Generated protobuf and gRPC stubs for proctor.v1 (do not edit; run `make proto`)."""\n')
        written.append(init)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.out.exists() and args.out == DEFAULT_OUT:
        shutil.rmtree(args.out)
    for path in generate(args.out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path, file=sys.stderr)


if __name__ == "__main__":
    main()
