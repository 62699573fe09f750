"""Soundness of the constraint engines on the official JSON Schema Test Suite (draft 2020-12 or draft 7).

For every test case (a schema and instances labelled valid/invalid), each engine compiles the
schema (a refusal or a timeout is "unsupported": refusing is sound) and every instance is fed
token by token as compact JSON (bench/constraints_common.py). A valid instance that is rejected
is an over-constraint (the engine would forbid a correct output); an invalid instance that is
accepted is an under-constraint (the engine would let a schema-violating output through, the
failure that matters). A category (file) is fully passed when every case compiled and every
instance got the right verdict. AUTO tries the engines in ``backend_order(spec)`` and uses the
first that compiles.

Exact vs served: a category is *exact* when every case passed by the token mask alone, *served*
when every case passed exact or through the validated fallback (engine ``fallback``, and AUTO after
its exact engines): there a valid instance counts as rejected when the relaxed mask blocks it (or
the validator refuses it), an invalid one as accepted only when both let it through.

``--draft 7`` reads the draft-7 suite; its schemas get ``"$schema": draft-07`` (the suite leaves it
out), so the server reads them, and validates their outputs, by draft 7.

Cases whose schema needs the suite's remote documents (``refRemote.json``, ``$ref``s or
``$schema``s that resolve outside the schema) are skipped; so is ``optional/`` unless --optional.

    python bench/constraints_soundness.py [--engines xgrammar,llguidance,outlines,fallback,auto]
        [--draft 2020-12|7] [--optional] [--splits ref,enum] [--limit N] [--timeout 10] [--save out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urldefrag, urljoin

sys.path.insert(0, str(Path(__file__).resolve().parent))

import constraints_common as cc

from proctor.constraints.spec import ConstraintSpec

SUITES = {"2020-12": ("json-schema-test-suite/tests/draft2020-12", "https://json-schema.org/draft/2020-12/schema"),
          "7": ("json-schema-test-suite/tests/draft7", "http://json-schema.org/draft-07/schema")}
SUITE, META_SCHEMA = SUITES["2020-12"]
NOT_SCHEMAS = {"const", "enum", "examples", "default"}  # keyword values that are data, not schemas


def _walk(node: object, base: str, visit) -> None:  # type: ignore[no-untyped-def]
    if isinstance(node, list):
        for item in node:
            _walk(item, base, visit)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$id"), str):
        base = urljoin(base, node["$id"])
    visit(node, base)
    for key, value in node.items():
        if key not in NOT_SCHEMAS:
            _walk(value, base, visit)


def needs_remote(schema: object) -> bool:
    """A ``$ref``/``$dynamicRef``/``$schema`` resolving to a document the schema does not contain."""
    documents = {""}

    def collect(node: dict, base: str) -> None:
        documents.add(urldefrag(base)[0])

    _walk(schema, "", collect)
    remote = []

    def check(node: dict, base: str) -> None:
        for key in ("$ref", "$dynamicRef"):
            if isinstance(node.get(key), str) and urldefrag(urljoin(base, node[key]))[0] not in documents:
                remote.append(node[key])
        if isinstance(node.get("$schema"), str) and node["$schema"].rstrip("#") != META_SCHEMA:
            remote.append(node["$schema"])

    _walk(schema, "", check)
    return bool(remote)


def load_cases(optional: bool, splits: list[str], limit: int | None, draft: str = "2020-12"
               ) -> tuple[dict[str, list[dict]], int]:
    global SUITE, META_SCHEMA
    SUITE, META_SCHEMA = SUITES[draft]
    root = cc.require_benchdata(SUITE)
    files = sorted(root.glob("*.json"))
    if optional:
        files += sorted((root / "optional").rglob("*.json"))
    categories: dict[str, list[dict]] = {}
    skipped = 0
    for path in files:
        name = path.relative_to(root).with_suffix("").as_posix()
        if splits and name not in splits:
            continue
        if name == "refRemote":
            skipped += len(json.loads(path.read_text(encoding="utf-8")))
            continue
        cases = []
        for case in json.loads(path.read_text(encoding="utf-8")):
            if needs_remote(case["schema"]):
                skipped += 1
                continue
            if draft != "2020-12" and isinstance(case["schema"], dict) and "$schema" not in case["schema"]:
                case = {**case, "schema": {"$schema": META_SCHEMA + "#", **case["schema"]}}
            cases.append(case)
        if cases:  # categories whose every case needs remotes (defs, vocabulary, ...) are left out
            categories[name] = cases[:limit] if limit else cases
    return categories, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cc.add_common_args(parser, default_limit=None, default_timeout=10.0)
    parser.add_argument("--optional", action="store_true", help="include the optional/ categories")
    parser.add_argument("--draft", choices=sorted(SUITES), default="2020-12", help="which suite (default 2020-12)")
    args = parser.parse_args()
    engines = cc.parse_engines(args.engines)
    splits = [s for s in args.splits.split(",") if s]
    categories, skipped = load_cases(args.optional, splits, args.limit, args.draft)
    total = sum(len(c) for c in categories.values())
    print(f"command: {cc.command_line()}", flush=True)
    print(f"{len(categories)} categories, {total} cases ({skipped} skipped: remote refs); {cc.versions()}",
          flush=True)

    # per engine → category → counters
    stats: dict[str, dict[str, dict[str, int]]] = {e: defaultdict(lambda: defaultdict(int)) for e in engines}
    chosen: dict[str, int] = defaultdict(int)
    notes: dict[str, list[str]] = defaultdict(list)
    saved = []
    progress = cc.Progress(total, args.progress_every, "soundness")
    started = time.monotonic()
    with cc.Runner(args.timeout) as runner:
        runner.start(cc.engines_needed(ConstraintSpec.json_schema({}), engines))
        for category, cases in categories.items():
            for index, case in enumerate(cases):
                spec = ConstraintSpec.json_schema(case["schema"])
                texts = [cc.instance_text(t["data"]) for t in case["tests"]]
                results = cc.evaluate(runner, spec, texts, engines)
                record = {"category": category, "case": case["description"], "results": {}}
                for engine, result in results.items():
                    s = stats[engine][category]
                    s["cases"] += 1
                    if not result.compiled and cc.unsatisfiable(result) and not any(t["valid"] for t in case["tests"]):
                        s["passed"] += 1  # refusing a schema that admits no value rejects exactly what it should
                        s["exact"] += 1
                        continue
                    if not result.compiled:
                        s["unsupported"] += 1
                        s[f"fail:{result.kind}"] += 1
                        if result.kind not in ("refused", "timeout"):
                            notes[engine].append(f"{category} #{index} {case['description']!r}: "
                                                 f"{result.kind}: {result.error}")
                        continue
                    s["compiled"] += 1
                    if engine == cc.AUTO:
                        chosen[result.chosen] += 1
                    over = under = errors = 0
                    for test, outcome in zip(case["tests"], result.outcomes, strict=True):
                        if outcome.status == "error":
                            errors += 1
                        elif test["valid"] and not outcome.served:
                            over += 1
                        elif not test["valid"] and outcome.served:
                            under += 1
                        if outcome.note:
                            notes[engine].append(f"{category} #{index} {test['description']!r}: {outcome.note}")
                    s["over"] += over
                    s["under"] += under
                    s["errors"] += errors
                    s["over_cases"] += over > 0
                    s["under_cases"] += under > 0
                    s["passed"] += over == under == errors == 0
                    s["exact"] += over == under == errors == 0 and cc.FALLBACK not in (engine, result.chosen)
                    record["results"][engine] = cc.result_json(result)
                for engine, result in results.items():
                    if not result.compiled:
                        record["results"][engine] = cc.result_json(result)
                saved.append(record)
                progress.step()
    elapsed = time.monotonic() - started

    print(f"\nJSON Schema Test Suite draft {args.draft}: {len(categories)} categories, {total} cases, "
          f"{sum(len(c['tests']) for cs in categories.values() for c in cs)} instances; "
          f"compile limit {args.timeout:g} s; {elapsed:.0f} s\n")
    rows = []
    for engine in engines:
        per = stats[engine]

        def total_of(key: str, per: dict = per) -> int:
            return sum(c[key] for c in per.values())

        full = sum(1 for c in per.values() if c["cases"] and c["passed"] == c["cases"])
        exact = sum(1 for c in per.values() if c["cases"] and c["exact"] == c["cases"])
        rows.append([engine, f"{exact}/{len(categories)}", f"{full}/{len(categories)}",
                     f"{total_of('compiled')}/{total}",
                     f"{total_of('passed')}", total_of("unsupported"),
                     f"{total_of('over')} ({total_of('over_cases')})",
                     f"{total_of('under')} ({total_of('under_cases')})",
                     total_of("fail:timeout"), total_of("errors")])
    print(cc.markdown_table(["engine", "categories exact", "categories served", "cases compiled", "cases passed",
                             "unsupported (refused+timeout)", "over-constrained instances (cases)",
                             "under-constrained instances (cases)", "timeouts", "errors"], rows))
    if cc.AUTO in engines:
        print("\nAUTO used: " + ", ".join(f"{k} {v}" for k, v in sorted(chosen.items())))

    print("\nPer category (✓ fully passed; else u=unsupported cases, o=over-constrained instances, "
          "x=under-constrained instances):\n")
    cat_rows = []
    for category, cases in categories.items():
        cells = [category, str(len(cases))]
        for engine in engines:
            c = stats[engine][category]
            if c["cases"] and c["passed"] == c["cases"]:
                cells.append("✓")
            else:
                parts = [f"u{c['unsupported']}" if c["unsupported"] else "", f"o{c['over']}" if c["over"] else "",
                         f"x{c['under']}" if c["under"] else "", f"e{c['errors']}" if c["errors"] else ""]
                cells.append(" ".join(p for p in parts if p))
        cat_rows.append(cells)
    print(cc.markdown_table(["category", "cases", *engines], cat_rows))

    cc.report_notes_and_save(notes, saved, args.save, "case")


if __name__ == "__main__":
    main()
