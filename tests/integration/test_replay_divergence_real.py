"""Replay reports a divergence end to end (issue 26): a real server, a real SQLite audit store, a tampered copy.

The session server answers a greedy and a sampled request (a temperature and a seed), twice each. The
store is copied (SQLite's backup API: the live file is in WAL mode) and, in the copy, records are edited as
someone with write access to the file would: the record's canonical JSON is changed and compressed back
into ``body`` (what ``Replay`` reads: ``store.get`` → ``stored_body.record_json``), the hash left as it was.
The chain of the copy then no longer verifies, as expected. ``Replay`` does not consult the chain (it reads
the record by audit id), so a server started on the copy replays the tampered records, and must report:

- a recorded token changed at step 3 (greedy and sampled): diverged at step 3, recorded = the edited token,
  replayed = the token the model really produced;
- a sampled record's seed changed: diverged where the draws under the two seeds first part (computed here
  by generating with the edited seed, not assumed), with both tokens; and the replay ran that seed;
- a greedy record's seed changed: still an exact match (greedy decoding draws nothing from the seed).

The ``proctor audit replay`` CLI says the same and exits 1.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proctor.audit import stored_body
from proctor.audit.canonical import canonical
from proctor.audit.sqlite_store import SCHEMA, SQLiteAuditStore
from proctor.audit.verify import verify_log
from proctor.config import Settings
from proctor_client import ProctorClient
from proctor_client.v1 import generation_pb2

pytestmark = pytest.mark.real_model
REPO = Path(__file__).resolve().parents[2]
STEP = 3  # the recorded token that is altered
TOKENS = 10  # every answer has exactly this many tokens (ignore_eos), so step 3 always exists
SEED = 1234
BASE: dict[str, Any] = {"messages": [("user", "Name three colours.")], "max_new_tokens": TOKENS, "ignore_eos": True}
GREEDY: dict[str, Any] = {**BASE, "temperature": 0}
SAMPLED: dict[str, Any] = {**BASE, "temperature": 1.0, "seed": SEED}


def copy_store(source: Path, target: Path) -> None:
    """A consistent copy of a live WAL-mode SQLite store (committed pages and the WAL's both)."""
    with closing(sqlite3.connect(source)) as live, closing(sqlite3.connect(target)) as copy:
        live.backup(copy)


def alter_record(db: Path, audit_id: str, change: Callable[[dict[str, Any]], None]) -> int:
    """Edit one request record of the store at ``db`` in place, past its append-only triggers: the body is
    the changed record's canonical JSON, compressed as the writer stores it; the columns and the hash stay.
    Returns the row's sequence number."""
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        seq, body = conn.execute("SELECT seq, body FROM audit_log WHERE audit_id = ? AND kind = 'request'",
                                 (audit_id,)).fetchone()
        record = json.loads(stored_body.record_json(body))
        change(record)
        conn.execute("DROP TRIGGER audit_log_no_update")
        conn.execute("UPDATE audit_log SET body = ? WHERE seq = ?",
                     (stored_body.compress(canonical(record)), seq))
        conn.executescript(SCHEMA)  # the triggers back, as the server would put them
    return int(seq)


def first_difference(left: list[int], right: list[int]) -> int | None:
    return next((step for step, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), None)


@dataclass(frozen=True)
class Tampered:
    """The originals (their responses and records), what was altered in the copy, and a server on the copy."""

    originals: dict[str, generation_pb2.GenerateResponse]  # greedy, greedy_again, sampled, sampled_again
    records: dict[str, dict[str, Any]]  # the same keys: each record as written, before any change
    altered_tokens: dict[str, tuple[int, str]]  # greedy / sampled -> the (id, text) put at STEP
    altered_seed: int  # the seed put into sampled_again
    altered_seed_tokens: list[int]  # what the sampled request gives under altered_seed
    seqs: list[int]  # the rows altered
    verified_before: Any  # verify_log of the copy before and after the changes
    verified_after: Any
    server: Any  # a BackgroundServer on the altered copy
    copy: Path


@pytest.fixture(scope="module")
def tampered(client: ProctorClient, audit_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tampered]:
    from proctor.app import BackgroundServer

    originals = {"greedy": client.generate(**GREEDY), "greedy_again": client.generate(**GREEDY),
                 "sampled": client.generate(**SAMPLED), "sampled_again": client.generate(**SAMPLED)}
    for kind in ("greedy", "sampled"):
        assert len(originals[kind].token_ids) == TOKENS
        assert originals[kind].token_ids == originals[f"{kind}_again"].token_ids  # the same request, the same tokens
    assert originals["sampled"].seed == SEED
    records = {kind: json.loads(client.audit_record(response.audit_id).record_json)
               for kind, response in originals.items()}

    # The seed to put in: the first after SEED under which the sampled request answers differently.
    altered_seed, altered_seed_tokens = SEED, list(originals["sampled"].token_ids)
    while altered_seed_tokens == list(originals["sampled"].token_ids):
        altered_seed += 1
        assert altered_seed < SEED + 5, "five seeds in a row drew the very same tokens: the request barely samples"
        altered_seed_tokens = list(client.generate(**{**SAMPLED, "seed": altered_seed}).token_ids)

    copy = tmp_path_factory.mktemp("replay-divergence") / "audit-copy.db"
    copy_store(audit_db, copy)
    verified_before = verify_log(SQLiteAuditStore(copy, readonly=True), processes=1)

    altered_tokens: dict[str, tuple[int, str]] = {}
    seqs: list[int] = []
    for kind in ("greedy", "sampled"):
        entry = records[kind]["tokens"][STEP]
        other = next(t for t in entry["top"] if t["id"] != entry["id"])  # a plausible token the model did not pick
        altered_tokens[kind] = (other["id"], other["text"])

        def swap(record: dict[str, Any], other: dict[str, Any] = other) -> None:
            record["tokens"][STEP].update(id=other["id"], text=other["text"])

        seqs.append(alter_record(copy, originals[kind].audit_id, swap))

    def reseed(seed: int) -> Callable[[dict[str, Any]], None]:
        def change(record: dict[str, Any]) -> None:
            record["request"]["sampling"]["seed"] = str(seed)  # a decimal string, as the writer records it

        return change

    seqs.append(alter_record(copy, originals["sampled_again"].audit_id, reseed(altered_seed)))
    seqs.append(alter_record(copy, originals["greedy_again"].audit_id, reseed(altered_seed)))
    verified_after = verify_log(SQLiteAuditStore(copy, readonly=True), processes=1)

    server = BackgroundServer(Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False,
                                             "audit_db": str(copy)}))
    try:
        server.start(timeout_s=300)
        yield Tampered(originals, records, altered_tokens, altered_seed, altered_seed_tokens, seqs,
                       verified_before, verified_after, server, copy)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def on_copy(tampered: Tampered) -> Iterator[ProctorClient]:
    with ProctorClient(tampered.server.address, timeout_s=120.0) as proctor:
        yield proctor


def test_the_altered_copy_no_longer_verifies(tampered: Tampered) -> None:
    assert tampered.verified_before.ok, tampered.verified_before  # the copy as taken is intact
    assert not tampered.verified_after.ok
    assert tampered.verified_after.first_bad_seq == min(tampered.seqs), tampered.verified_after


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_an_altered_token_is_reported_at_its_step_with_both_tokens(tampered: Tampered, on_copy: ProctorClient,
                                                                    kind: str) -> None:
    original = tampered.originals[kind]
    altered_id, altered_text = tampered.altered_tokens[kind]
    real_text = tampered.records[kind]["tokens"][STEP]["text"]
    result = on_copy.replay(original.audit_id)
    assert not result.exact_match, result.message
    assert result.first_divergent_step == STEP and result.steps_compared == STEP + 1, result.message
    assert (result.recorded_token_id, result.recorded_token_text) == (altered_id, altered_text)
    assert (result.replayed_token_id, result.replayed_token_text) == (original.token_ids[STEP], real_text)
    assert result.message == (f"diverged at step {STEP}: recorded {altered_id} {altered_text!r}, "
                              f"replayed {original.token_ids[STEP]} {real_text!r}")
    replay = json.loads(on_copy.audit_record(result.replay_audit_id).record_json)
    assert replay["replay_of"] == original.audit_id
    assert [t["id"] for t in replay["tokens"]] == list(original.token_ids)  # the model's own tokens again


def test_an_altered_seed_is_reported_where_its_draws_part(tampered: Tampered, on_copy: ProctorClient) -> None:
    original = list(tampered.originals["sampled_again"].token_ids)
    under_altered = tampered.altered_seed_tokens
    expected = first_difference(original, under_altered)
    assert expected is not None  # (the fixture chose a seed that answers differently)
    result = on_copy.replay(tampered.originals["sampled_again"].audit_id)
    assert not result.exact_match, result.message
    assert result.first_divergent_step == expected, (result.message, original, under_altered)
    assert result.recorded_token_id == original[expected]
    assert result.replayed_token_id == under_altered[expected]
    assert result.recorded_token_text == tampered.records["sampled_again"]["tokens"][expected]["text"]
    assert f"diverged at step {expected}: recorded {original[expected]} " in result.message
    replay = json.loads(on_copy.audit_record(result.replay_audit_id).record_json)
    assert replay["request"]["sampling"]["seed"] == str(tampered.altered_seed)  # the replay ran the altered seed
    assert [t["id"] for t in replay["tokens"]] == under_altered


def test_a_greedy_record_replays_exactly_whatever_its_seed_says(tampered: Tampered, on_copy: ProctorClient) -> None:
    original = tampered.originals["greedy_again"]
    result = on_copy.replay(original.audit_id)
    assert result.exact_match and result.first_divergent_step == -1, result.message
    assert result.steps_compared == TOKENS
    replay = json.loads(on_copy.audit_record(result.replay_audit_id).record_json)
    assert replay["request"]["sampling"]["seed"] == str(tampered.altered_seed)  # the seed was in the request
    assert [t["id"] for t in replay["tokens"]] == list(original.token_ids)


def test_the_replay_cli_names_the_divergent_step_and_both_tokens(tampered: Tampered) -> None:
    original = tampered.originals["greedy"]
    altered_id, altered_text = tampered.altered_tokens["greedy"]
    real_text = tampered.records["greedy"]["tokens"][STEP]["text"]
    env = {"PYTHONPATH": f"{REPO / 'service'}:{REPO / 'clients' / 'python' / 'src'}", "PATH": "/usr/bin:/bin"}
    replayed = subprocess.run([sys.executable, "-m", "proctor.cli", "audit", "replay", original.audit_id,
                               "--addr", tampered.server.address], env=env, text=True, capture_output=True,
                              timeout=300, cwd=REPO)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr  # 1: not an exact match
    lines = replayed.stdout.splitlines()
    assert lines[0] == (f"diverged at step {STEP}: recorded {altered_id} {altered_text!r}, "
                        f"replayed {original.token_ids[STEP]} {real_text!r}"), replayed.stdout
    assert lines[1].startswith(f"steps compared {STEP + 1}, finish recorded length / replayed length")
