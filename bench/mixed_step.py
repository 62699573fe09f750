"""One forward a step (issue 42): prompt tokens as rows of the step, beside the decoding rows.

On the real default model (or ``--model FILE.gguf``), in one process and one run:

- a prompt of T tokens alone, through the rows path (``SlotForward.forward``: every position a row of the layer
  kernel, each with its own bits, the LM head on the last position only);
- 16 decoding rows and a joining prompt of T tokens: a decode step and the prompt in two forwards, against one
  forward carrying both (what the engine runs).

The old per-phase prefill path this was first measured against is gone (issue 55; its figures stay in
bench/README.md). Medians of ``--repeats`` runs; ratios below 1 favour the one forward.

    python bench/mixed_step.py [--weights q4] [--model FILE.gguf] [--prompts 64,128,256,512] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

import torch  # noqa: E402

from proctor.config import Settings  # noqa: E402
from proctor.executor.protocol import Feed  # noqa: E402
from proctor.executor.slot_forward import SlotForward  # noqa: E402
from proctor.models.loader import load_model  # noqa: E402

ROWS, HELD = 16, 100  # decoding rows beside the prompt, and the tokens each already holds


def median_ms(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--model", default="")
    parser.add_argument("--prompts", default="64,128,256,512")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    loaded = load_model(Settings(weights=args.weights, model=args.model))
    lengths = [int(n) for n in args.prompts.split(",")]
    generator = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(100, min(40000, loaded.vocab_size), (n,), generator=generator).tolist()

    print(f"{loaded.model_id}, weights {loaded.weights}, {torch.get_num_threads()} threads, median of "
          f"{args.repeats}\n")
    print("| prompt tokens | prompt alone ms | 16 decode rows + prompt: two forwards ms | one forward ms "
          "| one ÷ two |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        runner = SlotForward(loaded.model, ROWS + 1, loaded.device, loaded.weights)
        for slot in range(ROWS):
            runner.forward([Feed(slot, tokens(HELD), 1)])
        decode = [Feed(slot, [5], 1) for slot in range(ROWS)]
        for n in lengths:
            prompt = tokens(n)

            def alone(prompt: list[int] = prompt) -> None:
                runner.free(ROWS)
                runner.forward([Feed(ROWS, prompt, 1)])

            def apart(prompt: list[int] = prompt) -> None:
                for slot in range(ROWS):
                    runner.trim(slot, HELD)
                runner.forward(decode)
                alone(prompt)

            def together(prompt: list[int] = prompt) -> None:
                for slot in range(ROWS):
                    runner.trim(slot, HELD)
                runner.free(ROWS)
                runner.forward([*decode, Feed(ROWS, prompt, 1)])

            figures = [median_ms(run, args.repeats) for run in (alone, apart, together)]
            print(f"| {n} | {figures[0]:.1f} | {figures[1]:.1f} | {figures[2]:.1f} | {figures[2] / figures[1]:.2f} |",
                  flush=True)

if __name__ == "__main__":
    main()
