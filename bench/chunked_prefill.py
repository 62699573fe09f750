"""A long prompt joining running streams: how long they wait for their next token, at each step budget.

In one process on the real default model: ``--streams`` requests decode (greedy, EOS ignored); once
they run, a prompt of about ``--long-tokens`` tokens is submitted. Measured from the running streams'
token arrival times over the window from that submission until the long request's first token:
time per output token p50 / p99 / max, and the long request's time to first token. Each
``--budgets`` value (``--max-step-tokens``: the tokens one step's forward is fed, the running rows' and the
prompt's pieces together) runs on its own engine, in alternating rounds, all in the same run.

    python bench/chunked_prefill.py [--budgets 2048,512,256,128] [--streams 4] [--long-tokens 2000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

from proctor.config import Settings  # noqa: E402
from proctor.domain import GenerationRequest, SamplingParams, StoppingParams  # noqa: E402
from proctor.engine.engine import Engine  # noqa: E402
from proctor.models import load_model  # noqa: E402

RUNNING_TOKENS = 3000  # far more than the window takes: the streams run through it
FILLER = ("Clause {i}. The receiving party shall keep the disclosing party's information confidential, "
          "use it only for the permitted purpose and return it on request. ")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def long_prompt(tokenizer: object, tokens: int) -> str:
    """Filler clauses until the text is at least ``tokens`` tokens (built before the streams start)."""
    text, i = "", 0
    while len(tokenizer(text)["input_ids"]) < tokens:  # type: ignore[operator]
        text += "".join(FILLER.format(i=i + j) for j in range(10))
        i += 10
    return text


def one_round(engine: Engine, text: str, streams: int, tag: str) -> dict[str, float]:
    arrivals: list[list[float]] = [[] for _ in range(streams)]
    done = [threading.Event() for _ in range(streams)]
    for index in range(streams):
        def sink(event, index=index):  # type: ignore[no-untyped-def]
            arrivals[index].append(time.monotonic())
            if event.finished:
                done[index].set()
        request = GenerationRequest(request_id=f"{tag}-run-{index}", prompt=f"Write item {index} of a long list:",
                                    sampling=SamplingParams(),
                                    stopping=StoppingParams(max_new_tokens=RUNNING_TOKENS, ignore_eos=True))
        engine.submit(engine.prepare(request), sink)
    while min(len(a) for a in arrivals) < 20:
        time.sleep(0.01)
    first = threading.Event()
    long_done = threading.Event()

    def long_sink(event):  # type: ignore[no-untyped-def]
        first.set()
        if event.finished:
            long_done.set()
    submitted = time.monotonic()
    long = GenerationRequest(request_id=f"{tag}-long", prompt=text, sampling=SamplingParams(),
                             stopping=StoppingParams(max_new_tokens=4, ignore_eos=True))
    engine.submit(engine.prepare(long), long_sink)
    first.wait(600)
    joined = time.monotonic()
    for index in range(streams):
        engine.abort(f"{tag}-run-{index}")  # the window is measured; no need to run them to the end
    for event in done:
        event.wait(600)  # each stream's next event after the window (a token or the abort's end)
    long_done.wait(600)
    assert all(len(a) < RUNNING_TOKENS for a in arrivals), "a running stream ended inside the window"
    gaps = []
    for times in arrivals:
        inside = [t for t in times if submitted <= t <= joined]
        before = [t for t in times if t < submitted]
        points = ([before[-1]] if before else []) + inside
        after = [t for t in times if t > joined]
        if after:
            points.append(after[0])
        gaps += [b - a for a, b in itertools.pairwise(points)]
    return {"ttft_long_ms": (joined - submitted) * 1000, "tpot_p50_ms": statistics.median(gaps) * 1000,
            "tpot_p99_ms": percentile(gaps, 0.99) * 1000, "tpot_max_ms": max(gaps) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", default="2048,512,256,128")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--weights", default="auto")
    args = parser.parse_args()
    budgets = [int(c) for c in args.budgets.split(",")]
    base = {"device": "cpu", "warmup": False, "weights": args.weights, "max_batch_size": args.streams + 1,
            "max_new_tokens_limit": RUNNING_TOKENS}
    loaded = load_model(Settings.load(base, environ={}))
    engines = {c: Engine(loaded, Settings.load({**base, "max_step_tokens": c}, environ={})) for c in budgets}
    for engine in engines.values():
        engine.start()
    text = long_prompt(loaded.tokenizer, args.long_tokens)
    results: dict[int, list[dict[str, float]]] = {c: [] for c in budgets}
    for round_index in range(args.rounds):
        order = budgets if round_index % 2 == 0 else list(reversed(budgets))
        for c in order:
            figures = one_round(engines[c], text, args.streams, f"r{round_index}c{c}")
            results[c].append(figures)
            print(f"round {round_index} budget {c}: {figures}", file=sys.stderr, flush=True)
    for engine in engines.values():
        engine.shutdown(1.0)
    print(f"\n{args.streams} running streams, a {args.long_tokens}-token prompt joins; weights {loaded.weights}; "
          f"median of {args.rounds} rounds\n")
    print("| step budget (tokens) | running streams' TPOT p50 ms | p99 ms | max ms | long prompt TTFT ms |")
    print("|---|---|---|---|---|")
    for c in budgets:
        rows = results[c]

        def med(key: str, rows: list[dict[str, float]] = rows) -> float:
            return statistics.median(r[key] for r in rows)
        print(f"| {c} | {med('tpot_p50_ms'):.0f} | {med('tpot_p99_ms'):.0f} | {med('tpot_max_ms'):.0f} | "
              f"{med('ttft_long_ms'):.0f} |")


if __name__ == "__main__":
    main()
