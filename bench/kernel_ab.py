"""A/B of the gguf products: this tree's kernels against another revision's, in one process, interleaved.

The machine's speed moves by up to 2× over a day here, so two runs at different times do not compare. This
builds the kernels of ``--base`` (a git revision) beside this tree's, under another op namespace
(``torch.ops.baseproctor``), and times both on the same matrices of a GGUF file, call after call: the ratio
is base time ÷ this tree's time (medians), for the VNNI loops (where the CPU has them) and the AVX2 ones.

A name with ``*`` (``blk.*.ffn_gate.weight``) stands for that matrix of every layer, multiplied one after
another as a decode step does: a working set past the caches, so one row shows the memory-bound rate.

``--grouped`` repacks the Q4_K matrices eight rows to a group first, as the server serves them.

    python bench/kernel_ab.py FILE.gguf [--base HEAD~1] [--matrices blk.0.attn_q.weight,blk.*.ffn_gate.weight]
                              [--grouped]
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

import torch  # noqa: E402

from proctor.executor.fused_decode import CFLAGS, LDFLAGS, load_problem  # noqa: E402
from proctor.executor.gguf_linear import GgufLinear  # noqa: E402
from proctor.models.gguf_file import GgufFile  # noqa: E402

KERNELS = ("service/proctor/executor/kernels", "service/proctor/engine/kernels")  # where they are; where they were
DEFAULT_MATRICES = "blk.0.attn_q.weight,blk.0.ffn_gate.weight,blk.0.ffn_down.weight,token_embd.weight"
ROWS = "1,16,80"


def build_base(revision: str, directory: Path) -> None:
    """The revision's kernel sources, every ``proctor`` renamed ``baseproctor`` (ops, namespaces), built."""
    from torch.utils import cpp_extension

    for kernels in KERNELS:
        found = subprocess.run(["git", "archive", revision, kernels], cwd=ROOT, check=False, capture_output=True)
        if found.returncode == 0:
            archive = found.stdout
            break
    else:
        raise SystemExit(f"{revision} has none of {', '.join(KERNELS)}")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
                target = directory / "src" / Path(member.name).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text.replace("proctor", "baseproctor"))
    build = directory / "build"
    build.mkdir(exist_ok=True)
    sources = sorted(str(source) for source in (directory / "src").glob("*.cpp"))
    print(f"building {revision}'s kernels ({len(sources)} sources; a minute or two)", flush=True)
    cpp_extension.load(name="baseproctor_decode", sources=sources, extra_cflags=[*CFLAGS, "-DPROCTOR_HEADERS_DIGEST=1"],
                       extra_ldflags=LDFLAGS, build_directory=str(build), is_python_module=False, verbose=False)


def median_pair(matrices: list[GgufLinear], rows: int, scale: int) -> tuple[float, float]:
    """(base, this tree) median seconds of one product per matrix at ``rows`` rows, the two called in turn."""
    first = matrices[0]
    x = torch.randn(rows, first.in_features)
    ops = {"base": torch.ops.baseproctor.ggml_linear, "this": torch.ops.proctor.ggml_linear}
    times: dict[str, list[float]] = {tag: [] for tag in ops}
    repeats = scale * (6 if first.out_features > 100_000 or len(matrices) > 1 else (12 if rows > 16 else 40))
    for _ in range(repeats):
        for tag, op in ops.items():
            began = time.perf_counter()
            for matrix in matrices:
                op(x, [matrix.blocks], [matrix.ggml_type])
            times[tag].append(time.perf_counter() - began)
    return statistics.median(times["base"]), statistics.median(times["this"])


def named(file: GgufFile, name: str) -> list[GgufLinear]:
    """The matrix called ``name``, or with ``*`` that matrix of every layer."""
    if "*" not in name:
        return [file.matrix(name)]
    layers = [name.replace("*", str(i)) for i in range(1000)]
    return [file.matrix(layer) for layer in layers if file.has(layer)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--base", default="HEAD~1", help="the git revision to compare against (default HEAD~1)")
    parser.add_argument("--matrices", default=DEFAULT_MATRICES)
    parser.add_argument("--rows", default=ROWS, help="activation rows to time, comma-separated")
    parser.add_argument("--repeats", type=int, default=1, help="times the default number of calls (noisy machines)")
    parser.add_argument("--grouped", action="store_true", help="Q4_K repacked eight rows to a group, as served")
    args = parser.parse_args()
    problem = load_problem()
    if problem is not None:
        raise SystemExit(problem)
    with tempfile.TemporaryDirectory(prefix="proctor-kernel-ab-") as scratch:
        build_base(args.base, Path(scratch))
        file = GgufFile(args.gguf)
        print(f"\n`python bench/kernel_ab.py {args.gguf.name} --base {args.base}{' --grouped' * args.grouped}`, "
              f"{torch.get_num_threads()} threads\n")
        print("| loops | matrix | type | rows | base ms | this tree ms | speed-up | GMAC/s |\n"
              "|---|---|---|---|---|---|---|---|")
        for loops in ("auto", "avx2"):
            chosen = torch.ops.proctor.q4_loops(loops)
            torch.ops.baseproctor.q4_loops(loops)
            for name in args.matrices.split(","):
                matrices = named(file, name)
                if args.grouped:  # as the server serves them (one layout in both trees)
                    matrices = [m.grouped() for m in matrices]
                matrix = matrices[0]
                for rows in (int(r) for r in args.rows.split(",")):
                    base, this = median_pair(matrices, rows, args.repeats)
                    macs = rows * matrix.in_features * matrix.out_features * len(matrices)
                    print(f"| {chosen} | {name} | {matrix.block_type} | {rows} | {base * 1e3:.3f} | {this * 1e3:.3f} | "
                          f"{base / this:.2f}× | {macs / this / 1e9:.0f} |", flush=True)
        torch.ops.proctor.q4_loops("auto")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
