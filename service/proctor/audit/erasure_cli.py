"""``proctor audit erase``: crypto-shredding from the command line (audit/erasure.py; docs/compliance.md)."""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from proctor.audit.cli_common import fail, settings_of, store_flags


def add_erasure_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    erase = sub.add_parser("erase", help="erase a subject's records by destroying its key (every proof stays valid), "
                                         "and record the erasure")
    erase.add_argument("--subject", required=True, help="the subject: a request's subject_id, or a caller's name")
    erase.add_argument("--reason", required=True, help="why (kept in the erasure record): a request's reference")
    erase.add_argument("--operator", default="", help="who erases (default: this user's login name)")
    store_flags(erase)
    erase.add_argument("--key-dir", help="the subjects' keys (default: the server's, <db>.keys)")
    erase.add_argument("--signing-key", help="the log's Ed25519 key, which signs the erasure's checkpoint "
                                             "(default: the server's, <db>.key or PROCTOR_AUDIT_SIGNING_KEY)")
    erase.set_defaults(func=_erase)


def _erase(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from proctor.audit.chain import load_or_create_signing_key
    from proctor.audit.erasure import NothingToErase, erase
    from proctor.audit.keystore import FileKeyStore
    from proctor.audit.setup import checkpoint_path, key_dir, open_store, signing_key_path
    from proctor.audit.sink import AuditSink

    settings = settings_of(args)
    try:
        keys = FileKeyStore(Path(args.key_dir) if args.key_dir else key_dir(settings))
        store = open_store(settings)
        signing = Path(args.signing_key) if args.signing_key else signing_key_path(settings)
        if not signing.is_file():
            raise FileNotFoundError(f"no log key at {signing}: name it with --signing-key")
        sink = AuditSink(store, load_or_create_signing_key(signing),
                         checkpoint_file=checkpoint_path(settings), origin=settings.audit_origin)
    except Exception as exc:
        return fail(str(exc))

    def append(body: dict[str, Any]) -> str:
        sink.submit(body).result(timeout=60)
        return str(body["audit_id"])

    operator = args.operator or getpass.getuser()
    try:
        with tqdm(total=store.count(), unit="rec", desc="scan", file=sys.stderr) as bar:
            done = erase(store, keys, args.subject, args.reason, operator, append, progress=lambda n: bar.update(n))
    except NothingToErase as exc:
        return fail(str(exc), 1)
    except Exception as exc:
        return fail(f"the erasure did not complete: {exc}")
    finally:
        sink.close()
    print(f"erased subject {done.subject!r}: key {done.key_id} destroyed, {done.records} records unreadable; erasure "
          f"record {done.audit_id}", file=sys.stderr)
    return 0
