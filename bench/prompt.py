"""One prompt alone (issue 57): Proctor's prompt processing against llama-bench's ``pp512`` on the same GGUF file.

Time to first token at one stream is the prompt's forward; llama-bench's ``-p 512 -n 0`` is llama.cpp's figure for
it. Here, in one run: Proctor's slot forward (``--weights gguf``, the C++ layer step) over a ``--prompt``-token
prompt into an empty slot, median of ``--rounds``, with the VNNI loops (where the CPU has them) and with the AVX2
ones forced (the same bits), then ``llama-bench -p N -n 0 -t THREADS`` on the file twice: built for this CPU
(``-march=native``, AMX off) and built as for an AVX2-only CPU (bench/llama_server.py ``--isa avx2``), each
compared with the loops of the same instruction sets. Where the
time goes: the same prompt's rows through each matrix of one layer alone (the products, × layers); the rest
(attention, norms, rotary, the cache, the LM head of the last position) is the difference.

    python bench/prompt.py FILE.gguf [--prompt 512] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "service"))


def instruction_sets() -> str:
    """The CPU's model and the vector instruction sets the kernels can use (what every table here says)."""
    flags, model = set(), "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile"]
    return f"{model}: " + ", ".join(flag for flag in wanted if flag in flags)


def proctor_prompt(path: Path, prompt: int, rounds: int, threads: int) -> dict[str, Any]:
    import torch

    from proctor.config import Settings
    from proctor.executor.protocol import Feed
    from proctor.executor.slot_forward import SlotForward
    from proctor.models.loader import load_model

    torch.set_num_threads(threads)
    loaded = load_model(Settings(model=str(path), weights="gguf"))
    slots = SlotForward(loaded.model, 1, torch.device("cpu"), "gguf")
    tokens = [(7 * i) % 1000 + 10 for i in range(prompt)]
    figures: dict[str, Any] = {}
    with torch.inference_mode():
        for loops in ("auto", "avx2"):
            chosen = torch.ops.proctor.q4_loops(loops)
            times = []
            for _ in range(rounds + 1):
                slots.free(0)
                began = time.perf_counter()
                slots.forward([Feed(0, tokens, 1)])
                times.append(time.perf_counter() - began)
            median = statistics.median(times[1:])
            figures[chosen] = {"prompt_ms": median * 1e3, "tokens_s": prompt / median,
                               **_products(path, prompt, rounds)}
        torch.ops.proctor.q4_loops("auto")
    return figures


def _products(path: Path, prompt: int, rounds: int) -> dict[str, float]:
    """The prompt's rows through one layer's matrices, times the layers (the LM head, one row, is left out)."""
    import torch

    from proctor.models.gguf_file import GgufFile

    gguf = GgufFile(path)
    layers = sum(1 for index in range(1000) if gguf.has(f"blk.{index}.attn_q.weight"))
    names = [f"blk.0.{part}.weight" for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                 "ffn_down")]
    total = 0.0
    for name in names:
        matrix = gguf.matrix(name)
        x = torch.randn(prompt, matrix.in_features)
        torch.ops.proctor.ggml_linear(x, [matrix.blocks], [matrix.ggml_type])
        times = []
        for _ in range(max(2, rounds // 2)):
            began = time.perf_counter()
            torch.ops.proctor.ggml_linear(x, [matrix.blocks], [matrix.ggml_type])
            times.append(time.perf_counter() - began)
        total += statistics.median(times)
    return {"products_ms": total * layers * 1e3}


def llama_bench(path: Path, prompt: int, threads: int, isa: str = "native") -> float:
    """llama-bench's prompt rate on ``path``, built for this CPU (``native``) or as an AVX2-only CPU builds it."""
    from llama_server import ensure_build, run_llama_bench

    build = ensure_build(isa=isa)
    rows = run_llama_bench(build.bench, path, ["-p", str(prompt), "-n", "0", "-t", str(threads), "-r", "3"])
    return float(rows[0]["avg_ts"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--prompt", default="512", help="prompt lengths, comma-separated (48: a chat turn's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"CPU: {instruction_sets()}")
    print(f"\n`python bench/prompt.py {args.gguf.name} --prompt {args.prompt} --rounds {args.rounds}`, "
          f"{args.threads} threads\n")
    print("| prompt | loops (Proctor / llama.cpp build) | Proctor tok/s | llama-bench tok/s | ratio "
          "| Proctor prompt ms | its products ms (share) |")
    print("|---|---|---|---|---|---|---|")
    report = []
    for prompt in (int(length) for length in args.prompt.split(",")):
        ours = proctor_prompt(args.gguf, prompt, args.rounds, args.threads)
        theirs = {isa: llama_bench(args.gguf, prompt, args.threads, isa) for isa in ("native", "avx2")}
        for loops, cell in ours.items():
            isa = "avx2" if loops == "avx2" else "native"
            rate = theirs[isa]
            print(f"| {prompt} | {loops} / {isa} | {cell['tokens_s']:.1f} | {rate:.1f} | "
                  f"{cell['tokens_s'] / rate:.2f}× | {cell['prompt_ms']:.0f} | {cell['products_ms']:.0f} "
                  f"({cell['products_ms'] / cell['prompt_ms']:.0%}) |", flush=True)
        report.append({"prompt": prompt, "proctor": ours, "llama_bench_tokens_s": theirs})
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
