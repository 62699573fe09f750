"""The gguf weights mode's matrix products, per block type, on one layer of a real GGUF file (issue 25).

For each matrix of layer 0 and the token embedding (the tied LM head): its block type, shape, and the
median time of one product at 1, 16 and 80 rows, as GB/s of weights read and as multiply-adds per second.
One row is memory-bound where the kernel keeps up (the roofline here is ~24 GB/s); 16 rows (a full decode
batch) and 80 (a prompt's prefill) show the arithmetic.

    python bench/gguf_products.py FILE.gguf [--repeats 20]
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
from proctor.models.gguf_file import GgufFile  # noqa: E402

NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def median_ms(product: object, x: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        product(x)  # type: ignore[operator]
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    problem = load_problem()
    if problem is not None:
        raise SystemExit(problem)
    file = GgufFile(args.gguf)
    print(f"`python bench/gguf_products.py {args.gguf.name}`, {torch.get_num_threads()} threads\n")
    print("| matrix | type | out × in | 1 row ms (GB/s) | 16 rows ms (GMAC/s) | 80 rows ms (GMAC/s) |\n"
          "|---|---|---|---|---|---|")
    names = [f"blk.0.{name}.weight" for name in NAMES] + ["token_embd.weight"]
    for name in (n for n in names if file.has(n)):
        matrix = file.matrix(name)
        repeats = max(3, args.repeats // 4) if matrix.out_features > 100_000 else args.repeats
        one = median_ms(matrix, torch.randn(1, matrix.in_features), repeats)
        many = median_ms(matrix, torch.randn(16, matrix.in_features), repeats)
        prompt = median_ms(matrix, torch.randn(80, matrix.in_features), max(3, repeats // 4))
        macs = matrix.in_features * matrix.out_features
        print(f"| {name} | {matrix.block_type} | {matrix.out_features} × {matrix.in_features} | "
              f"{one:.3f} ({matrix.nbytes / one / 1e6:.1f}) | {many:.3f} ({16 * macs / many / 1e6:.1f}) | "
              f"{prompt:.3f} ({80 * macs / prompt / 1e6:.1f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
