"""A/B of the gguf products: this tree's kernels against another revision's, in one process, interleaved.

The machine's speed moves by up to 2× over a day here, so two runs at different times do not compare. This
builds the kernels of ``--base`` (a git revision) beside this tree's, under another op namespace
(``torch.ops.baseproctor``), and times both on the same matrices of a GGUF file, call after call: the ratio
is base time ÷ this tree's time (medians), for the VNNI loops (where the CPU has them) and the AVX2 ones.

    python bench/kernel_ab.py FILE.gguf [--base HEAD~1] [--matrices blk.0.attn_q.weight,token_embd.weight]
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

from proctor.engine.fused_decode import CFLAGS, LDFLAGS, load_problem  # noqa: E402
from proctor.models.gguf_file import GgufFile  # noqa: E402

KERNELS = "service/proctor/engine/kernels"
DEFAULT_MATRICES = "blk.0.attn_q.weight,blk.0.ffn_gate.weight,blk.0.ffn_down.weight,token_embd.weight"
ROWS = (1, 16, 80)


def build_base(revision: str, directory: Path) -> None:
    """The revision's kernel sources, every ``proctor`` renamed ``baseproctor`` (ops, namespaces), built."""
    from torch.utils import cpp_extension

    archive = subprocess.run(["git", "archive", revision, KERNELS], cwd=ROOT, check=True, capture_output=True).stdout
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


def median_pair(matrix: object, rows: int) -> tuple[float, float]:
    """(base, this tree) median seconds of one product at ``rows`` rows, the two called in turn."""
    x = torch.randn(rows, matrix.in_features)  # type: ignore[attr-defined]
    ops = {"base": torch.ops.baseproctor.ggml_linear, "this": torch.ops.proctor.ggml_linear}
    times: dict[str, list[float]] = {tag: [] for tag in ops}
    repeats = 6 if matrix.out_features > 100_000 else (12 if rows > 16 else 40)  # type: ignore[attr-defined]
    for _ in range(repeats):
        for tag, op in ops.items():
            began = time.perf_counter()
            op(x, [matrix.blocks], [matrix.ggml_type])  # type: ignore[attr-defined]
            times[tag].append(time.perf_counter() - began)
    return statistics.median(times["base"]), statistics.median(times["this"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--base", default="HEAD~1", help="the git revision to compare against (default HEAD~1)")
    parser.add_argument("--matrices", default=DEFAULT_MATRICES)
    args = parser.parse_args()
    problem = load_problem()
    if problem is not None:
        raise SystemExit(problem)
    with tempfile.TemporaryDirectory(prefix="proctor-kernel-ab-") as scratch:
        build_base(args.base, Path(scratch))
        file = GgufFile(args.gguf)
        print(f"\n`python bench/kernel_ab.py {args.gguf.name} --base {args.base}`, {torch.get_num_threads()} threads\n")
        print("| loops | matrix | type | rows | base ms | this tree ms | speed-up | GMAC/s |\n"
              "|---|---|---|---|---|---|---|---|")
        for loops in ("auto", "avx2"):
            chosen = torch.ops.proctor.q4_loops(loops)
            torch.ops.baseproctor.q4_loops(loops)
            for name in args.matrices.split(","):
                matrix = file.matrix(name)
                for rows in ROWS:
                    base, this = median_pair(matrix, rows)
                    macs = rows * matrix.in_features * matrix.out_features
                    print(f"| {chosen} | {name} | {matrix.block_type} | {rows} | {base * 1e3:.3f} | {this * 1e3:.3f} | "
                          f"{base / this:.2f}× | {macs / this / 1e9:.0f} |", flush=True)
        torch.ops.proctor.q4_loops("auto")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
