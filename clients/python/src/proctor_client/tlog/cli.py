"""``verify-proof``: a ``.tlog-proof`` file checked offline, for ``proctor-client`` and ``proctor audit``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from proctor_client.tlog.proof import verify_proof


def add_verify_proof_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "verify-proof", help="check a .tlog-proof file offline against the log's public key",
        description="Check a c2sp.org/tlog-proof@v1 file with no store and no server: the log's signature on "
                    "its checkpoint, each witness's cosignature, the record against its leaf, and the inclusion "
                    "path against the signed root. Exit 0 when every check holds, 1 naming the one that failed.")
    parser.add_argument("proof", help="the .tlog-proof file (- reads stdin)")
    parser.add_argument("--public-key", required=True,
                        help="the log's key: its vkey (name+hash+base64, `proctor audit public-key`), or a raw "
                             "Ed25519 key (base64, PEM file) taken as the key of the checkpoint's origin")
    parser.add_argument("--witness-key", action="append", default=[], metavar="VKEY",
                        help="a witness's vkey that must have cosigned the checkpoint (repeatable)")
    parser.add_argument("--contract", metavar="FILE",
                        help="also check that this contract JSON is the output the proved record holds")
    parser.set_defaults(func=run_verify_proof)
    return parser


def contract_check(record: dict[str, object], path: Path) -> tuple[bool, str]:
    """Whether the contract file is the record's output (as JSON: formatting aside)."""
    output = record.get("output")
    if not isinstance(output, dict) or "text" not in output:
        return False, "the record keeps no output text (an hmac output policy): the contract cannot be compared"
    try:
        same = json.loads(str(output["text"])) == json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return False, f"cannot compare {path}: {exc}"
    return same, (f"{path} is the output of record {record.get('audit_id')}" if same
                  else f"{path} is not the output of record {record.get('audit_id')}")


def run_verify_proof(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if args.proof == "-" else Path(args.proof).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = verify_proof(text, args.public_key, args.witness_key)
    if report.ok and args.contract:
        report.add("contract", *contract_check(report.record or {}, Path(args.contract)))
    for check in report.checks:
        print(f"{'ok  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    failed = report.failed
    if failed is not None:
        print(f"NOT VERIFIED: the {failed.name} check failed")
        return 1
    record = report.record or {}
    print(f"VERIFIED: {record.get('kind', 'record')} {record.get('audit_id', '')} is in the log".replace("  ", " "))
    return 0


def add_verify_receipt_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "verify-receipt", help="check a response's receipt offline against the log's public key",
        description="Check the receipt a response carried (`proctor_client.tlog.receipt`) with no store and no "
                    "server: the log's signature, the log it names, and optionally the record and the output it "
                    "is for. Exit 0 when every check holds, 1 naming the one that failed, 2 when it cannot be read.")
    parser.add_argument("receipt", help="the receipt file (- reads stdin)")
    parser.add_argument("--public-key", required=True,
                        help="the log's key: its vkey (`proctor audit public-key`), or a raw Ed25519 key (base64, "
                             "PEM file) taken as the key of the origin the receipt names")
    parser.add_argument("--audit-id", help="the record the receipt must be for")
    parser.add_argument("--output-file", metavar="FILE", help="the output text the response returned (UTF-8)")
    parser.set_defaults(func=run_verify_receipt)
    return parser


def run_verify_receipt(args: argparse.Namespace) -> int:
    from proctor_client.tlog.note import NoteError, load_verifier, parse_note
    from proctor_client.tlog.receipt import ReceiptError, parse_receipt, verify_receipt

    try:
        text = sys.stdin.read() if args.receipt == "-" else Path(args.receipt).read_text(encoding="utf-8")
        output = Path(args.output_file).read_text(encoding="utf-8") if args.output_file else None
        named = parse_receipt(parse_note(text).text)
        verifier = load_verifier(args.public_key, named.origin)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NoteError as exc:
        print(f"NOT VERIFIED: {exc}")
        return 1
    try:
        receipt = verify_receipt(text, verifier, audit_id=args.audit_id, output=output)
    except ReceiptError as exc:
        print(f"NOT VERIFIED: the {exc.check} check failed ({exc})")
        return 1
    checked = ", ".join(name for name, asked in (("record", args.audit_id), ("output", output is not None)) if asked)
    print(f"VERIFIED: record {receipt.audit_id} at index {receipt.index} of log {receipt.origin}, committed at "
          f"{receipt.time_ms} ms" + (f" ({checked} checked)" if checked else ""))
    return 0
