"""``proctor audit prove | verify-proof | consistency | public-key | witness | witness-key``: the Merkle tree's
proofs and witnesses from the command line (docs/audit-format.md "Merkle tree and proofs")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from proctor.audit.cli_common import fail, open_readonly, settings_of, store_flags
from proctor_client.cli import add_credential_flags
from proctor_client.tlog.receipt import Receipt


def add_proof_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    prove = sub.add_parser("prove", help="write a record's inclusion proof in a signed checkpoint "
                                         "(c2sp.org/tlog-proof@v1), checkable offline with verify-proof")
    prove.add_argument("audit_id", nargs="?", help="the record (or --from-receipt)")
    store_flags(prove)
    prove.add_argument("--from-receipt", metavar="FILE",
                       help="the receipt a response carried: prove its record, and refuse when the stored row is not "
                            "the leaf the log signed")
    prove.add_argument("--checkpoint", default="latest", help="latest (default), or a checkpoint's tree size")
    prove.add_argument("--addr", help="a running server of this log: when no checkpoint covers the record yet, ask it "
                                      "for one (CreateCheckpoint, audit:write) instead of failing")
    prove.add_argument("--timeout", type=float, default=30.0, help="seconds for the call to --addr (default 30)")
    add_credential_flags(prove)
    prove.add_argument("--out", help="the proof file (default <audit id>.tlog-proof; - for stdout)")
    prove.set_defaults(func=_prove)

    from proctor_client.tlog.cli import add_verify_proof_command

    add_verify_proof_command(sub)

    consistency = sub.add_parser("consistency", help="the RFC 9162 proof that the log at one size is a prefix of "
                                                     "the log at another")
    store_flags(consistency)
    consistency.add_argument("--from", dest="old", type=int, required=True, help="the smaller tree size")
    consistency.add_argument("--to", dest="new", type=int, required=True, help="the larger tree size")
    consistency.add_argument("--verify", action="store_true",
                             help="also check it against the signed checkpoints of both sizes")
    consistency.add_argument("--public-key", help="the log's key for --verify (default: <db>.key)")
    consistency.set_defaults(func=_consistency)

    key = sub.add_parser("public-key", help="the log's verifier key (vkey) to publish for verify-proof")
    store_flags(key)
    key.add_argument("--origin", help="the log's origin, if the server runs with --audit-origin")
    key.set_defaults(func=_public_key)

    witness = sub.add_parser("witness", help="watch a log, check that it only grows, and cosign its checkpoints "
                                             "(a separate process: a CronJob or a sidecar)")
    witness.add_argument("--log", dest="logs", action="append", metavar="ADDR",
                         help="the log server's gRPC address, asked each round (repeat for replicas of one log)")
    witness.add_argument("--listen", type=int, default=0, metavar="PORT",
                         help="instead of asking a log, serve c2sp.org/tlog-witness (POST /add-checkpoint) here for "
                              "the logs of --log-key, Proctor's or any C2SP log's")
    witness.add_argument("--listen-host", default="127.0.0.1", help="address for --listen (default 127.0.0.1)")
    witness.add_argument("--log-key", dest="log_keys", action="append", required=True,
                         help="the log's vkey (`proctor audit public-key` prints it), or its Ed25519 public key "
                              "(PEM file or base64), named --log-origin; with --listen, repeat for each log")
    witness.add_argument("--log-origin", default="",
                         help="the log's origin with a bare --log-key (default proctor.audit/<key hash>, the "
                              "server's own default)")
    witness.add_argument("--key", required=True, help="this witness's Ed25519 PEM key (created when missing)")
    witness.add_argument("--name", default="", help="this witness's name (default proctor.witness/<key hash>)")
    witness.add_argument("--state", required=True, help="directory keeping the last checkpoint cosigned")
    witness.add_argument("--interval", type=float, default=0.0,
                         help="seconds between rounds (default 0: one round, then exit, for a CronJob)")
    witness.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics here (0: off)")
    witness.add_argument("--timeout", type=float, default=30.0, help="seconds per call to the log (default 30)")
    add_credential_flags(witness)
    witness.set_defaults(func=_witness)

    wkey = sub.add_parser("witness-key", help="a witness's vkey, for the log's --audit-witnesses and verifiers")
    wkey.add_argument("--key", required=True, help="the witness's Ed25519 PEM key (created when missing)")
    wkey.add_argument("--name", default="", help="its name (default proctor.witness/<key hash>)")
    wkey.set_defaults(func=_witness_key)



def _prove(args: argparse.Namespace) -> int:
    from proctor.audit.proofs import NotFound, ProofUnavailable, inclusion
    from proctor_client.tlog.merkle import leaf_hash

    wanted: str | int = args.checkpoint
    if wanted != "latest":
        if not str(wanted).isdigit():
            return fail(f"--checkpoint {wanted!r}: latest, or a tree size")
        wanted = int(wanted)
    try:
        receipt = _receipt(args) if args.from_receipt else None
    except (OSError, ValueError) as exc:
        return fail(f"--from-receipt {args.from_receipt}: {exc}")
    audit_id = receipt.audit_id if receipt is not None else args.audit_id
    if not audit_id or (receipt is not None and args.audit_id not in (None, audit_id)):
        return fail("name one record: an audit id, or --from-receipt (whose record it is)")
    try:
        try:
            proof = inclusion(open_readonly(args), audit_id, wanted)
        except ProofUnavailable as exc:
            if isinstance(exc, NotFound) or not args.addr or wanted != "latest":
                raise ProofUnavailable(f"{exc}{'' if args.addr else ' (or --addr: ask the running server for one)'}"
                                       ) from None
            _ask_for_checkpoint(args)
            proof = inclusion(open_readonly(args), audit_id, wanted)
    except ProofUnavailable as exc:
        return fail(str(exc), 1)
    except Exception as exc:
        return fail(str(exc))
    if receipt is not None and (proof.index != receipt.index or leaf_hash(proof.extra or b"") != receipt.leaf_hash):
        return fail(f"record {audit_id} is stored at index {proof.index} with another leaf than the receipt's (index "
                    f"{receipt.index}): the log does not hold what it signed", 1)
    text = proof.render()
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.out or f"{audit_id}.tlog-proof")
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}: record index {proof.index}, {len(proof.path)} path hashes"
          + (", the receipt's leaf" if receipt is not None else ""), file=sys.stderr)
    return 0


def _receipt(args: argparse.Namespace) -> Receipt:
    """The receipt of --from-receipt, its signature checked with the log's key when this machine holds it."""
    from proctor.audit.setup import signing_key_path
    from proctor_client.tlog.note import load_verifier, parse_note
    from proctor_client.tlog.receipt import parse_receipt, verify_receipt

    text = Path(args.from_receipt).read_text(encoding="utf-8")
    receipt = parse_receipt(parse_note(text).text)
    key = signing_key_path(settings_of(args))
    if key.is_file():
        verify_receipt(text, load_verifier(str(key), receipt.origin))
    return receipt


def _ask_for_checkpoint(args: argparse.Namespace) -> None:
    """Have the server at --addr write a checkpoint over what it committed (the record asked for among it)."""
    from proctor_client import ProctorError
    from proctor_client.cli import client_from_args

    try:
        with client_from_args(args, args.timeout) as client:
            checkpoint = client.create_checkpoint()
    except ProctorError as exc:
        raise ValueError(f"{args.addr} wrote no checkpoint: {exc}") from exc
    print(f"{args.addr} wrote a checkpoint of {checkpoint.tree_size} rows", file=sys.stderr)


def _consistency(args: argparse.Namespace) -> int:
    import base64

    from proctor.audit.proofs import ProofUnavailable, consistency, signed_checkpoint
    from proctor.audit.setup import signing_key_path
    from proctor_client.tlog.merkle import ProofError, verify_consistency
    from proctor_client.tlog.note import NoteError, load_verifier, parse_note, signed_by

    try:
        store = open_readonly(args)
        proof, _old_root, _new_root = consistency(store, args.old, args.new)
    except (ProofUnavailable, ProofError) as exc:
        return fail(str(exc), 1)
    except Exception as exc:
        return fail(str(exc))
    for digest in proof:
        print(base64.b64encode(digest).decode())
    if not args.verify:
        return 0
    try:
        (old, old_note), (new, new_note) = (signed_checkpoint(store, args.old), signed_checkpoint(store, args.new))
        key = args.public_key or str(signing_key_path(settings_of(args)))
        for checkpoint, note in ((old, old_note), (new, new_note)):
            if signed_by(parse_note(note), load_verifier(key, checkpoint.origin)) is None:
                raise NoteError(f"the checkpoint for {checkpoint.size} rows is not signed by the log key")
        verify_consistency(old.size, new.size, proof, old.root, new.root)
    except (ProofUnavailable, ProofError, NoteError) as exc:
        print(f"NOT CONSISTENT: {exc}", file=sys.stderr)
        return 1
    print(f"consistent: the signed checkpoint of {old.size} rows is a prefix of the one of {new.size} rows",
          file=sys.stderr)
    return 0


def _public_key(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from proctor.audit.chain import log_signer
    from proctor.audit.setup import signing_key_path

    settings = settings_of(args)
    path = signing_key_path(settings)
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 key")
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    print(log_signer(key, args.origin or settings.audit_origin).verifier.vkey())
    return 0


def _witness_key(args: argparse.Namespace) -> int:
    from proctor.audit.chain import load_or_create_signing_key
    from proctor.audit.witness import witness_signer

    try:
        print(witness_signer(load_or_create_signing_key(Path(args.key)), args.name).verifier.vkey())
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    return 0


def _witness(args: argparse.Namespace) -> int:
    """Rounds over the log's addresses; exit status of a single round (--interval 0): 0 cosigned or unchanged,
    1 refused (an inconsistent log), 2 the log could not be reached or asked."""
    import time

    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    from proctor.audit.chain import load_or_create_signing_key, log_origin
    from proctor.audit.witness import Refused, witness_round, witness_signer
    from proctor_client import ProctorError
    from proctor_client.cli import client_from_args
    from proctor_client.tlog.note import NoteError, Verifier, load_verifier

    if bool(args.logs) == bool(args.listen):
        return fail("give --log (ask a log each round) or --listen (serve the witness protocol), not both")
    if len(args.log_keys) > 1 and (args.logs or args.log_origin):
        return fail("several --log-key go with --listen, each a vkey naming its log")
    try:
        log_keys = []
        for text in args.log_keys:
            log_key = load_verifier(text, "")
            if not log_key.name:  # a bare key: the server's default origin for it, unless told
                log_key = Verifier(args.log_origin or log_origin(log_key.key), log_key.key)
            log_keys.append(log_key)
        signer = witness_signer(load_or_create_signing_key(Path(args.key)), args.name)
    except (OSError, ValueError, NoteError) as exc:
        return fail(str(exc))
    if args.listen:
        from proctor.audit.witness_http import serve_witness

        serve_witness({key.name: key for key in log_keys}, signer, Path(args.state), args.listen_host, args.listen,
                      args.metrics_port)
        return 0
    log_key = log_keys[0]
    registry = CollectorRegistry()
    rounds = Counter("proctor_witness_rounds", "Witness rounds by outcome (cosigned, unchanged, refused, error)",
                     ["outcome"], registry=registry)
    refusals = Counter("proctor_witness_refusals", "Checkpoints refused, by reason (fork, shrank, signature, ...)",
                       ["reason"], registry=registry)
    inconsistent = Gauge("proctor_witness_inconsistent", "1 once the log showed a checkpoint inconsistent with one "
                         "this witness cosigned (a forked or rewritten log): alert", registry=registry)
    size = Gauge("proctor_witness_tree_size", "The tree size this witness last cosigned", registry=registry)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=registry)
    print(f"witness {signer.verifier.vkey()} watching {log_key.name} at {', '.join(args.logs)}", file=sys.stderr)
    status = 0
    while True:
        status = 0
        for address in args.logs:
            args.addr = address
            try:
                with client_from_args(args, args.timeout) as client:
                    result = witness_round(client, log_key, signer, Path(args.state))
                outcome = "cosigned" if result.cosigned else "unchanged"
                size.set(result.size)
                print(f"{address}: {outcome} at {result.size} records", file=sys.stderr)
            except Refused as exc:
                outcome, status = "refused", 1
                refusals.labels(exc.reason).inc()
                inconsistent.set(1)
                print(f"REFUSED {address}: {exc}", file=sys.stderr)
            except (ProctorError, OSError, ValueError) as exc:
                outcome, status = "error", 1 if status == 1 else 2  # a refusal outranks an error
                print(f"error: {address}: {exc}", file=sys.stderr)
            rounds.labels(outcome).inc()
        if args.interval <= 0:
            return status
        time.sleep(args.interval)
