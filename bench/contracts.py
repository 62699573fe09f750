"""Contract drafting benchmark (issue 15): varied requests per template, validity, required clauses, latency.

For each template, ``--requests`` varied drafts (parties, roles, required clause subsets from the
catalogue, facts, and for templates that have it a share in Chinese), one at a time against a fresh
``proctor serve`` on this machine, greedy. Each is measured twice in the same run:

- **DraftContract**: the template specialised to the request (required clauses, parties and facts by
  construction), checked and repaired by the server;
- **baseline**: the same chat messages through ``Generate`` with the template's plain registered schema
  (``schema_ref``) — what a caller could do before — checked with the same check.

Prints per template: valid share, share holding every required clause and party/fact, attempts, and
latency p50/p95 (median of the whole call, repairs included).

    python bench/contracts.py [--requests 20] [--templates contract/nda,contract/service-agreement] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src"), str(ROOT / "bench")]

from load import start_server  # noqa: E402

from proctor.constraints.registry import SchemaRegistry  # noqa: E402
from proctor.contracts.attempt_plans import check_contract, render_messages  # noqa: E402
from proctor.contracts.request import ContractRequest, Party, RequiredClause  # noqa: E402
from proctor.contracts.specialise import specialise  # noqa: E402
from proctor.contracts.templates import ContractTemplate, TemplateRegistry  # noqa: E402
from proctor_client import ProctorClient  # noqa: E402
from proctor_client.v1 import contracts_pb2  # noqa: E402

NAMES = {"en": ["Acme Corp", "Globex Ltd", "Initech LLC", "Umbrella plc", "Stark Industries", "Wayne Enterprises",
                "Hooli Inc", "Vandelay Imports", "Soylent GmbH", "Cyberdyne Systems"],
         "zh": ["上海星辰科技有限公司", "北京云图数据有限公司", "深圳海岸智能有限公司", "杭州青山软件有限公司"]}
PLACES = {"en": ["Delaware", "New York", "England and Wales", "Ontario", "Bavaria", "California"],
          "zh": ["上海", "北京", "深圳", "杭州"]}
LAWS = {"en": ["State of New York", "England and Wales", "State of Delaware"], "zh": ["中华人民共和国法律"]}


@dataclass
class Tally:
    latencies_s: list[float] = field(default_factory=list)
    valid: int = 0
    complete: int = 0  # every required clause, party and fact there
    attempts: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    count: int = 0


def varied_requests(template: ContractTemplate, count: int, rng: random.Random) -> list[ContractRequest]:
    languages = [code for code, _ in template.languages]
    catalogue = [clause_id for clause_id, _ in template.clauses.catalogue]
    most = min(3, template.clauses.max_count or 3)
    requests = []
    for number in range(count):
        language = "zh" if "zh" in languages and number % 4 == 3 else "en"
        names = rng.sample(NAMES[language], 2)
        roles = ([role for role, _ in template.parties.slots] if template.parties.slots
                 else [rng.choice(template.parties.roles) for _ in range(2)])
        parties = tuple(Party(name, role, rng.choice(PLACES[language]) if rng.random() < 0.5 else "")
                        for name, role in zip(names, roles, strict=True))
        clauses = tuple(RequiredClause(c) for c in rng.sample(catalogue, rng.randint(1, most)))
        facts: list[tuple[str, str]] = []
        if template.fact("governing_law") and rng.random() < 0.7:
            facts.append(("governing_law", rng.choice(LAWS[language])))
        if template.fact("term_months") and rng.random() < 0.5:
            facts.append(("term_months", str(rng.choice((6, 12, 24, 36)))))
        if template.fact("fee_amount") and rng.random() < 0.7:
            facts += [("fee_amount", str(rng.choice((900, 1200, 25000)))), ("currency", rng.choice(("USD", "EUR")))]
        requests.append(ContractRequest(f"bench-{template.name}-{number}", template.ref, parties, clauses,
                                        tuple(facts), language))
    return requests


def to_proto(request: ContractRequest) -> contracts_pb2.DraftContractRequest:
    return contracts_pb2.DraftContractRequest(
        request_id=request.request_id, template=request.template, language=request.language,
        parties=[contracts_pb2.ContractParty(name=p.name, role=p.role, jurisdiction=p.jurisdiction)
                 for p in request.parties],
        required_clauses=[contracts_pb2.RequiredClause(id=c.id, title=c.title) for c in request.required_clauses],
        facts=dict(request.facts))


def run(client: ProctorClient, template: ContractTemplate, requests: list[ContractRequest]) -> tuple[Tally, Tally]:
    drafted, baseline = Tally(), Tally()
    for index, request in enumerate(requests):
        specialised = specialise(template, request)
        start = time.perf_counter()
        response = client.draft_contract(to_proto(request), timeout_s=900)
        drafted.latencies_s.append(time.perf_counter() - start)
        drafted.count += 1
        drafted.valid += response.valid
        drafted.complete += check_contract(response.contract_json, template, specialised).valid
        drafted.attempts.append(len(response.attempts))
        drafted.tokens.append(response.usage.completion_tokens)
        messages = [{"role": m.role, "content": m.content} for m in render_messages(template, request, specialised)]
        start = time.perf_counter()
        plain = client.generate(messages=messages, schema_ref=template.schema.ref, temperature=0,
                                max_new_tokens=template.max_new_tokens, timeout_s=900)
        baseline.latencies_s.append(time.perf_counter() - start)
        baseline.count += 1
        baseline.valid += plain.schema_validation.valid
        baseline.complete += check_contract(plain.text, template, specialised).valid
        baseline.attempts.append(1)
        baseline.tokens.append(plain.usage.completion_tokens)
        print(f"  {template.ref} {index + 1}/{len(requests)} ({request.language}): draft "
              f"{'valid' if response.valid else 'INVALID'} in {drafted.latencies_s[-1]:.1f} s, "
              f"{len(response.attempts)} attempt(s); baseline "
              f"{'complete' if check_contract(plain.text, template, specialised).valid else 'incomplete'}",
              file=sys.stderr, flush=True)
    return drafted, baseline


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(name: str, mode: str, tally: Tally) -> str:
    n = tally.count
    return (f"| {name} | {mode} | {n} | {tally.valid / n:.0%} | {tally.complete / n:.0%} | "
            f"{statistics.mean(tally.attempts):.2f} | {statistics.median(tally.tokens):.0f} | "
            f"{pct(tally.latencies_s, 0.5):.1f} / {pct(tally.latencies_s, 0.95):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20, help="varied requests per template")
    parser.add_argument("--templates", default="contract/nda,contract/service-agreement")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--server-arg", action="append", default=[], help="extra `proctor serve` argument")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    registry = TemplateRegistry.load(SchemaRegistry.load())
    rng = random.Random(args.seed)
    directory = Path(tempfile.mkdtemp(prefix="proctor-contracts-"))
    process, address = start_server(directory, args.server_arg)
    rows, report = [], {}
    try:
        with ProctorClient(address, timeout_s=900) as client:
            client.wait_ready(600)
            for name in args.templates.split(","):
                template = registry.resolve(name)
                requests = varied_requests(template, args.requests, rng)
                client.draft_contract(to_proto(requests[0]), timeout_s=900)  # warm-up: compile, page faults
                drafted, baseline = run(client, template, requests)
                rows += [row(template.ref, "DraftContract", drafted), row(template.ref, "baseline: Generate + "
                                                                                  "schema_ref", baseline)]
                report[template.ref] = {"draft": drafted.__dict__, "baseline": baseline.__dict__}
    finally:
        process.terminate()
        process.wait(60)
    print(f"\n`python bench/contracts.py --requests {args.requests} --templates {args.templates}`\n")
    print("| template | mode | requests | valid | every required clause, party and fact | attempts (mean) "
          "| tokens (median) | latency p50 / p95 s |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
