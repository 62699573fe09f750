"""``proctor contract draft|templates``: contract drafting from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import grpc

from proctor_client import cli
from proctor_client.contracts import build_contract_request, parse_fact
from proctor_client.errors import ProctorError
from proctor_client.formatting import to_json
from proctor_client.sync_client import ProctorClient
from proctor_client.v1 import contracts_pb2, generation_pb2


def add_contract_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    contract = subparsers.add_parser("contract", help="draft contracts from the server's templates")
    sub = contract.add_subparsers(dest="contract_command", required=True)
    draft = sub.add_parser(
        "draft", help="draft a contract", description="Draft a contract from a template: the parties, facts and "
        "required clauses are fixed in the output by construction; the exit status is 1 unless it is valid.")
    draft.add_argument("--template", required=True, help="template name[@version], e.g. contract/nda")
    draft.add_argument("--party", action="append", default=[], metavar="NAME:ROLE[:JURISDICTION]",
                       help="a party (repeat), e.g. 'Acme Corp:disclosing:Delaware'")
    draft.add_argument("--require-clause", action="append", default=[], metavar="ID[=TITLE]",
                       help="a clause the contract must contain (repeat), e.g. 4.2 or '7=Governing Law'")
    draft.add_argument("--fact", action="append", default=[], metavar="NAME=VALUE",
                       help="a value the contract must hold (repeat), e.g. term_months=24")
    draft.add_argument("--language", default="", help="en (default) or zh")
    draft.add_argument("--max-new-tokens", type=int, help="tokens per attempt (default: the template's)")
    draft.add_argument("--max-attempts", type=int, help="attempts in all, 1: no repair (default: the template's)")
    draft.add_argument("--seed", type=int)
    draft.add_argument("--temperature", type=float, help="first attempt's temperature (default: greedy)")
    draft.add_argument("--forbid", action="append", default=[], metavar="PHRASE", help="a forbidden phrase (repeat)")
    draft.add_argument("--subject", default="", metavar="ID",
                       help="whose data the draft holds (audit erasure: `proctor audit erase --subject ID`); "
                       "default: the caller")
    draft.add_argument("--out", type=Path, help="write the contract JSON here (pretty-printed)")
    draft.add_argument("--proof-out", type=Path, metavar="FILE.tlog-proof",
                       help="also write the draft's audit proof once a signed checkpoint covers it: with the log's "
                            "public key anyone checks the contract offline (verify-proof PROOF --contract FILE)")
    draft.add_argument("--checkpoint-now", action="store_true",
                       help="with --proof-out: have the server write a checkpoint at once instead of waiting")
    draft.add_argument("--proof-wait", type=float, default=120.0, metavar="S",
                       help="with --proof-out: seconds to wait for a checkpoint covering the draft (default 120)")
    cli._add_common(draft, timeout_s=600.0)
    draft.set_defaults(func=run_draft)
    templates = sub.add_parser("templates", help="list the server's contract templates")
    cli._add_common(templates, timeout_s=10.0)
    templates.set_defaults(func=run_templates)
    return contract


def run_draft(args: argparse.Namespace) -> int:
    """Print the contract (or the whole response with --output json) to stdout, a summary to stderr."""
    try:
        request = build_contract_request(
            args.template, args.party, required_clauses=args.require_clause,
            facts=dict(parse_fact(f) for f in args.fact), language=args.language, max_new_tokens=args.max_new_tokens,
            seed=args.seed, temperature=args.temperature, max_attempts=args.max_attempts,
            forbidden_phrases=args.forbid, subject_id=args.subject)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_USAGE
    try:
        with cli.client_from_args(args, args.timeout or None) as client:
            response = client.draft_contract(request)
            if args.proof_out is not None:
                write_proof(client, response.audit_id, args.proof_out, args.checkpoint_now, args.proof_wait)
    except ProctorError as error:
        cli.print_error(error)
        return cli.EXIT_FAILED
    except KeyboardInterrupt:
        return cli.EXIT_INTERRUPTED
    if args.out is not None and response.contract_json:
        try:
            document = json.loads(response.contract_json)
            args.out.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        except ValueError:
            args.out.write_text(response.contract_json, encoding="utf-8")
    if args.output == "json":
        print(to_json(response, include_defaults=True))
    elif args.out is None:
        print(response.contract_json)
    for line in summary(response):
        print(line, file=sys.stderr)
    return cli.EXIT_OK if response.valid else cli.EXIT_FAILED


def write_proof(client: ProctorClient, audit_id: str, path: Path, checkpoint_now: bool, wait_s: float) -> None:
    """The record's ``tlog-proof`` in the first signed checkpoint that covers it (asked for at once, or waited for)."""
    if checkpoint_now:
        client.create_checkpoint()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            proof = client.inclusion_proof(audit_id)
            break
        except ProctorError as error:
            if error.code != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            print(f"waiting for a checkpoint to cover {audit_id}: {error.message}", file=sys.stderr)
            time.sleep(2.0)
    path.write_text(proof.tlog_proof, encoding="utf-8")
    print(f"proof: {path} (record {proof.index} in the checkpoint of {proof.tree_size} records)", file=sys.stderr)


def summary(response: contracts_pb2.DraftContractResponse) -> list[str]:
    clauses = ", ".join(f"{c.id} {'present' if c.present else 'MISSING'}" for c in response.required_clauses)
    lines = [f"{response.template}: {'valid' if response.valid else 'NOT VALID'}"
             f"{'; required clauses ' + clauses if clauses else ''}; audit {response.audit_id}; "
             f"{len(response.attempts)} attempt(s), {response.total_ms:.0f} ms"]
    for attempt in response.attempts:
        finish = generation_pb2.FinishReason.Name(attempt.finish_reason).removeprefix("FINISH_REASON_").lower()
        lines.append(f"  attempt {attempt.attempt} ({attempt.reason}): {attempt.completion_tokens} tokens, "
                     f"{finish}, {'valid' if attempt.valid else 'invalid'}, audit {attempt.audit_id}")
        lines += [f"    {error}" for error in attempt.errors[:5]]
    return lines


def run_templates(args: argparse.Namespace) -> int:
    try:
        with cli.client_from_args(args, args.timeout or None) as client:
            templates = client.list_templates()
    except ProctorError as error:
        cli.print_error(error)
        return cli.EXIT_FAILED
    if args.output == "json":
        print(to_json(contracts_pb2.ListTemplatesResponse(templates=templates), include_defaults=True))
        return cli.EXIT_OK
    for t in templates:
        print(f"{t.name}@{t.version}  {t.description}")
        print(f"  schema {t.schema_ref}; languages {', '.join(t.languages)}; roles {', '.join(t.roles)}; "
              f"at most {t.max_clauses or 'any number of'} clauses")
        print(f"  facts: {', '.join(f.name for f in t.facts) or '-'}")
        print(f"  clauses: {', '.join(f'{c.id} {c.title}' for c in t.clauses) or '-'}")
    return cli.EXIT_OK
