"""The subjects' key store is one store, whoever opens it (issue 54, part 2): a process making keys for new subjects
(the server sealing) and another destroying other subjects' keys (``proctor audit erase``, the retention sweep)
race many times, and afterwards every key file is in the index or destroyed. A key the index lost anyway (an older
version wrote it, or a crash) is found by walking the key files: erase and sweep destroy it and say so."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from proctor.audit.keystore import FileKeyStore

DAY = "2026-12-05"
ROUNDS, SUBJECTS = 4, 120

# One side of the race, in a process of its own: waits for the start file, then makes keys for new subjects
# ("make") or destroys the keys named in argv ("destroy"); prints the key ids it made or destroyed.
WORKER = """
import json, os, sys, time
from pathlib import Path
from proctor.audit.keystore import FileKeyStore
directory, role, start = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
keys = FileKeyStore(directory)
while not start.exists():
    time.sleep(0.0005)
if role == "make":
    done = [keys.key_for(f"new-{number}", sys.argv[4], "svc")[0] for number in range(int(sys.argv[5]))]
else:
    done = [key_id for key_id in sys.argv[4:] if keys.destroy(key_id)]
print(json.dumps(done))
"""


def race(directory: Path, subjects: int) -> tuple[list[str], list[str]]:
    """``subjects`` old subjects' keys made, then destroyed by one process while another makes ``subjects`` new
    subjects' keys: (the new keys, the old ones)."""
    keys = FileKeyStore(directory)
    old = [keys.key_for(f"old-{number}", DAY, "svc")[0] for number in range(subjects)]
    start = directory.parent / f"{directory.name}.start"
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(directory), "make", str(start), DAY, str(subjects)],
                                stdout=subprocess.PIPE, text=True),
               subprocess.Popen([sys.executable, "-c", WORKER, str(directory), "destroy", str(start), *old],
                                stdout=subprocess.PIPE, text=True)]
    time.sleep(1.0)  # both started (importing proctor); then both run at once
    start.touch()
    made, destroyed = (json.loads(worker.communicate(timeout=300)[0]) for worker in workers)
    assert all(worker.returncode == 0 for worker in workers)
    assert sorted(destroyed) == sorted(old)
    return made, old


def test_a_process_making_keys_and_one_destroying_others_lose_no_key(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        directory = tmp_path / f"keys-{round_}"
        made, old = race(directory, SUBJECTS)
        keys = FileKeyStore(directory)
        listed = {entry.key_id: entry for entry in keys.entries()}
        files = {path.stem for path in directory.glob("*.key")}
        assert set(made) <= set(listed), f"round {round_}: {len(set(made) - set(listed))} new keys left the index"
        assert files == set(listed) == set(made)  # every key file is in the index, or destroyed
        assert not files & set(old) and not {path.stem for path in directory.glob("*.entry")} ^ files
        assert {(entry.subject, entry.day) for entry in listed.values()} == {(f"new-{n}", DAY) for n in range(SUBJECTS)}
        assert keys.recover().entries == ()  # nothing for erase or the sweep to find outside the index


def test_two_processes_and_threads_making_the_same_subjects_keys_make_one_each(tmp_path: Path) -> None:
    """Two processes (the server and a second replica on this machine), each with threads, ask for the same new
    subjects' keys at once: one key a subject, and no key file left behind."""
    start = tmp_path / "start"
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "keys"), "make", str(start), DAY,
                                 str(SUBJECTS)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    keys = FileKeyStore(tmp_path / "keys")
    time.sleep(1.0)
    start.touch()
    with ThreadPoolExecutor(4) as pool:
        here = list(pool.map(lambda number: keys.key_for(f"new-{number}", DAY, "svc")[0], range(SUBJECTS)))
    made = [json.loads(worker.communicate(timeout=300)[0]) for worker in workers]
    assert made[0] == made[1] == here
    assert {path.name for path in (tmp_path / "keys").iterdir()} == \
        {"keys.json", "keys.lock", *(f"{key_id}.{kind}" for key_id in here for kind in ("key", "entry"))}


def test_a_key_the_index_lost_is_found_by_walking_the_key_files(tmp_path: Path) -> None:
    keys = FileKeyStore(tmp_path)
    lost, key = keys.key_for("alice", DAY, "svc")
    kept = keys.key_for("bob", DAY, "svc")[0]
    keys.key_for("alice", DAY, "billing")  # the entry file follows the callers
    index = json.loads((tmp_path / "keys.json").read_text())
    del index[lost]  # what a writer that did not lock the index (an older version) could do
    (tmp_path / "keys.json").write_text(json.dumps(index))
    other = FileKeyStore(tmp_path)
    assert [entry.subject for entry in other.entries()] == ["bob"]
    assert other.key(lost) == key  # still opens alice's records
    found = other.recover()
    assert [(entry.key_id, entry.subject, entry.callers) for entry in found.entries] == \
        [(lost, "alice", ("billing", "svc"))]
    assert {entry.key_id for entry in other.entries()} == {lost, kept}
    assert other.key_for("alice", DAY, "svc") == (lost, key)  # the same key, not a second one for that day
    assert other.destroy(lost) and other.key(lost) is None
    assert not (tmp_path / f"{lost}.key").exists() and not (tmp_path / f"{lost}.entry").exists()
    assert other.recover().entries == () and keys.key(lost) is None


def test_keys_an_older_version_wrote_still_open_and_gain_an_entry(tmp_path: Path) -> None:
    """The old layout: 32-byte key files, the index alone describing them."""
    old_key = bytes(range(32))
    (tmp_path / "0123abcd.key").write_bytes(old_key)
    (tmp_path / "keys.json").write_text(json.dumps({"0123abcd": {"subject": "carol", "day": DAY,
                                                                "callers": ["svc"]}}))
    keys = FileKeyStore(tmp_path)
    assert keys.key("0123abcd") == old_key and keys.key_for("carol", DAY, "svc") == ("0123abcd", old_key)
    assert not (tmp_path / "0123abcd.entry").exists()
    keys.key_for("carol", DAY, "billing")
    assert json.loads((tmp_path / "0123abcd.entry").read_text())["callers"] == ["billing", "svc"]
    assert keys.recover().entries == ()


def test_an_entry_whose_key_is_gone_is_dropped_and_the_next_call_makes_a_new_key(tmp_path: Path) -> None:
    keys = FileKeyStore(tmp_path)
    first, _ = keys.key_for("dave", DAY, "svc")
    (tmp_path / f"{first}.key").unlink()  # a destroy cut short before it rewrote the index
    second, _ = keys.key_for("dave", DAY, "svc")
    assert second != first and [entry.key_id for entry in keys.entries()] == [second]
    (tmp_path / f"{second}.key").unlink()
    assert keys.recover().entries == () and keys.entries() == []
    assert not list(tmp_path.glob("*.entry"))


HOLD = """
import fcntl, sys, time
with open(sys.argv[1], "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(1.5)
"""


def test_a_new_key_waits_for_another_process_holding_the_lock_and_a_known_one_does_not(tmp_path: Path) -> None:
    known = FileKeyStore(tmp_path).key_for("alice", DAY, "svc")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "keys.lock")], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    begin = time.monotonic()
    keys = FileKeyStore(tmp_path)  # another opener, as the server after a restart
    assert keys.key_for("alice", DAY, "svc") == known and time.monotonic() - begin < 0.5
    keys.key_for("bob", DAY, "svc")  # a change: after the other process lets go
    assert time.monotonic() - begin >= 1.0
    assert holder.wait(timeout=30) == 0
