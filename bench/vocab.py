"""Per-token serving work at 128k–152k vocabularies (issue 25, part 4): the decode pipeline and the masks.

Everything after the LM head that a decode step does over a [B, V] row of logits, timed at 1 and 16 rows on
each vocabulary width: the default model's 49,152 tokens, and the ladder's Llama-3.2 (128,256) and Qwen2.5
(151,936) files (bench/ladder.py builds them; their tokenizers are the default one padded to that width,
so a JSON mask covers real token strings for the real part and never allows the padding).

Modes, one request shape each (every row of a batch alike):
- ``plain``: greedy, no details (row log-sum-exp and argmax);
- ``details``: greedy with 5 alternatives a token (what an audited request with ``top_logprobs`` reads);
- ``sampling``: temperature 0.8, top-p 0.95, a seeded generator per row;
- ``json``: greedy under a JSON schema: the constraint's bitmask filled per row and the masked pick in one
  kernel pass; beside it, the matcher's ``advance`` per token (the engine calls it after the step).

The logits are random, scaled as SCALE says (only the sampling filters' work depends on their spread; the
JSON rows follow whatever path the masked argmax takes, restarting a matcher when its document ends). Each
figure is the median over ``--steps`` steps of ``run_pipeline`` alone (the logits are copied outside the
timer).

    python bench/vocab.py [--steps 60] [--ladder DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

import torch  # noqa: E402

from proctor.constraints.compiler import ConstraintCompiler  # noqa: E402
from proctor.constraints.spec import ConstraintSpec  # noqa: E402
from proctor.decoding.pipeline import RowDecision, run_pipeline  # noqa: E402
from proctor.decoding.warpers import warp_values  # noqa: E402
from proctor.domain.request import SamplingParams  # noqa: E402
from proctor.executor.fused_decode import load_problem  # noqa: E402

DEFAULT_MODEL = ROOT / ".proctor" / "models" / "SmolLM2-135M-Instruct"
LADDER_FILES = {"llama-3.2-1b": "llama-3.2-1b-Q4_K_M.gguf", "qwen2.5-0.5b": "qwen2.5-0.5b-Q4_K_M.gguf"}
ROWS = (1, 16)
# Random logits this wide: at 152k tokens the top one then holds ~36% at temperature 0.8, and top-p 0.95 keeps
# ~160 tokens (a model's moderately unsure step; at 3 the nucleus is ~2,800 tokens, at 5 ~17).
SCALE = 4.0
MODES = ("plain", "details", "sampling", "json")
SCHEMA = {  # a small contract: strings, an integer, a bounded array, an enum
    "type": "object",
    "properties": {
        "party": {"type": "string", "maxLength": 40},
        "amount": {"type": "integer"},
        "law": {"enum": ["England and Wales", "New York", "Delaware"]},
        "clauses": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 4},
    },
    "required": ["party", "amount", "law", "clauses"],
}


@dataclass
class Row:
    """One request's state as the pipeline reads it (decoding/pipeline.py: DecodeRow)."""

    step_sampling: SamplingParams
    eos: int
    generator: torch.Generator | None = None
    top_logprobs: int = 0
    matcher: Any = None
    penalties: None = None
    forbidden: None = None
    allowed_mask: None = None
    last_step: bool = False
    processors: tuple[()] = ()
    new_matcher: Callable[[], Any] | None = field(default=None, repr=False)

    @property
    def sampling_values(self) -> torch.Tensor | None:
        return warp_values(self.step_sampling)

    def banned_token_ids(self) -> tuple[int, ...]:
        return ()

    def end_token_ids(self) -> tuple[int, ...]:
        return (self.eos,)

    def advance(self, decision: RowDecision) -> None:
        if self.matcher is None or self.new_matcher is None:
            return
        if decision.token_id < 0 or decision.token_id == self.eos or not self.matcher.advance(decision.token_id):
            self.matcher = self.new_matcher()  # the document ended (or a dead end): the next request


def tokenizers(ladder: Path) -> list[tuple[str, Any, Path]]:
    from transformers import AutoTokenizer

    found: list[tuple[str, Any, Path]] = []
    if DEFAULT_MODEL.is_dir():
        found.append(("SmolLM2-135M", AutoTokenizer.from_pretrained(str(DEFAULT_MODEL)), DEFAULT_MODEL))
    else:
        print(f"(the default model is not installed at {DEFAULT_MODEL}: run `make setup`; its row is left out)")
    for rung, name in LADDER_FILES.items():
        files = sorted(ladder.glob(f"{rung}-*/{name}"))
        if not files:
            print(f"({rung}: no {name} under {ladder}; `python bench/ladder.py --rungs {rung} --types Q4_K_M` "
                  f"builds it; its row is left out)")
            continue
        began = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(str(files[0].parent), gguf_file=files[0].name)
        print(f"({rung}: tokenizer read from the GGUF in {time.perf_counter() - began:.1f} s)")
        found.append((rung, tokenizer, files[0]))
    return found


def make_rows(mode: str, count: int, eos: int, new_matcher: Callable[[], Any]) -> list[Row]:
    if mode == "sampling":
        return [Row(SamplingParams(temperature=0.8, top_p=0.95, seed=index), eos,
                    generator=torch.Generator().manual_seed(index)) for index in range(count)]
    if mode == "json":
        return [Row(SamplingParams(), eos, matcher=new_matcher(), new_matcher=new_matcher) for _ in range(count)]
    return [Row(SamplingParams(), eos, top_logprobs=5 if mode == "details" else 0) for _ in range(count)]


def measure(rows: list[Row], vocab: int, steps: int) -> tuple[float, float]:
    """(median ms of a step's pipeline, median µs of the matchers' advance per token)."""
    pool = [torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(seed)) * SCALE for seed in range(4)]
    step_ms, advance_us = [], []
    for step in range(steps + 3):  # three warm-up steps
        logits = pool[step % len(pool)].clone()
        began = time.perf_counter()
        decisions = run_pipeline(logits, rows)  # type: ignore[arg-type]
        middle = time.perf_counter()
        for row, decision in zip(rows, decisions, strict=True):
            row.advance(decision)
        ended = time.perf_counter()
        if step >= 3:
            step_ms.append((middle - began) * 1e3)
            advance_us.append((ended - middle) * 1e6 / len(rows))
    return statistics.median(step_ms), statistics.median(advance_us)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ladder", type=Path, default=Path(tempfile.gettempdir()) / "proctor-ladder")
    args = parser.parse_args()
    problem = load_problem()
    if problem is not None:
        raise SystemExit(problem)
    found = tokenizers(args.ladder)
    if not found:
        raise SystemExit("no tokenizer to measure")
    print(f"\n`python bench/vocab.py --steps {args.steps}`, {torch.get_num_threads()} threads\n")
    print("| vocabulary | mode | 1 row: ms a step | 16 rows: ms a step (ms a token) | matcher advance µs a token |\n"
          "|---|---|---|---|---|")
    for label, tokenizer, path in found:
        vocab = len(tokenizer)
        eos = int(tokenizer.eos_token_id)
        compiler = ConstraintCompiler(tokenizer=tokenizer, model_path=str(path), vocab_size=vocab,
                                      eos_token_ids=(eos,), tokenizer_fingerprint=f"bench-{label}", isolate=False)
        began = time.perf_counter()
        compiled = compiler.compile(ConstraintSpec.json_schema(SCHEMA))
        compile_note = f"{compiled.backend}, compiled in {(time.perf_counter() - began) * 1e3:.0f} ms with its tables"
        for mode in MODES:
            cells, advance = [], 0.0
            for count in ROWS:
                step, advance = measure(make_rows(mode, count, eos, compiled.compiled.new_matcher), vocab, args.steps)
                cells.append(f"{step:.3f}" if count == 1 else f"{step:.3f} ({step / count:.3f})")
            note = f"{advance:.0f}" if mode == "json" else "—"
            print(f"| {label} ({vocab:,}) | {mode} | {cells[0]} | {cells[1]} | {note} |", flush=True)
        print(f"| | (json: {compile_note}) | | | |")
        compiler.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
