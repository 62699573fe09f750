"""Objects whose keys the mask remembers (issue 56): what it costs a token, and what it serves exactly.

``--mask``: the key memory's cost per token. The 240-schema MaskBench sample (constraints_e2e.maskbench_sample),
each schema llguidance compiles exactly, each valid instance fed token by token as compact JSON: per token, the
engine's mask fill and advance alone, then the same under the key memory the server uses (``keyed``: the compiled
one where it builds) and under layer.py's Python memory, in turn by instance, the same tokens each way. Prints µs
per token each way and the ratios to the engine alone, and the share of tokens at which the memory banned anything.

``--coverage``: MaskBench schemas AUTO serves exactly (``exact_only``: llguidance, then xgrammar, through the
compiler with its worker and time limit, as the server does), over the whole set and the 240-schema sample. Run it
from the tree before issue 56 (PYTHONPATH at that tree) for the before figure.

    python bench/key_memory.py [--mask] [--coverage] [--sample 240] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from constraints_e2e import MASKBENCH, maskbench_sample

from proctor.constraints.backend import allocate_bitmask
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintSpec


def tokenizer_and_model() -> tuple[Any, Path]:
    from transformers import AutoTokenizer

    from proctor.config import default_model_store
    from proctor.models.default_model import default_model_path

    path = default_model_path(default_model_store())
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True), path


def mask_cost(sample: int, rounds: int) -> None:
    from proctor.constraints.backends import create_backend
    from proctor.constraints.key_memory import KeyedCompiled, KeyMemory, key_vocabulary, keyed

    tokenizer, _ = tokenizer_and_model()
    size = len(tokenizer)
    backend = create_backend("llguidance", tokenizer, size, (tokenizer.eos_token_id,))
    vocab = key_vocabulary(tokenizer, size)
    cases = []
    for name, schema in maskbench_sample(sample):
        try:
            compiled = backend.compile(ConstraintSpec.json_schema(schema))
        except ConstraintError:
            continue
        cache: dict[Any, tuple[int, ...]] = {}
        python = KeyedCompiled(compiled, lambda cache=cache: KeyMemory(vocab, cache))  # type: ignore[misc]
        tests = json.loads((MASKBENCH / f"{name.replace('/', '---')}.json").read_text(encoding="utf-8"))["tests"]
        for test in tests:
            if test["valid"]:
                text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
                ids = tokenizer.encode(text, add_special_tokens=False)
                cases.append({"engine": compiled, "keyed": keyed(compiled, tokenizer, size), "python": python,
                              "ids": ids})
    served = type(cases[0]["keyed"].new_matcher().memory).__module__ if cases else "?"
    bitmask = allocate_bitmask(1, size)
    labels = ("engine", "keyed", "python")
    seconds = dict.fromkeys(labels, 0.0)
    pairs: list[float] = []  # per instance and round: keyed ÷ engine (robust to the machine's load changing)
    for round_ in range(rounds):
        for index, case in enumerate(cases):
            shift = (index + round_) % len(labels)
            took = {}
            for label in labels[shift:] + labels[:shift]:
                took[label] = _feed(case[label], case["ids"], bitmask)
                seconds[label] += took[label]
            pairs.append(took["keyed"] / took["engine"])
    steps = sum(len(case["ids"]) for case in cases)
    banned_steps = sum(_banned_steps(case["keyed"], case["ids"]) for case in cases)
    engine, remembered, python_memory = (seconds[label] / (steps * rounds) * 1e6 for label in labels)
    pairs.sort()
    print(f"{len(cases)} valid instances of {sample} sampled schemas, {steps} tokens, {rounds} rounds; "
          f"the served memory: {served}")
    print(f"mask fill + advance per token: engine {engine:.1f} µs, with the served key memory {remembered:.1f} µs "
          f"(ratio of the totals {remembered / engine:.3f}), with the Python memory {python_memory:.1f} µs "
          f"({python_memory / engine:.3f}); per instance, served ÷ engine: median "
          f"{statistics.median(pairs):.3f}, quartiles {pairs[len(pairs) // 4]:.3f} / {pairs[3 * len(pairs) // 4]:.3f}; "
          f"tokens where the memory banned something: {banned_steps} ({banned_steps / max(steps, 1):.1%})")


def _feed(compiled: Any, ids: list[int], bitmask: Any) -> float:
    """Seconds to fill the mask and advance at each of ``ids`` from a new matcher."""
    matcher = compiled.new_matcher()
    start = time.perf_counter()
    for token in ids:
        matcher.fill_bitmask(bitmask, 0)
        if not matcher.advance(token):
            break
    return time.perf_counter() - start


def _banned_steps(compiled: Any, ids: list[int]) -> int:
    matcher, count = compiled.new_matcher(), 0
    for token in ids:
        count += bool(matcher.memory.banned())
        if not matcher.advance(token):
            break
    return count


def coverage(sample: int) -> None:
    from proctor.constraints.compiler import ConstraintCompiler

    tokenizer, path = tokenizer_and_model()
    compiler = ConstraintCompiler(tokenizer=tokenizer, model_path=str(path), vocab_size=len(tokenizer),
                                  eos_token_ids=(tokenizer.eos_token_id,), tokenizer_fingerprint="bench")
    chosen = {name for name, _ in maskbench_sample(sample)}
    exact = {"all": 0, "sample": 0}
    count = {"all": 0, "sample": 0}
    try:
        for file in sorted(MASKBENCH.glob("*.json")):
            name = f"{file.name.split('---')[0]}/{file.stem.split('---')[1]}"
            schema = json.loads(file.read_text(encoding="utf-8"))["schema"]
            try:
                compiler.compile(ConstraintSpec.json_schema(schema), exact_only=True)
                served = True
            except (ConstraintError, ValueError, RecursionError):
                served = False
            for part in ("all", "sample") if name in chosen else ("all",):
                count[part] += 1
                exact[part] += served
    finally:
        compiler.close()
    for part in ("all", "sample"):
        print(f"{part}: {exact[part]} of {count[part]} exact ({exact[part] / max(count[part], 1):.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mask", action="store_true")
    parser.add_argument("--coverage", action="store_true")
    parser.add_argument("--sample", type=int, default=240)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.mask:
        mask_cost(args.sample, args.rounds)
    if args.coverage:
        coverage(args.sample)


if __name__ == "__main__":
    main()
