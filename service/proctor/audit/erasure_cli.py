"""``proctor audit erase | hold | release | sweep``: erasure, legal holds and retention from the command line
(audit/erasure.py, audit/holds.py, audit/retention.py; docs/compliance.md).

Each appends its record to the log through a writer of its own on the same store (SQLite serialises it with the
server's; PostgreSQL chains it inside the write transaction), signed with the log's key.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from proctor.audit.cli_common import fail, key_dir_flag, parse_time, settings_of, store_flags
from proctor.audit.keystore import FileKeyStore
from proctor.audit.store import AuditStore


def add_erasure_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    erase = sub.add_parser("erase", help="erase a subject's records by destroying its keys (every proof stays valid), "
                                         "and record the erasure")
    erase.add_argument("--subject", required=True, help="the subject: a request's subject_id, or a caller's name")
    erase.add_argument("--reason", required=True, help="why (kept in the erasure record): a request's reference")
    _common(erase)
    erase.set_defaults(func=_erase)

    hold = sub.add_parser("hold", help="place a legal hold: erasure and retention leave what it covers alone")
    scope = hold.add_mutually_exclusive_group(required=True)
    scope.add_argument("--subject", help="every record of this subject")
    scope.add_argument("--caller", help="every record this caller made")
    scope.add_argument("--from", dest="start", help="records from this time (ISO 8601 or epoch ms; with --to)")
    hold.add_argument("--to", dest="end", help="records before this time (with --from)")
    hold.add_argument("--reason", required=True, help="why (kept in the hold record): a case reference")
    _common(hold)
    hold.set_defaults(func=_hold)

    release = sub.add_parser("release", help="end a legal hold (recorded in the log)")
    release.add_argument("hold_id", help="the hold's id (hold-…)")
    release.add_argument("--reason", required=True, help="why it ends")
    _common(release)
    release.set_defaults(func=_release)

    sweep = sub.add_parser("sweep", help="destroy the keys of records past retention that no hold covers (a CronJob)")
    sweep.add_argument("--retention-days", type=int, default=None,
                       help="days records are kept (default: the server's --audit-retention-days)")
    sweep.add_argument("--retention-file", default=None,
                       help="periods per subject and per caller (default: the server's --audit-retention-file)")
    _common(sweep)
    sweep.set_defaults(func=_sweep)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--operator", default="", help="who does it (default: this user's login name)")
    store_flags(parser)
    key_dir_flag(parser)
    parser.add_argument("--signing-key", help="the log's Ed25519 key, which signs the record's checkpoint "
                                              "(default: the server's, <db>.key or PROCTOR_AUDIT_SIGNING_KEY)")


@contextlib.contextmanager
def _log(args: argparse.Namespace) -> Iterator[tuple[AuditStore, FileKeyStore, Callable[[dict[str, Any]], str]]]:
    """The store, the key store, and an ``append`` that commits a record (its audit id back)."""
    from proctor.audit.chain import load_or_create_signing_key
    from proctor.audit.setup import checkpoint_path, key_dir, open_store, signing_key_path
    from proctor.audit.sink import AuditSink

    settings = settings_of(args)
    signing = Path(args.signing_key) if args.signing_key else signing_key_path(settings)
    if not signing.is_file():
        raise FileNotFoundError(f"no log key at {signing}: name it with --signing-key")
    store = open_store(settings)
    keys = FileKeyStore(Path(args.key_dir) if args.key_dir else key_dir(settings))
    sink = AuditSink(store, load_or_create_signing_key(signing), checkpoint_file=checkpoint_path(settings),
                     origin=settings.audit_origin)

    def append(body: dict[str, Any]) -> str:
        sink.submit(body).result(timeout=60)
        return str(body["audit_id"])

    try:
        yield store, keys, append
    finally:
        sink.close()


def _operator(args: argparse.Namespace) -> str:
    return str(args.operator or getpass.getuser())


def _erase(args: argparse.Namespace) -> int:
    from proctor.audit.erasure import NothingToErase, erase, recovered_note
    from proctor.audit.holds import Held
    from proctor.audit.memory_erasure import GRACE_S, POLL_S

    try:
        with _log(args) as (store, keys, append):
            done = erase(store, keys, args.subject, args.reason, _operator(args), append)
    except (NothingToErase, Held) as exc:
        return fail(str(exc), 1)
    except Exception as exc:
        return fail(f"the erasure did not complete: {exc}")
    print(f"erased subject {args.subject!r}: {len(done.key_ids)} keys destroyed, {done.records} records unreadable; "
          f"erasure record {done.audit_id}{recovered_note(done.recovered, args.subject)}", file=sys.stderr)
    print(f"a server sealing under this key store drops the subject's prompts from its prefix cache within "
          f"{POLL_S:.0f} s ({GRACE_S:.0f} s if it never saw the subject's key; it watches the keys); calls still "
          "running keep theirs until they end", file=sys.stderr)
    return 0


def _hold(args: argparse.Namespace) -> int:
    from proctor.audit.holds import hold_body

    try:
        if args.start is not None or args.end is not None:
            if args.start is None or args.end is None:
                return fail("a time range needs --from and --to")
            scope: dict[str, Any] = {"from_ms": parse_time(args.start, "--from"), "to_ms": parse_time(args.end, "--to")}
        else:
            scope = {"subject": args.subject} if args.subject is not None else {"caller": args.caller}
        body = hold_body(scope, args.reason, _operator(args))
        with _log(args) as (_, _, append):
            hold_id = append(body)
    except Exception as exc:
        return fail(str(exc))
    print(hold_id)
    print(f"hold {hold_id} placed", file=sys.stderr)
    return 0


def _release(args: argparse.Namespace) -> int:
    from proctor.audit.holds import release

    try:
        with _log(args) as (store, _, append):
            hold = release(store, args.hold_id, args.reason, _operator(args), append)
    except LookupError as exc:
        return fail(str(exc), 1)
    except Exception as exc:
        return fail(str(exc))
    print(f"released {hold.describe()}", file=sys.stderr)
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from proctor.audit.erasure import recovered_note
    from proctor.audit.retention import RetentionPolicy, sweep

    settings = settings_of(args)
    try:
        policy = RetentionPolicy.load(args.retention_days if args.retention_days is not None
                                      else settings.audit_retention_days,
                                      args.retention_file if args.retention_file is not None
                                      else settings.audit_retention_file)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    if not policy.on:
        return fail("retention is off: pass --retention-days N or --retention-file (or the server's flags)")
    try:
        with _log(args) as (store, keys, append):
            done = sweep(store, keys, policy, int(time.time() * 1000), _operator(args), append)
    except Exception as exc:
        return fail(f"the sweep did not complete: {exc}")
    print(f"swept: {len(done.key_ids)} keys destroyed ({done.records} records), {len(done.held)} kept by holds"
          + (f"; erasure record {done.audit_id}" if done.audit_id else "") + recovered_note(done.recovered),
          file=sys.stderr)
    return 0
