"""Beam search benchmark (issue 15): Proctor's engine against ``model.generate(num_beams=...)`` in the same run.

Both on the default model, one request at a time, the same prompts (bench/prompts.py), greedy beam
search with ``--beams`` beams, ``--new-tokens`` new tokens, EOS allowed: Proctor's engine in this process
(``--weights``: its weights mode; ``dense`` is the exact reference, the same arithmetic as transformers)
and transformers' own ``generate()`` on the same model's fp32 weights. Prints the median time per
request, the ratio, and how many best beams are identical to generate()'s (expected: all, in dense mode;
q4 runs other weights, so its beams may differ).

    python bench/beam.py [--beams 4] [--new-tokens 48] [--rounds 3] [--weights auto|dense|q8|q4]

``--beside N``: instead, each beam request with N plain requests (the same prompt, as many new tokens) submitted
at the same moment, as a service sees them: the wall time until all are answered and the engine steps it took
(beams share each step's one forward with the plain rows; they once ran a forward of their own beside it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "bench")]

import torch  # noqa: E402
from prompts import PROMPTS  # noqa: E402

from proctor.config import Settings  # noqa: E402
from proctor.domain import GenerationRequest, SamplingParams, StoppingParams  # noqa: E402
from proctor.engine.engine import Engine  # noqa: E402
from proctor.models import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--beside", type=int, default=0, help="plain requests beside each beam request")
    args = parser.parse_args()
    settings = Settings.load({"weights": args.weights, "warmup": False})
    loaded = load_model(settings)
    engine = Engine(loaded, settings)
    engine.start()
    if args.beside:
        try:
            beside(engine, args)
        finally:
            engine.shutdown(5)
        return
    tokenizer, model = loaded.tokenizer, loaded.model
    ours: list[float] = []
    theirs: list[float] = []
    same = total = 0
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up both
            for index, prompt in enumerate(PROMPTS):
                request = GenerationRequest(
                    request_id=f"beam-{round_}-{index}", prompt=prompt,
                    sampling=SamplingParams(num_beams=args.beams),
                    stopping=StoppingParams(max_new_tokens=args.new_tokens))
                start = time.perf_counter()
                events = engine.generate_blocking(request)
                took = time.perf_counter() - start
                final = events[-1]
                assert final.error is None, final.error
                best = list(final.sequences[0].token_ids)
                ids = torch.tensor([tokenizer(prompt)["input_ids"]])
                start = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         num_beams=args.beams, max_new_tokens=args.new_tokens,
                                         eos_token_id=list(loaded.eos_token_ids), pad_token_id=tokenizer.pad_token_id)
                baseline = time.perf_counter() - start
                reference = out[0, ids.shape[1]:].tolist()
                if loaded.eos_token_ids[0] in reference:
                    reference = reference[:reference.index(loaded.eos_token_ids[0]) + 1]
                if round_:
                    ours.append(took)
                    theirs.append(baseline)
                    total += 1
                    same += best == reference
    finally:
        engine.shutdown(5)
    mine, base = statistics.median(ours), statistics.median(theirs)
    print(f"\n`python bench/beam.py --beams {args.beams} --new-tokens {args.new_tokens} --rounds {args.rounds} "
          f"--weights {args.weights}` ({loaded.weights} weights)\n")
    print("| | time per request p50 | × generate() | best beam identical to generate()'s |")
    print("|---|---|---|---|")
    print(f"| generate(num_beams={args.beams}), fp32 | {base * 1000:.0f} ms | 1.00 | — |")
    print(f"| Proctor, {loaded.weights} weights | {mine * 1000:.0f} ms | {base / mine:.2f}× faster | "
          f"{same} of {total} |")


def beside(engine: Engine, args: argparse.Namespace) -> None:
    """Each beam request with ``args.beside`` plain ones at once: wall time and engine steps until all end."""
    walls: list[float] = []
    steps: list[int] = []
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for index, prompt in enumerate(PROMPTS):
            stopping = StoppingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
            requests = [GenerationRequest(request_id=f"beam-{round_}-{index}", prompt=prompt, stopping=stopping,
                                          sampling=SamplingParams(num_beams=args.beams))]
            requests += [GenerationRequest(request_id=f"plain-{round_}-{index}-{n}", prompt=prompt, stopping=stopping)
                         for n in range(args.beside)]
            left = threading.Semaphore(0)

            def sink(event: object, left: threading.Semaphore = left) -> None:
                if getattr(event, "finished", False):
                    left.release()

            prepared = [engine.prepare(request) for request in requests]
            before, start = engine.steps, time.perf_counter()
            for one in prepared:
                engine.submit(one, sink)
            for _ in requests:
                left.acquire()
            if round_:
                walls.append(time.perf_counter() - start)
                steps.append(engine.steps - before)
    print(f"\n`python bench/beam.py --beams {args.beams} --new-tokens {args.new_tokens} --rounds {args.rounds} "
          f"--weights {args.weights} --beside {args.beside}`\n")
    print("| requests at once | wall p50 | engine steps p50 |\n|---|---|---|")
    print(f"| 1 beam search ({args.beams} beams) + {args.beside} plain | {statistics.median(walls) * 1000:.0f} ms | "
          f"{statistics.median(steps):.0f} |")


if __name__ == "__main__":
    main()
