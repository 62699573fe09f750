"""Before and after a change, in one run: the same server bench on two source trees, alternating (issue 55).

A refactor must not slow the server; these machines are shared and noisy, so figures taken in separate runs
cannot say so. This runs one bench (bench/peer.py with Proctor alone, or bench/openai_http.py) from each tree's
own ``bench/`` directory (so each serves its own ``service/``), one round at a time, the order alternating
between rounds (base, head; head, base; ...), and prints per cell the median tokens/s and time to first token
of each tree, head ÷ base as the ratio of the medians and as the median of each round's ratio (a round's pair
shares the machine's load of the moment).

    python bench/trees.py --base /path/to/old/checkout [--head .] [--rounds 4] peer [peer.py's arguments]
    python bench/trees.py --base /path/to/old/checkout openai_http [openai_http.py's arguments]

The base tree needs the head's ``.proctor`` (model store, llama.cpp build): link it (``ln -s``) or let the
base build its own. A ``git worktree add --detach DIR COMMIT`` makes a base tree of any commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXED = {  # what each bench is given so that one call is one round of Proctor alone
    "peer": ["--servers", "proctor", "--rounds", "1", "--llama-bench-args", "none"],
    "openai_http": ["--rounds", "1"],
}
Cells = dict[str, tuple[float, float]]  # cell → (tokens/s, TTFT p50 in ms)


def _p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3 if samples else float("nan")


def cells_of(bench: str, report: dict[str, Any]) -> Cells:
    """One round's figures, by cell name."""
    if bench == "peer":
        return {f"{c['mode']} x{c['streams']}": (c["tokens_per_s"], _p50_ms(c["ttft_s"]))
                for c in report["cells"] if c["server"] == "proctor"}
    return {f"{door} x{n}": (statistics.median(c["rates"]) if c["rates"] else float("nan"), _p50_ms(c["ttft_s"]))
            for door, by in report.items() for n, c in by.items()}


def one_round(tree: Path, bench: str, args: list[str], out: Path) -> Cells:
    command = [sys.executable, str(tree / "bench" / f"{bench}.py"), *args, *FIXED[bench], "--json", str(out)]
    print(f"[trees] {tree}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=tree, stdout=subprocess.DEVNULL)
    return cells_of(bench, json.loads(out.read_text()))


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def print_table(rounds: list[dict[str, Cells]], command: str) -> None:
    print(f"\n`{command}`\n")
    print("| cell | base tok/s | head tok/s | head ÷ base (medians) | head ÷ base (median of rounds) "
          "| base TTFT p50 ms | head TTFT p50 ms |")
    print("|---|---|---|---|---|---|---|")
    for cell in rounds[0]["head"]:
        base = [r["base"][cell] for r in rounds if cell in r["base"]]
        head = [r["head"][cell] for r in rounds if cell in r["head"]]
        rate_b, rate_h = statistics.median(x[0] for x in base), statistics.median(x[0] for x in head)
        paired = statistics.median(ratio(h[0], b[0]) for h, b in zip(head, base, strict=False))
        print(f"| {cell} | {rate_b:.1f} | {rate_h:.1f} | {ratio(rate_h, rate_b):.3f} | {paired:.3f} | "
              f"{statistics.median(x[1] for x in base):.0f} | {statistics.median(x[1] for x in head):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="the tree before the change")
    parser.add_argument("--head", type=Path, default=ROOT, help="the tree after it (default: this one)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the order alternating (default 4)")
    parser.add_argument("bench", choices=sorted(FIXED))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the bench's own arguments")
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "head": args.head.resolve()}
    work = Path(tempfile.mkdtemp(prefix="proctor-trees-"))
    rounds: list[dict[str, Cells]] = []
    for number in range(args.rounds):
        order = ["base", "head"] if number % 2 == 0 else ["head", "base"]
        rounds.append({name: one_round(trees[name], args.bench, args.args, work / f"{number}-{name}.json")
                       for name in order})
    print_table(rounds, "python bench/trees.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
