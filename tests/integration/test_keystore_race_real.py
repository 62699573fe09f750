"""The key store across processes through the real server and the real CLI (issue 54, part 2), on SQLite and
PostgreSQL: ``proctor serve`` (in this process, ``--audit-encryption subject``) seals the records of new subjects,
each a new key, while ``proctor audit erase`` (a process of its own, run again and again) destroys other subjects'
keys. Afterwards every key file is in the index or destroyed: each new subject's records still open, its key is
listed (so an erasure of it will find it), and each erased subject's records read as erased."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_receipts_real import store_settings

from proctor_client import ProctorClient

pytestmark = pytest.mark.real_model
ERASED, CALLERS = 5, 3  # subjects erased one CLI process each while CALLERS threads keep sealing new subjects


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_the_server_sealing_new_subjects_and_the_cli_erasing_others_lose_no_key(kind: str, tmp_path: Path) -> None:
    from proctor.app import BackgroundServer
    from proctor.audit.keystore import FileKeyStore
    from proctor.audit.setup import key_dir, signing_key_path
    from proctor.config import Settings

    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, **store_settings(kind, tmp_path),
                              "audit_encryption": "subject"}, environ={})
    flags = ["--db", settings.audit_db] if kind == "sqlite" else ["--dsn", settings.audit_dsn]
    erase = [sys.executable, "-m", "proctor.cli", "audit", "erase", "--reason", "GDPR", "--operator", "dpo", *flags,
             "--key-dir", str(key_dir(settings)), "--signing-key", str(signing_key_path(settings))]
    server = BackgroundServer(settings).start()
    made: dict[str, str] = {}  # subject -> audit id, sealed during the race
    stop = threading.Event()

    def seal_new_subjects(number: int) -> None:
        with ProctorClient(server.address, timeout_s=120) as client:
            count = 0
            while not stop.is_set():
                subject = f"new-{number}-{count}"
                made[subject] = client.generate(f"Note for {subject}.", max_new_tokens=1, subject_id=subject).audit_id
                count += 1

    try:
        with ProctorClient(server.address, timeout_s=120) as client:
            old = {f"old-{n}": client.generate(f"Note {n}.", max_new_tokens=1, subject_id=f"old-{n}").audit_id
                   for n in range(ERASED)}
        callers = [threading.Thread(target=seal_new_subjects, args=(n,)) for n in range(CALLERS)]
        for caller in callers:
            caller.start()
        try:
            for subject in old:  # each a CLI process of its own, while the server makes keys
                done = subprocess.run([*erase, "--subject", subject], capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, done.stderr
                assert "1 keys destroyed, 1 records unreadable" in done.stderr
        finally:
            stop.set()
            for caller in callers:
                caller.join(timeout=120)
        keys = FileKeyStore(key_dir(settings))
        listed = {entry.subject: entry.key_id for entry in keys.entries()}
        files = {path.stem for path in key_dir(settings).glob("*.key")}
        assert len(made) >= 2 * ERASED  # the server kept sealing through the erasures
        assert set(listed) == set(made) and files == set(listed.values())  # in the index, or destroyed
        with ProctorClient(server.address, timeout_s=120) as client:
            for audit_id in made.values():
                assert "erased" not in json.loads(client.audit_record(audit_id).record_json)
            for audit_id in old.values():
                assert json.loads(client.audit_record(audit_id).record_json)["erased"]
        assert keys.recover().entries == ()
    finally:
        server.stop()
