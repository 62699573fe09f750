"""Q4_K products on the file's rows against the same weights repacked eight rows to a group (kernels/ggml_r8.h, issue
57's lever at one and a few activation rows), interleaved in one process on every Q4_K matrix of a GGUF file's
layers, one after another as a decode step reads them (a working set past the caches): median ms, GB/s of the file's
bytes, and the ratio, at 1 and 2 threads and 1, 2 and 4 rows (``--rows``), for the loops the CPU has. The two give
the same bits (tests/unit/test_q4k_repack.py). ``--steps N`` also times the whole slot-forward decode step at 1, 2,
4, 8 and 16 streams: the file loaded twice, served grouped (as the server does) and on its rows, steps alternating.

    python bench/q4k_repack.py FILE.gguf [--rounds 7] [--steps 12] [--rows 1,2,4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

import torch  # noqa: E402

from proctor.executor.fused_decode import load_problem  # noqa: E402
from proctor.executor.gguf_linear import Q4_K_R8  # noqa: E402
from proctor.models.gguf_file import GgufFile  # noqa: E402

Q4_K = 12
PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=0, help="decode steps per stream count (0: no step table)")
    parser.add_argument("--rows", default="1,2,4", help="activation rows of the product table, comma-separated")
    args = parser.parse_args()
    problem = load_problem()
    if problem is not None:
        raise SystemExit(problem)
    file = GgufFile(args.gguf)
    names = [f"blk.{i}.{part}.weight" for i in range(1000) for part in PARTS if file.has(f"blk.{i}.{part}.weight")]
    matrices = [m for m in (file.matrix(name) for name in names) if m.ggml_type == Q4_K and m.out_features % 8 == 0]
    grouped = [torch.ops.proctor.repack_q4_k(m.blocks, m.in_features) for m in matrices]
    size = sum(m.nbytes for m in matrices)
    product = torch.ops.proctor.ggml_linear
    loops = ["auto", "avx2"] if torch.ops.proctor.q4_loops("") == "avx512-vnni" else ["avx2"]
    print(f"\n`python bench/q4k_repack.py {args.gguf.name}`: {len(matrices)} Q4_K matrices, {size / 1e6:.0f} MB\n")
    print("| threads | rows | loops | file rows ms (GB/s) | grouped ms (GB/s) | speed-up |\n|---|---|---|---|---|---|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for rows in (int(r) for r in args.rows.split(",")):
            inputs = {k: torch.randn(rows, k) for k in {m.in_features for m in matrices}}
            for chosen in loops:
                name = torch.ops.proctor.q4_loops(chosen)
                times: dict[str, list[float]] = {"file": [], "grouped": []}
                ways = (("file", [m.blocks for m in matrices], Q4_K), ("grouped", grouped, Q4_K_R8))
                for _ in range(args.rounds):
                    for tag, weights, kind in ways:
                        began = time.perf_counter()
                        for m, w in zip(matrices, weights, strict=True):
                            product(inputs[m.in_features], [w], [kind])
                        times[tag].append(time.perf_counter() - began)
                file_s, grouped_s = statistics.median(times["file"]), statistics.median(times["grouped"])
                print(f"| {threads} | {rows} | {name} | {file_s * 1e3:.1f} ({size / file_s / 1e9:.1f}) | "
                      f"{grouped_s * 1e3:.1f} ({size / grouped_s / 1e9:.1f}) | {file_s / grouped_s:.2f}× |", flush=True)
    torch.ops.proctor.q4_loops("auto")
    torch.set_num_threads(2)
    if args.steps:
        steps(args.gguf, args.steps)
    return 0


def steps(path: Path, count: int) -> None:
    """The decode step, grouped against the file's rows, at several stream counts (medians, steps alternating)."""
    from proctor.config import Settings
    from proctor.executor.gguf_linear import GgufLinear
    from proctor.executor.protocol import Feed
    from proctor.executor.slot_forward import SlotForward
    from proctor.models.loader import load_model

    def served(grouped: bool) -> SlotForward:
        original = GgufLinear.grouped
        if not grouped:
            GgufLinear.grouped = lambda self: self  # type: ignore[method-assign]
        try:
            return SlotForward(load_model(Settings(model=str(path), weights="gguf")).model, 16, torch.device("cpu"),
                               "gguf")
        finally:
            GgufLinear.grouped = original  # type: ignore[method-assign]

    forwards = {"grouped": served(True), "file": served(False)}
    print("\n| streams | file rows ms | grouped ms | speed-up |\n|---|---|---|---|")
    with torch.inference_mode():
        for slots in forwards.values():
            for slot in range(16):
                slots.free(slot)
                slots.forward([Feed(slot, [(slot * 7 + i) % 1000 + 10 for i in range(40)], 1)])
        for streams in (1, 2, 4, 8, 16):
            times: dict[str, list[float]] = {tag: [] for tag in forwards}
            for step in range(count):
                for tag, slots in forwards.items():
                    began = time.perf_counter()
                    slots.forward([Feed(slot, [(step + slot) % 1000 + 10], 1) for slot in range(streams)])
                    times[tag].append(time.perf_counter() - began)
            file_s, grouped_s = (statistics.median(times[tag][1:]) for tag in ("file", "grouped"))
            print(f"| {streams} | {file_s * 1e3:.1f} | {grouped_s * 1e3:.1f} | {file_s / grouped_s:.2f}× |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
