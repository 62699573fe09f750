"""Forbidden phrases: throughput with 1,000 phrases vs none, and the per-step mask cost.

1. **Throughput** — the real default model through the engine, greedy, the same prompts, runs
   alternating between no forbidden list and a list of N phrases (real words drawn from the
   vocabulary with a fixed seed, so some of them do come up and the masks have work to do).
   Prints medians of tokens/s and the ratio.
2. **Mask cost per step** — replaying the generated token sequences through a tracker: cold
   (first visit of each automaton state: the trie walk) and warm (cached sets), plus the cost of
   applying the set to a [1, V] mask, and the one-off index build time.

    python bench/forbidden.py [--phrases 1000] [--new-tokens 128] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

import torch  # noqa: E402
from prompts import PROMPTS  # noqa: E402

from proctor.config import Settings  # noqa: E402
from proctor.constraints.backends.vocab import token_bytes  # noqa: E402
from proctor.decoding.forbidden import ForbiddenOptions, ForbiddenTracker, build_index  # noqa: E402
from proctor.decoding.forbidden.index import clear_index_cache  # noqa: E402
from proctor.domain import ForbiddenParams, GenerationRequest, StoppingParams  # noqa: E402
from proctor.engine.engine import Engine  # noqa: E402
from proctor.models import load_model  # noqa: E402


def phrase_list(tokenizer: object, count: int, seed: int = 7) -> tuple[str, ...]:
    """Real words from the vocabulary (alphabetic, 4+ letters), with a fixed seed."""
    words = sorted({b.decode("utf-8", "ignore").strip().lower() for b in token_bytes(tokenizer, len(tokenizer))  # type: ignore[arg-type]
                    if b and b.strip().isalpha() and len(b.strip()) >= 4})
    return tuple(random.Random(seed).sample(words, count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phrases", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="rounds over the prompts")
    args = parser.parse_args()
    settings = Settings.load({"warmup": False})
    loaded = load_model(settings)
    phrases = phrase_list(loaded.tokenizer, args.phrases)
    start = time.perf_counter()
    build_index(loaded.tokenizer, loaded.vocab_size, phrases, ForbiddenOptions())
    build_s = time.perf_counter() - start
    engine = Engine(loaded, settings)
    engine.start()
    rates: dict[str, list[float]] = {"none": [], "forbidden": []}
    outputs: list[list[int]] = []
    banned_hits = 0
    try:
        for round_ in range(args.repeats):
            for number, prompt in enumerate(PROMPTS):
                for mode in ("none", "forbidden") if (round_ + number) % 2 == 0 else ("forbidden", "none"):
                    request = GenerationRequest(
                        request_id=f"bench-{mode}-{round_}-{number}", prompt=prompt, token_details=True,
                        stopping=StoppingParams(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens),
                        forbidden=ForbiddenParams(phrases if mode == "forbidden" else ()))
                    begin = time.perf_counter()
                    events = engine.generate_blocking(request)
                    elapsed = time.perf_counter() - begin
                    tokens = [t for e in events for t in e.token_ids]
                    rates[mode].append(len(tokens) / elapsed)
                    if mode == "forbidden":
                        outputs.append(tokens)
                        banned_hits += sum(d.removed_by == "forbidden" for e in events for d in e.details)
            print(f"round {round_ + 1}/{args.repeats}: none {statistics.median(rates['none']):.1f} tok/s, "
                  f"forbidden {statistics.median(rates['forbidden']):.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        engine.shutdown(grace_s=1.0)

    # Mask cost per step, replaying the forbidden runs' outputs through a fresh index (cold) and again (warm).
    clear_index_cache()
    index = build_index(loaded.tokenizer, loaded.vocab_size, phrases, ForbiddenOptions())
    mask = torch.zeros((1, loaded.vocab_size), dtype=torch.bool)
    timings: dict[str, list[float]] = {"cold": [], "warm": []}
    for phase in ("cold", "warm"):
        for tokens in outputs:
            tracker = ForbiddenTracker(index)
            for token in tokens:
                begin = time.perf_counter()
                ban = tracker.banned()
                mask[0] |= ban.base
                if ban.extra.numel():
                    mask[0, ban.extra] = True
                timings[phase].append((time.perf_counter() - begin) * 1e6)
                tracker.advance(token)
    none, forbidden = statistics.median(rates["none"]), statistics.median(rates["forbidden"])
    cold, warm = sorted(timings["cold"]), sorted(timings["warm"])

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    print(f"\nForbidden phrases, greedy, {args.new_tokens} new tokens, {len(PROMPTS)} prompts x {args.repeats} rounds "
          f"(`python bench/forbidden.py --phrases {args.phrases} --new-tokens {args.new_tokens} "
          f"--repeats {args.repeats}`):\n")
    print("| forbidden list | tokens/s (median) | vs none |")
    print("|---|---|---|")
    print(f"| none | {none:.1f} | 1.00x |")
    print(f"| {args.phrases} phrases | {forbidden:.1f} | {forbidden / none:.2f}x |")
    print(f"\nSteps where the ban removed the model's top choice: {banned_hits} of {sum(map(len, outputs))}.")
    print(f"Index build for {args.phrases} phrases: {build_s:.2f} s (once per distinct list, cached; the server-wide "
          "list is built at start).")
    print(f"Mask per step (look-up + apply to a [1, V] mask): warm p50 {pct(warm, 0.5):.0f} us, "
          f"p99 {pct(warm, 0.99):.0f} us; cold (first visit of a state) p50 {pct(cold, 0.5):.0f} us, "
          f"p99 {pct(cold, 0.99):.0f} us.")


if __name__ == "__main__":
    main()
