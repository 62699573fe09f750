"""End-to-end constrained generation through gRPC with the real default model.

For the registered contract schemas (N varied prompts each) and a sample of MaskBench schemas
(``--maskbench N``, spread over the splits by a hash of the file name, the same ones every run):
generate greedily with the schema, then check every output the server reports valid also passes
an independent ``jsonschema`` check here (its draft's validator, formats asserted) — the count of
outputs reported valid that fail it must be 0 — count truncations and refusals, and compare
tokens/s constrained vs unconstrained in the same run (same prompts, same max_new_tokens).
Per group: served (compiled: exact or through the validated fallback), outputs valid, attempts
per valid output (the fallback retries), tokens/s.

    python bench/constraints_e2e.py [--prompts 20] [--maskbench 100] [--max-new-tokens 512] [--compare N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

import jsonschema  # noqa: E402

from proctor.app import BackgroundServer  # noqa: E402
from proctor.config import Settings  # noqa: E402
from proctor_client import ProctorClient, ProctorError  # noqa: E402
from proctor_client.v1 import generation_pb2 as pb  # noqa: E402

MASKBENCH = ROOT.parent / "shared" / "benchdata" / "maskbench"
SCHEMA_PROMPT_CHARS = 3000  # of the schema shown in the prompt (long ones are cut: the mask has it all)
PARTIES = [("Acme Robotics Ltd", "England"), ("Blue Harbor LLC", "Delaware"), ("Northwind GmbH", "Germany"),
           ("Contoso Inc.", "New York"), ("Fabrikam SA", "France"), ("Tailspin Pty", "Australia"),
           ("Woodgrove Bank", "Ontario"), ("Litware KK", "Japan"), ("Adatum BV", "Netherlands"),
           ("Proseware AB", "Sweden")]


def contract_prompts(n: int) -> list[str]:
    prompts = []
    for i in range(n):
        (a, ja), (b, jb) = PARTIES[i % len(PARTIES)], PARTIES[(i * 3 + 1) % len(PARTIES)]
        prompts.append(f"Draft the agreement between {a} ({ja}) and {b} ({jb}), effective 2026-{i % 12 + 1:02d}-"
                       f"{i % 27 + 1:02d}, for {6 + i} months.")
    return prompts


def maskbench_sample(count: int) -> list[tuple[str, dict[str, object]]]:
    """``count`` MaskBench schemas, round-robin over the splits, each split in a fixed hash order."""
    if count <= 0:
        return []
    if not MASKBENCH.is_dir():
        sys.exit(f"{MASKBENCH} not found: the MaskBench sample needs ../shared/benchdata")
    by_split: dict[str, list[Path]] = {}
    for path in MASKBENCH.glob("*.json"):
        by_split.setdefault(path.name.split("---")[0], []).append(path)
    queues = [sorted(paths, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
              for _, paths in sorted(by_split.items())]
    sample: list[tuple[str, dict[str, object]]] = []
    while len(sample) < count and any(queues):
        for queue in queues:
            if queue and len(sample) < count:
                path = queue.pop(0)
                sample.append((f"{path.name.split('---')[0]}/{path.stem.split('---')[1]}",
                               json.loads(path.read_text(encoding="utf-8"))["schema"]))
    return sample


def run_one(client: ProctorClient, prompt: str, max_new: int, **constraint: object) -> dict[str, object]:
    messages = [("system", "Reply with JSON only."), ("user", prompt)]
    start = time.perf_counter()
    try:
        response = client.generate(messages=messages, max_new_tokens=max_new, temperature=0, **constraint)
    except ProctorError as exc:
        return {"error": f"{exc.code.name}: {exc.message[:120]}"}
    elapsed = time.perf_counter() - start
    return {"response": response, "tps": response.usage.completion_tokens / elapsed}


def independent_valid(text: str, schema: object) -> bool:
    """jsonschema alone, by the schema's own draft, formats asserted (no Proctor code involved)."""
    try:
        instance = json.loads(text)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(instance)
    except (ValueError, jsonschema.SchemaError, jsonschema.exceptions.RefResolutionError):
        return False


def check(result: dict[str, object], schema: object) -> str:
    """'valid', 'length', 'invalid' (reported invalid: the fallback's budget ran out, or it ended early),
    'unsupported' (refused), or 'WRONG' (reported valid, but jsonschema disagrees: must never happen)."""
    if "error" in result:
        return "unsupported"
    response = result["response"]
    assert isinstance(response, pb.GenerateResponse)
    if response.finish_reason == pb.FINISH_REASON_LENGTH:
        assert not response.schema_validation.valid, "a truncated output was reported valid"
        return "length"
    if not response.schema_validation.valid:
        return "invalid"
    return "valid" if independent_valid(response.text, schema) else "WRONG"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20, help="prompts per registered contract schema")
    parser.add_argument("--schemas", default="", help="only these registered schemas (comma-separated name@version)")
    parser.add_argument("--maskbench", type=int, default=100, help="MaskBench schemas over all splits (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--schema-in-prompt", action=argparse.BooleanOptionalAction, default=False,
                        help="show MaskBench schemas to the model in the prompt (measured: the 135M model then "
                             "runs into max_new_tokens more often; default off)")
    parser.add_argument("--compare", type=int, default=1_000_000,
                        help="measure unconstrained tokens/s on the first N cases only (saves time)")
    args = parser.parse_args()
    server = BackgroundServer(Settings.load({"port": 0})).start()
    rows: list[tuple[str, dict[str, int]]] = []
    tps_constrained: list[float] = []
    tps_free: list[float] = []
    try:
        with ProctorClient(server.address, timeout_s=600) as client:
            cases: list[tuple[str, str, dict[str, object], object]] = []
            wanted = {name for name in args.schemas.split(",") if name}
            for entry in client.list_schemas():
                ref = f"{entry.name}@{entry.version}"
                if wanted and ref not in wanted:
                    continue
                for prompt in contract_prompts(args.prompts):
                    cases.append((ref, prompt, {"schema_ref": ref}, json.loads(entry.schema)))
            for name, schema in maskbench_sample(args.maskbench):
                prompt = "Produce an example instance of the data."
                if args.schema_in_prompt:  # as callers do: the model sees what the mask enforces
                    prompt = (f"Produce a short example instance of this JSON Schema:\n"
                              f"{json.dumps(schema)[:SCHEMA_PROMPT_CHARS]}")
                cases.append((name.split("/")[0], prompt, {"json_schema": json.dumps(schema)}, schema))
            for index, (group, prompt, constraint, schema) in enumerate(cases):
                result = run_one(client, prompt, args.max_new_tokens, **constraint)
                verdict = check(result, schema)
                counts = next((c for g, c in rows if g == group), None)
                if counts is None:
                    counts = {}
                    rows.append((group, counts))
                counts[verdict] = counts.get(verdict, 0) + 1
                if "response" in result:
                    response = result["response"]
                    counts["fallback"] = counts.get("fallback", 0) + (not response.constraint.exact)  # type: ignore[union-attr]
                    if verdict == "valid":
                        counts["attempts"] = counts.get("attempts", 0) + max(1, len(response.attempts))  # type: ignore[union-attr]
                if "tps" in result and index < args.compare:
                    tps_constrained.append(float(result["tps"]))  # type: ignore[arg-type]
                    free = run_one(client, prompt, int(result["response"].usage.completion_tokens) or 1)  # type: ignore[union-attr]
                    if "tps" in free:
                        tps_free.append(float(free["tps"]))  # type: ignore[arg-type]
                print(f"[{index + 1}/{len(cases)}] {group}: {verdict}", file=sys.stderr, flush=True)
    finally:
        server.stop()
    print(f"\nEnd to end, greedy, max_new_tokens {args.max_new_tokens} "
          f"(`python bench/constraints_e2e.py --prompts {args.prompts} --maskbench {args.maskbench}"
          f"{' --schema-in-prompt' if args.schema_in_prompt else ''} --max-new-tokens {args.max_new_tokens}"
          f"{' --compare ' + str(args.compare) if args.compare < 1_000_000 else ''}`):\n")
    print("| schemas | requests | served (of which fallback) | valid | attempts per valid | LENGTH | reported invalid "
          "| refused | reported valid, jsonschema disagrees |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals: dict[str, int] = {}
    for group, counts in [*rows, ("**all**", totals)]:
        if group != "**all**":
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
        requests = sum(counts.get(k, 0) for k in ("valid", "length", "invalid", "unsupported", "WRONG"))
        served = requests - counts.get("unsupported", 0)
        valid = counts.get("valid", 0)
        per_valid = f"{counts.get('attempts', 0) / valid:.2f}" if valid else "–"
        print(f"| {group} | {requests} | {served} ({counts.get('fallback', 0)}) | {valid} | {per_valid} | "
              f"{counts.get('length', 0)} | {counts.get('invalid', 0)} | {counts.get('unsupported', 0)} | "
              f"{counts.get('WRONG', 0)} |")
    if tps_constrained and tps_free:
        c, f = statistics.median(tps_constrained), statistics.median(tps_free)
        print(f"\nTokens/s median: constrained {c:.1f}, unconstrained {f:.1f} (same prompts and lengths) "
              f"→ {c / f:.2f}×")


if __name__ == "__main__":
    main()
