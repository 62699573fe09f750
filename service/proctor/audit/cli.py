"""``proctor audit show | export | verify | prove | verify-proof | consistency | public-key | replay | witness``.

``show``, ``export``, ``verify``, ``prove`` and ``consistency`` read the store directly (``--db``
SQLite file or ``--dsn`` PostgreSQL), read-only; ``verify-proof`` reads only a proof file and keys
(offline, as a third party does); ``replay`` asks a running server (``--addr``), which owns the model.
Exit status: 0 on success (for ``verify``: only when the log is intact; for ``replay``: only on an
exact match), 1 when the check fails, 2 on usage or access errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from proctor.audit.cli_common import fail, key_dir_flag, open_readonly, parse_time, settings_of, store_flags
from proctor.audit.erasure_cli import add_erasure_commands
from proctor.audit.kinds import RECORD_KINDS, REQUEST
from proctor.audit.proof_cli import add_proof_commands
from proctor.audit.store import Filters
from proctor.audit.tlog_cli import add_tlog_commands
from proctor.audit.verify_parallel import PROCESSES_MIN_ROWS
from proctor_client.cli import add_credential_flags


def add_audit_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = subparsers.add_parser("audit", help="read, export, verify, prove and replay the audit trail")
    sub = audit.add_subparsers(dest="audit_command", required=True)

    add_erasure_commands(sub)

    show = sub.add_parser("show", help="one record as a readable table of its tokens")
    show.add_argument("audit_id", help="the record's audit id, or a .tlog-proof file (read without any store)")
    store_flags(show)
    key_dir_flag(show)
    show.set_defaults(func=_show)

    export = sub.add_parser("export", help="records as JSON Lines or CSV")
    store_flags(export)
    key_dir_flag(export)
    export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    export.add_argument("--out", required=True, help="output file (- for stdout)")
    export.add_argument("--since", help="server time, ISO 8601 (2026-11-30T08:00:00Z) or epoch ms; inclusive")
    export.add_argument("--until", help="server time, ISO 8601 or epoch ms; exclusive")
    export.add_argument("--caller", help="only this caller identity")
    export.add_argument("--request-id", help="only this request id")
    export.add_argument("--finish-reason", help="only this finish reason (eos, length, constraint_complete, ...)")
    export.add_argument("--kind", choices=RECORD_KINDS, default=REQUEST,
                        help="request (default): the calls; access: who read the log through the Audit service")
    export.set_defaults(func=_export)

    verify = sub.add_parser("verify", help="check the hash chain, checkpoint signatures and checkpoint file")
    store_flags(verify)
    verify.add_argument("--public-key", help="expected signer: base64 key, or a PEM public/private key file "
                                             "(default: <db>.key next to the database)")
    verify.add_argument("--checkpoint-file", help="checkpoint file (default: <db>.checkpoints next to the database)")
    verify.add_argument("--processes", type=_positive, default=None,
                        help=f"processes that read and hash (default: one per core for a log of "
                             f"{PROCESSES_MIN_ROWS:,} rows or more, else this process's threads)")
    verify.set_defaults(func=_verify)

    add_proof_commands(sub)
    add_tlog_commands(sub)

    init = sub.add_parser("init-postgres", help="create the PostgreSQL audit table as its owner and grant the "
                                                "server's role only SELECT and INSERT")
    init.add_argument("--dsn", required=True, help="the owner's DSN, postgresql://…")
    init.add_argument("--grant-to", metavar="ROLE", help="the role the server connects as (gets SELECT, INSERT)")
    init.set_defaults(func=_init_postgres)

    replay = sub.add_parser("replay", help="re-run a recorded generation on a server and compare the tokens")
    replay.add_argument("audit_id")
    replay.add_argument("--addr", default=None, help="server address (default PROCTOR_ADDR or 127.0.0.1:50051)")
    replay.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    add_credential_flags(replay)
    replay.set_defaults(func=_replay)


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return number


def _show(args: argparse.Namespace) -> int:
    if args.audit_id.endswith(".tlog-proof") or Path(args.audit_id).is_file():
        return _show_proof(Path(args.audit_id))
    try:
        store = open_readonly(args)
        row = store.get(args.audit_id)
    except Exception as exc:
        return fail(str(exc))
    if row is None:
        return fail(f"no audit record {args.audit_id!r}", 1)
    from proctor.audit.erasure import opened_json
    from proctor.audit.setup import key_store

    for line in render_record(json.loads(opened_json(row, key_store(settings_of(args), existing=True))), row.seq,
                              row.hash):
        print(line)
    return 0


def _show_proof(path: Path) -> int:
    """The record inside a proof file: its leaf bytes, read without any store (not a verification)."""
    import hashlib

    from proctor_client.tlog.proof import parse_leaf, parse_proof

    try:
        proof = parse_proof(path.read_text(encoding="utf-8"))
        if proof.extra is None:
            return fail(f"{path}: the proof carries no record (no extra line)", 1)
        leaf = parse_leaf(proof.extra)
        record = leaf.record()
    except (OSError, ValueError) as exc:
        return fail(f"{path}: {exc}")
    if record.get("kind") != "request":
        print(json.dumps(record, indent=1))
    else:
        for line in render_record(record, leaf.seq, hashlib.sha256(proof.extra).hexdigest()):
            print(line)
    print(f"\n(from {path}, index {proof.index}; `proctor audit verify-proof` checks it against the log's key)",
          file=sys.stderr)
    return 0


def render_record(body: dict[str, Any], seq: int, hash_: str) -> list[str]:
    from proctor.audit.export import iso

    finish = body.get("finish") or {}
    usage = body.get("usage") or {}
    caller = body["caller"]
    lines = [f"audit id   {body['audit_id']}  (record {seq}, sha256 {hash_[:16]}…)",
             f"call       {body['method']}   at {iso(body['received_ms'])}   caller {caller['identity']} "
             f"({caller['source']})",
             f"model      {body['model'].get('model_id')}  weights {str(body['model'].get('weights_sha256'))[:16]}…  "
             f"{body['model'].get('dtype')} ({body['model'].get('weights') or 'dense'} weights) "
             f"on {body['model'].get('device')}",
             f"status     {body['status']['code']} {body['status']['message'] or ''}".rstrip(),
             f"finish     {finish.get('reason', '-')} {finish.get('detail') or ''}".rstrip(),
             f"usage      {_usage_line(usage)}"]
    for label, part in (("prompt", body.get("prompt")), ("output", body.get("output"))):
        if part:
            text = part.get("text", "")
            shown = (("… " if len(text) > 300 else "") + repr(text[-300:]) if part["policy"] == "full"
                     else "erased (its subject's key is destroyed)" if part["policy"] == "erased"
                     else f"hmac-sha256 {part['hmac_sha256']}")
            lines.append(f"{label:<10} {shown}")
    if body.get("constraint"):
        c = body["constraint"]
        lines.append(f"constraint {c['kind']} via {c['backend']} (spec sha256 {c['spec_sha256'][:16]}…)")
    if body.get("contract"):
        k = body["contract"]
        present = {c["id"]: c["present"] for c in k["check"]["clauses"]}
        clauses = ", ".join(f"{c['id']} {'present' if present.get(c['id']) else 'MISSING'}"
                            for c in k["required_clauses"]) or "none required"
        lines.append(f"contract   {k['template']} ({k['language']}), draft {k['draft_id']} attempt {k['attempt']}"
                     f"/{k['max_attempts']} ({k['reason']}): {'valid' if k['check']['valid'] else 'NOT VALID'}; "
                     f"clauses {clauses}")
    tokens = body.get("tokens") or []
    if tokens:
        lines += ["", f"{'step':>4}  {'token':>6}  {'text':<16} {'logprob':>8} {'final':>8}  {'allowed':>7}  "
                      f"{'removed':<10} alternatives (logprob)"]
        for t in tokens:
            alternatives = ", ".join(f"{a.get('text', '#')!r} {a['logprob']:.2f}" for a in t.get("top", []))
            token_id = t.get("id", "hmac")
            final = "-inf" if t.get("final_logprob") is None else f"{t['final_logprob']:.3f}"
            lines.append(f"{t['step']:>4}  {token_id!s:>6}  {t.get('text', '')!r:<16} {t['logprob']:>8.3f} "
                         f"{final:>8}  {t.get('allowed') if t.get('allowed') is not None else '-':>7}  "
                         f"{t.get('removed_by') or '':<10} {alternatives}")
    return lines


def _export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from proctor.audit.export import export_records
    from proctor.audit.setup import key_store

    try:
        filters = Filters(since_ms=parse_time(args.since, "--since"), until_ms=parse_time(args.until, "--until"),
                          caller=args.caller, request_id=args.request_id, finish_reason=args.finish_reason,
                          kind=args.kind)
        store = open_readonly(args)
    except Exception as exc:
        return fail(str(exc))
    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8", newline="")  # noqa: SIM115
    try:
        with tqdm(total=store.count(), unit="rec", desc="export", file=sys.stderr, disable=args.out == "-") as bar:
            count = export_records(store, out, args.format, filters, progress=lambda n: bar.update(n),
                                   keys=key_store(settings_of(args), existing=True))
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"exported {count} records to {args.out} ({args.format})", file=sys.stderr)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from proctor.audit.setup import checkpoint_path, signing_key_path
    from proctor.audit.verify import verify_log
    from proctor_client.tlog.note import load_public_key

    settings = settings_of(args)
    key_file = signing_key_path(settings)
    key_source = args.public_key or (str(key_file) if key_file.exists() else None)
    checkpoints = Path(args.checkpoint_file) if args.checkpoint_file else checkpoint_path(settings)
    try:
        key = load_public_key(key_source) if key_source else None
        store = open_readonly(args)
        with tqdm(total=store.count(), unit="rec", desc="verify", file=sys.stderr) as bar:
            result = verify_log(store, public_key=key, checkpoint_file=checkpoints, progress=bar.update,
                                processes=args.processes)
    except Exception as exc:
        return fail(str(exc))
    print(result.summary())
    if key is None:
        print("note: no --public-key given: checkpoint signatures were checked against the keys they name",
              file=sys.stderr)
    return 0 if result.ok else 1


def _init_postgres(args: argparse.Namespace) -> int:
    from proctor.audit.postgres_store import TABLES, init_schema

    try:
        init_schema(args.dsn, args.grant_to)
    except Exception as exc:
        return fail(str(exc))
    granted = f"; {args.grant_to} may SELECT and INSERT only" if args.grant_to else ""
    print(f"{', '.join(TABLES)} ready{granted}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from proctor_client import ProctorError
    from proctor_client.cli import client_from_args

    try:
        with client_from_args(args, args.timeout) as client:
            result = client.replay(args.audit_id)
    except ProctorError as exc:
        return fail(f"{exc.code.name}: {exc.message}")
    print(result.message)
    print(f"steps compared {result.steps_compared}, finish recorded {result.recorded_finish_reason} / replayed "
          f"{result.replayed_finish_reason}, max logprob drift {result.max_logprob_drift:.3g}, "
          f"replay audit id {result.replay_audit_id}")
    return 0 if result.exact_match else 1


def _usage_line(usage: dict[str, Any]) -> str:
    """Tokens in and out, and how they were computed where the record says (issue 27's fields)."""
    line = f"prompt {usage.get('prompt_tokens', '-')} tokens"
    if usage.get("cached_prompt_tokens"):
        line += f" ({usage['cached_prompt_tokens']} from the prefix cache)"
    line += f", output {usage.get('completion_tokens', '-')} tokens"
    if usage.get("decode_steps"):
        line += f" in {usage['decode_steps']} decode steps"
    if usage.get("drafted_tokens"):
        line += f", {usage.get('accepted_tokens', 0)} of {usage['drafted_tokens']} drafted tokens kept"
    if usage.get("closing_tokens"):
        line += f", the last {usage['closing_tokens']} forced to close the JSON within the budget"
    return line
