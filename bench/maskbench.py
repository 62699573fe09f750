"""MaskBench: real-world JSON Schemas with valid and invalid instances, per engine and AUTO.

Data: ../shared/benchdata/maskbench/*.json (the JSONSchemaBench project's MaskBench), split by the
file-name prefix before ``---``. For each schema every engine compiles it in a worker process
under a time limit (a refusal or timeout is a compile failure), then every test instance is fed
token by token as compact JSON (bench/constraints_common.py), timing each mask fill. Per split:
compile success, compile time p50/p90 (successful compiles; AUTO counts every engine it tried),
mask fill time p50/p99 over every step, valid instances rejected, invalid instances accepted,
and schemas fully passed (compiled, every instance right):

* ``exact``: passed by the token mask alone (an engine enforcing the whole schema);
* ``served``: exact, or through the validated fallback (engine ``fallback``, and AUTO after its
  exact engines): the relaxed mask plus the server's validator on the full schema, the way the
  server decides what it returns as valid. On that path a valid instance counts as rejected when
  the relaxed mask blocks it (or the validator refuses it), an invalid one as accepted only when
  both let it through.

The default is a sample: --limit 40 schemas per split, the same ones every run (ordered by a hash
of the file name, so the sample is spread over the split). --limit 0 runs everything (hours).

    python bench/maskbench.py [--engines xgrammar,llguidance,outlines,fallback,auto] [--limit 40]
        [--splits Github_easy,Snowplow] [--timeout 10] [--save out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import constraints_common as cc

from proctor.constraints.spec import ConstraintSpec

SPLITS = ("Github_trivial", "Github_easy", "Glaiveai2K", "Github_medium", "Snowplow", "WashingtonPost",
          "Handwritten", "Synthesized")


def load_sample(splits: list[str], limit: int | None) -> dict[str, list[Path]]:
    root = cc.require_benchdata("maskbench")
    by_split: dict[str, list[Path]] = defaultdict(list)
    for path in root.glob("*.json"):
        by_split[path.name.split("---", 1)[0]].append(path)
    unknown = [s for s in splits if s not in by_split]
    if unknown:
        sys.exit(f"unknown splits {unknown}; present: {', '.join(sorted(by_split))}")
    order = [s for s in SPLITS if s in by_split] + sorted(s for s in by_split if s not in SPLITS)
    sample = {}
    for split in order:
        if splits and split not in splits:
            continue
        paths = sorted(by_split[split], key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
        sample[split] = paths[:limit] if limit else paths
    return sample


# Regex and choice constraints (--kinds regex,choice): a fixed set of everyday patterns and option
# lists, each with strings that should and should not be accepted (labels: Python re.fullmatch,
# i.e. the whole output must match). Speed and soundness of the non-JSON kinds, for AUTO's order.
REGEXES: list[tuple[str, list[str]]] = [
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}", ["2024-01-31", "1999-12-01", "2024-1-31", "2024-01-31x", "20240131"]),
    (r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}", ["ann.lee@example.com", "x@y.io", "ann@example", "@example.com",
                                               "ann@example.c", "Ann@example.com"]),
    (r"\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}", ["(555) 123-4567", "555-123-4567", "5551234567", "555 123 4567"]),
    (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
     ["123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-42661417400",
      "123E4567-E89B-12D3-A456-426614174000", "123e4567e89b12d3a456426614174000"]),
    (r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])",
     ["192.168.0.1", "255.255.255.255", "0.0.0.0", "256.1.1.1", "1.2.3", "01.2.3.4.5"]),
    (r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?", ["0", "-12.5", "3e10", "1.5E-3", "01", "1.", "--1", "+1"]),
    (r"[A-Z][a-z]+( [a-z]+){0,10}\.", ["Hello world.", "The cat sat on the mat.", "hello world.", "Hello world",
                                       "Hello  world."]),
    (r"\d{3}-\d{2}-\d{4}", ["123-45-6789", "123-456-789", "12-345-6789", "123-45-67890"]),
    (r"https?://[a-z0-9.-]+(/[a-zA-Z0-9._~-]*)*", ["https://example.com/a/b.html", "http://x.org",
                                                  "ftp://example.com", "https:/example.com", "https://Example.com"]),
    (r"[^\n]{1,200}", ["any line at all, with punctuation!", "ü and emoji 🎉", "", "two\nlines"]),
    (r"(\w+ ){2,5}\w+", ["one two three", "a b c d e f", "one two", "one  two three", "one two three "]),
    (r"(ab)*", ["", "ab", "ababab", "aba", "ba"]),
    (r"(yes|no|maybe)", ["yes", "no", "maybe", "yesno", "ye", "Yes"]),
    (r"[a-z]{1,300}", ["a", "abc" * 100, "abc" * 101, "aBc"]),
    (r"#[0-9a-fA-F]{6}", ["#00ff00", "#ABCDEF", "#00ff0", "00ff00", "#00ff00f"]),
]
_COUNTRIES = ["Afghanistan", "Albania", "Algeria", "Andorra", "Angola", "Argentina", "Armenia", "Australia",
              "Austria", "Azerbaijan", "Bahamas", "Bahrain", "Bangladesh", "Barbados", "Belarus", "Belgium",
              "Belize", "Benin", "Bhutan", "Bolivia", "Botswana", "Brazil", "Brunei", "Bulgaria", "Burundi",
              "Cambodia", "Cameroon", "Canada", "Chad", "Chile", "China", "Colombia", "Comoros", "Congo",
              "Croatia", "Cuba", "Cyprus", "Czechia", "Denmark", "Djibouti", "Dominica", "Ecuador", "Egypt",
              "Eritrea", "Estonia", "Eswatini", "Ethiopia", "Fiji", "Finland", "France"]
CHOICES: list[tuple[list[str], list[str]]] = [
    (["yes", "no"], ["y", "yess", "No", "yesno"]),
    (["positive", "negative", "neutral"], ["pos", "neutrals", "Positive"]),
    (["a", "ab", "abc"], ["abcd", "b", "ba"]),  # options that are prefixes of others
    (_COUNTRIES, ["Franc", "Germany", "Chinas", "canada"]),
    ([f"item-{i:04d}" for i in range(1000)], ["item-1000", "item-999", "item-00001", "item-"]),
    (["naïve café", "日本語", "emoji 🎉", 'quote " and \\ backslash', "new\nline"],
     ["naive cafe", "日本", "emoji", "quote"]),
]


def regex_items() -> list[tuple[str, str, ConstraintSpec, list[tuple[bool, str]]]]:
    items = []
    for pattern, strings in REGEXES:
        compiled = re.compile(pattern)
        items.append(("regex", pattern, ConstraintSpec.regex(pattern),
                      [(compiled.fullmatch(s) is not None, s) for s in strings]))
    return items


def choice_items() -> list[tuple[str, str, ConstraintSpec, list[tuple[bool, str]]]]:
    items = []
    for options, others in CHOICES:
        tests = [(True, o) for o in options[:: max(1, len(options) // 8)]] + [(o in options, o) for o in others]
        items.append(("choice", f"{len(options)} options", ConstraintSpec.choice(options), tests))
    return items


def json_items(sample: dict[str, list[Path]]):  # type: ignore[no-untyped-def]
    """(split, name, spec, [(valid, text)]) per schema, read lazily."""
    for split, paths in sample.items():
        for path in paths:
            item = json.loads(path.read_text(encoding="utf-8"))
            yield (split, path.name, ConstraintSpec.json_schema(item["schema"]),
                   [(bool(t["valid"]), cc.instance_text(t["data"])) for t in item["tests"]])


def _share(n: int, of: int) -> str:
    return f"{n}/{of} ({100 * n / of:.0f}%)" if of else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cc.add_common_args(parser, default_limit=40, default_timeout=10.0)
    parser.add_argument("--kinds", default="json", help="comma-separated: json, regex, choice")
    args = parser.parse_args()
    engines = cc.parse_engines(args.engines)
    kinds = [k for k in args.kinds.split(",") if k]
    sample = load_sample([s for s in args.splits.split(",") if s], args.limit) if "json" in kinds else {}
    extra = (regex_items() if "regex" in kinds else []) + (choice_items() if "choice" in kinds else [])
    splits = [*sample, *dict.fromkeys(split for split, *_ in extra)]
    total = sum(len(p) for p in sample.values()) + len(extra)
    print(f"command: {cc.command_line()}", flush=True)
    print(f"{total} constraints ({', '.join(kinds)}); compile limit {args.timeout:g} s; {cc.versions()}",
          flush=True)

    # engine → split → lists/counters
    compile_ms: dict[str, dict[str, list[float]]] = {e: defaultdict(list) for e in engines}
    mask_us: dict[str, dict[str, list[float]]] = {e: defaultdict(list) for e in engines}
    count: dict[str, dict[str, dict[str, int]]] = {e: defaultdict(lambda: defaultdict(int)) for e in engines}
    chosen: dict[str, int] = defaultdict(int)
    failures: dict[str, dict[str, int]] = {e: defaultdict(int) for e in engines}
    notes: dict[str, list[str]] = defaultdict(list)
    saved = []
    progress = cc.Progress(total, args.progress_every, "maskbench")
    started = time.monotonic()
    with cc.Runner(args.timeout) as runner:
        runner.start(cc.engines_needed(ConstraintSpec.json_schema({}), engines))
        for split, name, spec, tests in itertools.chain(json_items(sample), extra):
            results = cc.evaluate(runner, spec, [text for _, text in tests], engines)
            saved.append({"split": split, "name": name, "results": {e: cc.result_json(r) for e, r in results.items()}})
            for engine, result in results.items():
                c = count[engine][split]
                c["schemas"] += 1
                if not result.compiled:
                    c[f"fail:{result.kind}"] += 1
                    failures[engine][result.kind] += 1
                    if result.kind not in ("refused", "timeout"):
                        notes[engine].append(f"{name}: {result.kind}: {result.error}")
                    continue
                c["compiled"] += 1
                compile_ms[engine][split].append(result.compile_ns / 1e6)
                if engine == cc.AUTO:
                    chosen[result.chosen] += 1
                wrong = 0
                for (valid, text), outcome in zip(tests, result.outcomes, strict=True):
                    mask_us[engine][split].extend(ns / 1e3 for ns in outcome.mask_ns)
                    if outcome.status == "error":
                        c["errors"] += 1
                        wrong += 1
                    elif valid and not outcome.served:
                        c["valid_rejected"] += 1
                        wrong += 1
                    elif not valid and outcome.served:
                        c["invalid_accepted"] += 1
                        wrong += 1
                    c["instances"] += 1
                    if outcome.note:
                        notes[engine].append(f"{name} {text[:60]!r}: {outcome.note}")
                fallback = engine == cc.FALLBACK or result.chosen == cc.FALLBACK
                c["exact"] += wrong == 0 and not fallback
                c["served"] += wrong == 0
            progress.step(split)
    elapsed = time.monotonic() - started

    print(f"\nMaskBench: {total} constraints ({args.limit or 'all'} schemas per split), SmolLM2-135M tokenizer, "
          f"compile limit {args.timeout:g} s, {elapsed:.0f} s in all\n")
    header = ["split", "engine", "schemas", "compiled", "timeouts", "compile p50 ms", "compile p90 ms",
              "mask p50 µs", "mask p99 µs", "valid rejected", "invalid accepted", "exact", "served"]
    rows = []
    for split in [*splits, "all"] if len(splits) > 1 else splits:
        for engine in engines:
            if split == "all":
                c: dict[str, int] = defaultdict(int)
                for per in count[engine].values():
                    for key, value in per.items():
                        c[key] += value
                cms = [v for vs in compile_ms[engine].values() for v in vs]
                mus = [v for vs in mask_us[engine].values() for v in vs]
            else:
                c, cms, mus = count[engine][split], compile_ms[engine][split], mask_us[engine][split]
            schemas = c["schemas"]
            rows.append([f"**{split}**" if split == "all" else split, engine, schemas,
                         f"{100 * c['compiled'] / schemas:.0f}%" if schemas else "–", c["fail:timeout"],
                         cc.fmt(cc.percentile(cms, 50)), cc.fmt(cc.percentile(cms, 90)),
                         cc.fmt(cc.percentile(mus, 50)), cc.fmt(cc.percentile(mus, 99)),
                         c["valid_rejected"], c["invalid_accepted"] + c["errors"],
                         _share(c["exact"], schemas), _share(c["served"], schemas)])
    print(cc.markdown_table(header, rows))
    if cc.AUTO in engines:
        print("\nAUTO used: " + ", ".join(f"{k} {v}" for k, v in sorted(chosen.items())))
    print("\nCompile failures by kind: " + "; ".join(
        f"{e}: " + (", ".join(f"{k} {v}" for k, v in sorted(f.items())) or "none") for e, f in failures.items()))
    print(f"worker restarts (timeouts/crashes): {runner.restarts()}")
    cc.report_notes_and_save(notes, saved, args.save, "constraint")


if __name__ == "__main__":
    main()
