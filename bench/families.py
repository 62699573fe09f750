"""Decode steps of other model families on the batched slot forward (issue 25), against the path they had
before: transformers' own forward one row after another (``PerSlotExecutor``).

Random-weight models of real shapes (speed does not depend on the weights): Qwen2.5-0.5B, Qwen3-0.6B and
Gemma-3-270M. For each, the median decode step at 1 and 16 rows (each row prefilled with its own prompt)
for: the per-slot path (dense fp32, as before), the slot forward on the same dense weights (the batching
alone), the slot forward on q4 weights through PyTorch operations, and — where the family is one the q4
C++ kernel computes — the slot forward in that kernel. Ratios are
against the per-slot path measured in the same run. Also checked: a row's logits are the same bits alone
and in the batch of 16, on every batched path.

    python bench/families.py [--families qwen2,qwen3,gemma3] [--rows 1,16] [--steps 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

import torch  # noqa: E402
import transformers  # noqa: E402

from proctor.executor.build import PerSlotExecutor  # noqa: E402
from proctor.executor.families import decodes_fused, describe  # noqa: E402
from proctor.executor.protocol import Executor, Feed  # noqa: E402
from proctor.executor.slot_forward import SlotForward  # noqa: E402

SHAPES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2.5-0.5B", {
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3-0.6B", {
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma-3-270M", {
        "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768,
        "query_pre_attn_scalar": 256, "sliding_window": 512, "rms_norm_eps": 1e-6}),
}
PROMPT_TOKENS = 32


def build(family: str) -> torch.nn.Module:
    config_class, model_class, _, shape = SHAPES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**shape)
    return getattr(transformers, model_class)(config).float().eval().requires_grad_(False)


def prompts(rows: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(10, vocab, (PROMPT_TOKENS + 3 * r,), generator=generator).tolist() for r in range(rows)]


def step_times(runner: Executor, rows: list[list[int]], steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """Every row's prompt (a forward each), then ``steps`` decode steps of all rows; each step's seconds and
    logits."""
    nexts = [int(runner.forward([Feed(i, ids, 1)])[0].argmax()) for i, ids in enumerate(rows)]
    times, logits = [], []
    for _ in range(steps):
        start = time.perf_counter()
        out = runner.forward([Feed(slot, [token], 1) for slot, token in enumerate(nexts)])
        times.append(time.perf_counter() - start)
        logits.append(out)
        nexts = [int(row.argmax()) for row in out]
    return times, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(SHAPES))
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    table = []
    with torch.inference_mode():
        for family in args.families.split(","):
            model = build(family)
            shape = SHAPES[family][2]
            fam = describe(model.config)
            paths = [("per-slot, dense (before)", lambda rows, m=model: PerSlotExecutor(m, rows, torch.device("cpu"))),
                     ("slot forward, dense, PyTorch ops", None), ("slot forward, q4, PyTorch ops", None)]
            if decodes_fused(fam, "q4"):
                paths.append(("slot forward, q4, C++ kernel", None))
            for rows in (int(r) for r in args.rows.split(",")):
                texts = prompts(rows, model.config.vocab_size)
                baseline = None
                for label, make in paths:
                    mode = "dense" if ", dense," in label else "q4"
                    products = "kernels" if label.endswith("C++ kernel") else "library"  # the same weights either way
                    runner: Executor
                    if make is None:
                        runner = SlotForward(model, rows, torch.device("cpu"), mode, products=products)
                    else:
                        runner = make(rows)
                    times, logits = step_times(runner, texts, args.steps)
                    median = statistics.median(times[1:])  # the first step after prefills is not the figure
                    baseline = baseline or median
                    identical = ""
                    if make is None and rows > 1:  # row 0 alone on a fresh runner of the same kind
                        alone = SlotForward(model, 1, torch.device("cpu"), mode, products=products)
                        _, single = step_times(alone, texts[:1], args.steps)
                        same = all(torch.equal(a[0], b[0]) for a, b in zip(single, logits, strict=True))
                        identical = "yes" if same else "**no**"
                    table.append((f"{shape} ({family})", label, rows, median * 1000, rows / median,
                                  baseline / median, identical))
                    print(f"{shape} {label} rows={rows}: {median * 1000:.1f} ms/step, {rows / median:.1f} tokens/s",
                          file=sys.stderr, flush=True)
            del model
    print(f"\nFamilies (`python {' '.join(sys.argv)}`; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}):\n")
    print("| model shape | path | rows | step ms (median) | tokens/s | vs per-slot | row alone = in batch |")
    print("|---|---|---|---|---|---|---|")
    for shape, label, rows, ms, tps, ratio, identical in table:
        print(f"| {shape} | {label} | {rows} | {ms:.1f} | {tps:.1f} | {ratio:.2f}x | {identical or '-'} |")


if __name__ == "__main__":
    main()
