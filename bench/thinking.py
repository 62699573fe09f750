"""A thinking model under a JSON schema (issue 56): per output budget and thought budget, the thought's tokens and
whether the answer after it is valid.

No thinking model can be fetched here (no hub at run time), so this runs the tiny random-weight thinking model of
the tests (tests/helpers/thinking.py: the default model's tokenizer with ``<think>``/``</think>`` and Qwen3's template
shape) in the engine, sampled at temperature 1.0: a model that never ends its thought by itself, the hardest case
for the budget. Each cell: ``--seeds`` requests; the median thought tokens (markers included), the longest, the
valid answers (jsonschema), and the finish reasons.

    python bench/thinking.py [--seeds 12] [--budgets 40,80,160] [--thoughts none,8,32]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "service"), str(REPO / "tests"), str(REPO / "clients" / "python" / "src")]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"},
                                           "notes": {"type": "array", "items": {"type": "string"}}},
          "required": ["city", "rank"], "additionalProperties": False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--budgets", default="40,80,160", help="max_new_tokens values")
    parser.add_argument("--thoughts", default="none,8,32", help="reasoning.max_tokens values (none: unbounded)")
    args = parser.parse_args()

    import jsonschema
    from helpers.engine import Collector, tiny_settings, with_constraints
    from helpers.thinking import thinking_loaded

    from proctor.config import default_model_store
    from proctor.domain import ChatMessage, ConstraintRequest, GenerationRequest, SamplingParams, StoppingParams
    from proctor.domain.reasoning import ReasoningParams
    from proctor.engine.engine import Engine
    from proctor.models.default_model import default_model_path

    model_dir = default_model_path(default_model_store())
    loaded = thinking_loaded(model_dir, "model_opens", 2048)
    engine = with_constraints(Engine(loaded, tiny_settings()), loaded, model_dir)
    print("| max_new_tokens | reasoning.max_tokens | thought tokens (median / most) | answer valid | finishes |")
    print("|---|---|---|---|---|")
    try:
        for budget in (int(b) for b in args.budgets.split(",")):
            for thought in args.thoughts.split(","):
                most = None if thought == "none" else int(thought)
                used, valid, finishes = [], 0, collections.Counter[str]()
                for seed in range(args.seeds):
                    request = GenerationRequest(
                        request_id=f"t{budget}-{thought}-{seed}", messages=(ChatMessage("user", "A city?"),),
                        constraint=ConstraintRequest("json_schema", json.dumps(SCHEMA)),
                        sampling=SamplingParams(temperature=1.0, seed=seed),
                        stopping=StoppingParams(max_new_tokens=budget), reasoning=ReasoningParams(max_tokens=most))
                    sink = Collector()
                    engine.submit(engine.prepare(request), sink)
                    final = sink.wait(300)[-1]
                    used.append(final.usage.reasoning_tokens if final.usage else 0)
                    finishes[final.finish_reason.value if final.finish_reason else "?"] += 1
                    try:
                        jsonschema.validate(json.loads(sink.text), SCHEMA)
                        valid += 1
                    except (ValueError, jsonschema.ValidationError):
                        pass
                print(f"| {budget} | {thought} | {statistics.median(used):.0f} / {max(used)} | {valid}/{args.seeds} | "
                      + ", ".join(f"{name} {count}" for name, count in sorted(finishes.items())) + " |")
    finally:
        engine.shutdown(grace_s=1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
