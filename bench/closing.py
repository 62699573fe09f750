"""Valid within the budget (issue 45): the served MaskBench sample at 128, 256 and 512 new tokens, with the budget
rule off (``close_at_budget`` false: what every release before it did) and on, through gRPC with the real model.

Per budget: valid outputs (the server's check and an independent ``jsonschema`` one agree), cut at the token
limit (LENGTH: never valid), closed at the budget, reported invalid (a key the model wrote twice, which the
engines' masks allow and the server's check catches, or another reason), refused up front (the budget is
below the schema's shortest valid output: INVALID_ARGUMENT naming max_new_tokens), other refusals (a schema the
server does not serve), and the count reported valid that jsonschema rejects (must be 0). Greedy, the schema
shown in the prompt, the same schemas every run (constraints_e2e.maskbench_sample), ``--streams`` in flight.

The cost on rows far from their budget, two ways: (1) in the same run, the requests that ended by themselves in
both modes at the largest budget (the same tokens: the rule never fired) are timed again one at a time, off and
on alternately, and the median ratio of their times per token is printed; (2) the rule's own work per token
over the outputs at the largest budget, as a row runs it (``ClosingRule``: read the piece; list the endings only
when they could come within reach), beside listing them at every token. ``--rule-only`` measures (2) alone,
without a server, over the sample's first valid instances.

    python bench/closing.py [--maskbench 40] [--budgets 128,256,512] [--streams 4] [--repeats 3] [--rule-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from constraints_e2e import MASKBENCH, SCHEMA_PROMPT_CHARS, independent_valid, maskbench_sample

from proctor.app import BackgroundServer
from proctor.config import Settings
from proctor.constraints.json_schema import JsonCloser, JsonOutputRule
from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import generation_pb2 as pb


def ask(client: ProctorClient, schema: object, budget: int, close: bool) -> dict[str, object]:
    prompt = f"Produce a short example instance of this JSON Schema:\n{json.dumps(schema)[:SCHEMA_PROMPT_CHARS]}"
    start = time.perf_counter()
    try:
        response = client.generate(messages=[("system", "Reply with JSON only."), ("user", prompt)],
                                   json_schema=json.dumps(schema), max_new_tokens=budget, temperature=0,
                                   close_at_budget=close)
    except ProctorError as exc:
        refused_budget = any(field == "stopping.max_new_tokens" for field, _ in exc.field_violations)
        return {"outcome": "refused_budget" if refused_budget else "refused_other"}
    seconds = time.perf_counter() - start
    if response.finish_reason == pb.FINISH_REASON_LENGTH:
        assert not response.schema_validation.valid, "a truncated output was reported valid"
        outcome = "length"
    elif not response.schema_validation.valid:  # the model's own: a key written twice (the masks allow it) or other
        duplicate = any("duplicate object key" in error for error in response.schema_validation.errors)
        outcome = "duplicate" if duplicate else "invalid"
    else:
        outcome = "valid" if independent_valid(response.text, schema) else "WRONG"
    return {"outcome": outcome, "response": response, "seconds": seconds,
            "closed": response.finish_reason == pb.FINISH_REASON_CLOSED_AT_BUDGET}


def rule_cost(outputs: list[tuple[object, str]], tokenizer: Any, budget: int) -> tuple[float, float, int]:
    """Microseconds a token: (the rule as a row runs it at ``budget``, listing the endings at every token), over
    ``outputs`` (their schemas compiled by llguidance, the matcher advanced with the tokens)."""
    from proctor.constraints.backends import create_backend
    from proctor.constraints.spec import ConstraintSpec
    from proctor.engine.closing import ClosingRule
    from proctor.engine.closing_facts import closing_facts

    backend = create_backend("llguidance", tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    rule_s = every_s = 0.0
    tokens = 0
    for schema, text in outputs:
        try:
            compiled = backend.compile(ConstraintSpec.json_schema(schema))
        except Exception:  # a schema llguidance does not take: not timed
            continue
        ids = tokenizer.encode(text, add_special_tokens=False)
        if compiled.new_matcher().valid_prefix(ids) != len(ids) or len(ids) >= budget:
            continue
        pieces = [tokenizer.decode([t]) for t in ids]
        matcher = compiled.new_matcher()
        facts = closing_facts(JsonOutputRule(schema), compiled.new_matcher(), tokenizer,  # type: ignore[arg-type]
                              len(tokenizer))
        rule = ClosingRule(facts, matcher, tokenizer, len(tokenizer))
        closer = JsonCloser(schema)  # type: ignore[arg-type]
        for done, (token, piece) in enumerate(zip(ids, pieces, strict=True), start=1):
            matcher.advance(token)
            start = time.perf_counter()
            rule.push(piece)
            rule.plan(done, budget - done)
            middle = time.perf_counter()
            closer.push(piece)
            closer.endings()
            every_s += time.perf_counter() - middle
            rule_s += middle - start
        tokens += len(ids)
    return (rule_s / tokens * 1e6, every_s / tokens * 1e6, tokens) if tokens else (0.0, 0.0, 0)


def first_valid_instances(sample: list[tuple[str, dict[str, object]]]) -> list[tuple[object, str]]:
    found = []
    for name, schema in sample:
        split, stem = name.split("/", 1)
        tests = json.loads((MASKBENCH / f"{split}---{stem}.json").read_text(encoding="utf-8"))["tests"]
        valid = [t["data"] for t in tests if t["valid"]]
        if valid:
            found.append((schema, json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False)))
    return found


def load_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from proctor.config import default_model_store
    from proctor.models.default_model import default_model_path

    return AutoTokenizer.from_pretrained(str(default_model_path(default_model_store())), local_files_only=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--maskbench", type=int, default=40, help="MaskBench schemas, round-robin over the splits")
    parser.add_argument("--budgets", default="128,256,512")
    parser.add_argument("--streams", type=int, default=4, help="requests in flight")
    parser.add_argument("--repeats", type=int, default=3, help="timing rounds (off, on) for the cost per token")
    parser.add_argument("--rule-only", action="store_true", help="only the rule's own work, over valid instances")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    sample = maskbench_sample(args.maskbench)
    if args.rule_only:
        rule, every, tokens = rule_cost(first_valid_instances(sample), load_tokenizer(), max(budgets))
        print(f"The rule's own work at max_new_tokens {max(budgets)} (`python bench/closing.py --rule-only "
              f"--maskbench {args.maskbench} --budgets {args.budgets}`, {tokens} tokens of valid instances): "
              f"{rule:.1f} µs a token as a row runs it; {every:.1f} µs listing the endings at every token")
        return
    server = BackgroundServer(Settings.load({"port": 0})).start()
    table: dict[tuple[int, bool], dict[str, int]] = {}
    finished_both: list[int] = []
    outputs: list[tuple[object, str]] = []
    ratios: list[float] = []
    step_ms: list[float] = []  # time per token with the rule off, one request at a time
    try:
        with ProctorClient(server.address, timeout_s=900) as client, ThreadPoolExecutor(args.streams) as pool:
            for budget in budgets:
                results = {}
                for close in (False, True):
                    jobs = [pool.submit(ask, client, schema, budget, close) for _, schema in sample]
                    results[close] = [job.result() for job in jobs]
                    counts = table.setdefault((budget, close), {})
                    for (name, _), result in zip(sample, results[close], strict=True):
                        outcome = str(result["outcome"])
                        if close and outcome != "valid":
                            print(f"  {name}: {outcome}", file=sys.stderr)
                        counts[outcome] = counts.get(outcome, 0) + 1
                        counts["closed"] = counts.get("closed", 0) + bool(result.get("closed"))
                    print(f"budget {budget} close_at_budget={close}: {counts}", file=sys.stderr, flush=True)
                if budget == max(budgets):
                    for index, (off, on) in enumerate(zip(results[False], results[True], strict=True)):
                        if "response" not in off or "response" not in on:
                            continue
                        outputs.append((sample[index][1], on["response"].text))  # type: ignore[union-attr]
                        same = list(off["response"].token_ids) == list(on["response"].token_ids)  # type: ignore[union-attr]
                        if same and not on["closed"] and off["outcome"] != "length":
                            finished_both.append(index)
            for _ in range(args.repeats):  # far from the budget: the same tokens with the rule off and on
                for index in finished_both:
                    per_token = {}
                    for close in (False, True):
                        result = ask(client, sample[index][1], max(budgets), close)
                        response = result["response"]
                        per_token[close] = float(result["seconds"]) / max(1, response.usage.completion_tokens)  # type: ignore[union-attr,arg-type]
                    ratios.append(per_token[True] / per_token[False])
                    step_ms.append(per_token[False] * 1000)
    finally:
        server.stop()
    rule, every, tokens = rule_cost(outputs, load_tokenizer(), max(budgets))
    command = (f"python bench/closing.py --maskbench {args.maskbench} --budgets {args.budgets} "
               f"--streams {args.streams} --repeats {args.repeats}")
    print(f"\nServed MaskBench sample, {len(sample)} schemas, greedy, schema in the prompt (`{command}`):\n")
    print("| max_new_tokens | close_at_budget | valid | of which closed at the budget | LENGTH (invalid) "
          "| invalid: a key twice | other invalid | refused: budget below the shortest | refused: schema "
          "| reported valid, jsonschema disagrees |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (budget, close), c in table.items():
        print(f"| {budget} | {'on' if close else 'off'} | {c.get('valid', 0)} | {c.get('closed', 0)} | "
              f"{c.get('length', 0)} | {c.get('duplicate', 0)} | {c.get('invalid', 0)} | "
              f"{c.get('refused_budget', 0)} | {c.get('refused_other', 0)} | {c.get('WRONG', 0)} |")
    if ratios:
        print(f"\nRows far from their budget ({len(finished_both)} requests that ended by themselves at "
              f"{max(budgets)} tokens, same tokens in both modes, {args.repeats} rounds, one at a time): time per "
              f"token on ÷ off, median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
              f"max {max(ratios):.3f})")
    share = f", {rule / 1000 / statistics.median(step_ms):.2%} of a token's time" if step_ms else ""
    print(f"The rule's own work at {max(budgets)}: {rule:.1f} µs a token as a row runs it{share}; {every:.1f} µs "
          f"listing the endings at every token ({tokens} tokens of the outputs)")


if __name__ == "__main__":
    main()
