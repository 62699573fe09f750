"""c2sp.org/tlog-witness in both roles, against the tests' own implementation of the spec (helpers/tlog_spec.py):

- as a witness (``proctor audit witness --listen``: audit/witness_server.py over HTTP), asked by the spec's client
  with a real Proctor log and with a foreign C2SP log made by the spec's code alone: every status the spec names,
  the state written before the answer, and two racing requests that cannot roll it back;
- as a log (``--audit-witness-url``: audit/witness_feed.py), posting a real store's checkpoints to the spec's
  witness: cosignatures kept with the checkpoint and in its proofs, the 409 resync, and each refusal counted;
- the quorum (``--audit-witness-quorum``): no proof in a checkpoint fewer witnesses cosigned.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers.audit_log import grow
from helpers.reliability import free_port
from helpers.tlog_spec import (
    EMPTY,
    SpecWitness,
    consistent,
    cosigned_at,
    mth,
    parse_checkpoint,
    post_checkpoint,
    serving,
    sign_checkpoint,
    split_note,
    vkey,
)
from prometheus_client import CollectorRegistry

from proctor.audit.chain import load_or_create_signing_key, log_signer
from proctor.audit.proofs import ProofUnavailable, consistency, inclusion, signed_checkpoint
from proctor.audit.sqlite_store import SQLiteAuditStore
from proctor.audit.witness import witness_signer
from proctor.audit.witness_feed import WitnessFeed
from proctor.audit.witness_http import witness_app
from proctor.audit.witness_server import WitnessService
from proctor_client.tlog.note import Verifier, parse_vkey
from proctor_client.tlog.proof import verify_proof


@pytest.fixture
def log(tmp_path: Path) -> dict[str, Any]:
    store = SQLiteAuditStore(tmp_path / "log.db")
    grow(store, tmp_path / "log.key", "a", 7, every=5)
    signer = log_signer(load_or_create_signing_key(tmp_path / "log.key"))
    return {"store": store, "key": tmp_path / "log.key", "origin": signer.name, "public": signer.key.public_key(),
            "vkey": signer.verifier.vkey()}


class ServedWitness:
    """The project's witness (WitnessService behind witness_app) on loopback, its state under ``state``."""

    def __init__(self, logs: dict[str, Verifier], state: Path) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.signer = witness_signer(self.key, "witness.example/proctor")
        self.registry = CollectorRegistry()
        config = uvicorn.Config(witness_app(WitnessService(logs, self.signer, state), self.registry),
                                host="127.0.0.1", port=free_port(), log_level="warning")
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{config.port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServedWitness:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def count(self, outcome: str) -> float:
        return self.registry.get_sample_value("proctor_witness_requests_total", {"outcome": outcome}) or 0.0


def latest(store: SQLiteAuditStore) -> tuple[int, str]:
    checkpoint, note = signed_checkpoint(store)
    return checkpoint.size, note


def test_the_witness_cosigns_a_growing_proctor_log_and_answers_each_refusal_as_the_spec_says(
        log: dict[str, Any], tmp_path: Path) -> None:
    store, origin = log["store"], log["origin"]
    with ServedWitness({origin: parse_vkey(log["vkey"])}, tmp_path / "state") as witness:
        size, note = latest(store)
        status, text, _ = post_checkpoint(witness.url, 0, [], note)
        assert status == 200 and text.startswith("\u2014 witness.example/proctor "), text
        when = cosigned_at(split_note(note)[0], text, "witness.example/proctor", witness.key.public_key())
        assert when is not None and abs(when - time.time()) < 60
        assert parse_checkpoint((tmp_path / "state" / f"{origin.replace('/', '_')}.checkpoint").read_text()
                                )[1] == size  # on disk before the answer
        status, text, headers = post_checkpoint(witness.url, 0, [], note)
        assert (status, text) == (409, f"{size}\n") and headers["content-type"] == "text/x.tlog.size"
        grow(store, log["key"], "b", 6, every=5)
        new_size, new_note = latest(store)
        proof = consistency(store, size, new_size)[0]
        assert post_checkpoint(witness.url, size, proof[:-1], new_note)[0] == 422  # a proof that does not verify
        assert post_checkpoint(witness.url, size, proof, new_note)[0] == 200
        assert post_checkpoint(witness.url, new_size, [], new_note)[0] == 200  # the same checkpoint again
        text_only = split_note(new_note)[0]
        other_root = base64.b64encode(b"\x07" * 32).decode()
        forged_root = sign_checkpoint(text_only.replace(text_only.split("\n")[2], other_root), origin,
                                      Ed25519PrivateKey.generate())
        assert post_checkpoint(witness.url, new_size, [], forged_root)[0] == 403  # not the log's key
        assert post_checkpoint(witness.url, new_size, [], text_only + "\n")[0] == 403  # unsigned
        broken = new_note[:-10] + ("A" if new_note[-10] != "A" else "B") + new_note[-9:]
        assert post_checkpoint(witness.url, new_size, [], broken)[0] == 403  # the log's line does not verify
        assert post_checkpoint(witness.url, new_size + 1, [], new_note)[0] == 400  # old past the checkpoint
        assert post_checkpoint(witness.url, 0, [b"\x00" * 32] * 64, new_note)[0] == 400  # over 63 lines
        for malformed in (f"old 0{new_size}\n\n{new_note}", f"old {new_size}\n{new_note}", "\n\n", "old x\n\n"):
            assert _raw_post(witness.url, malformed.encode())[0] == 400
        stranger = Ed25519PrivateKey.generate()
        foreign = sign_checkpoint(f"other.example/log\n1\n{base64.b64encode(hashlib.sha256(b'x').digest()).decode()}\n",
                                  "other.example/log", stranger)
        assert post_checkpoint(witness.url, 0, [], foreign)[0] == 404
        assert witness.count("cosigned") == 3 and witness.count("conflict") == 1
        assert witness.count("inconsistent") == 1 and witness.registry.get_sample_value(
            "proctor_witness_inconsistent") == 1


def test_the_witness_serves_a_foreign_c2sp_log_and_refuses_a_fork_of_it(tmp_path: Path) -> None:
    """A log made by the spec's code alone (its own key, its own MTH): size 0 with the empty root, then growth with
    RFC 9162 proofs computed apart, then a second root for a size it cosigned (422)."""
    key, origin = Ed25519PrivateKey.generate(), "foreign.example/log"
    leaves = [hashlib.sha256(b"\x00" + bytes([i])).digest() for i in range(9)]

    def checkpoint(size: int, root: bytes | None = None) -> str:
        digest = mth(leaves[:size]) if root is None else root
        return sign_checkpoint(f"{origin}\n{size}\n{base64.b64encode(digest).decode()}\n", origin, key)

    with ServedWitness({origin: parse_vkey(vkey(origin, 0x01, key.public_key()))}, tmp_path / "state") as witness:
        assert post_checkpoint(witness.url, 0, [], checkpoint(0, b"\x01" * 32))[0] == 422  # size 0: the empty root
        assert post_checkpoint(witness.url, 0, [], checkpoint(0, EMPTY))[0] == 200
        assert post_checkpoint(witness.url, 0, [leaves[0]], checkpoint(4))[0] == 422  # a proof from size 0
        assert post_checkpoint(witness.url, 0, [], checkpoint(4))[0] == 200
        # PROOF(4, D[7]) by RFC 9162 §2.1.4.1: SUBPROOF(4, D[0:4], true) is empty, then MTH(D[4:7])
        proof = [mth(leaves[4:7])]
        assert consistent(4, 7, proof, mth(leaves[:4]), mth(leaves[:7]))  # the spec's own check agrees
        assert post_checkpoint(witness.url, 4, [mth(leaves[4:6]), leaves[6]], checkpoint(7))[0] == 422
        assert post_checkpoint(witness.url, 4, proof, checkpoint(7))[0] == 200
        assert post_checkpoint(witness.url, 7, [], checkpoint(7, b"\x02" * 32))[0] == 422  # a fork at 7
        assert witness.count("inconsistent") == 4 and witness.count("cosigned") == 3


def test_two_racing_requests_cannot_roll_the_witness_back(log: dict[str, Any], tmp_path: Path) -> None:
    store, origin = log["store"], log["origin"]
    service = WitnessService({origin: parse_vkey(log["vkey"])}, witness_signer(Ed25519PrivateKey.generate()),
                             tmp_path / "state")
    size, note = latest(store)
    assert service.add_checkpoint(f"old 0\n\n{note}".encode()).status == 200
    grow(store, log["key"], "c", 5, every=5)
    middle, middle_note = latest(store)
    grow(store, log["key"], "d", 5, every=5)
    top, top_note = latest(store)
    bodies = [_body(size, consistency(store, size, target)[0], text) for target, text in
              ((middle, middle_note), (top, top_note))] * 8
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(service.add_checkpoint, bodies))
    assert sorted(answer.status for answer in answers).count(200) == 1, [a.status for a in answers]
    winner = bodies[[a.status for a in answers].index(200)]
    stored = parse_checkpoint((tmp_path / "state" / f"{origin.replace('/', '_')}.checkpoint").read_text())[1]
    assert stored == (middle if winner == bodies[0] else top)
    assert all(a.text == f"{stored}\n" for a in answers if a.status == 409)


def test_the_log_posts_its_checkpoints_and_keeps_the_cosignatures(log: dict[str, Any]) -> None:
    store, origin = log["store"], log["origin"]
    witness = SpecWitness("witness.example/spec", Ed25519PrivateKey.generate(), {origin: log["public"]})
    answers: list[tuple[str, str]] = []
    with serving(witness) as url:
        feed = WitnessFeed(store, (url,), (witness.vkey(),), _Recorder(answers))
        with pytest.raises(ProofUnavailable, match="1 witness cosignatures"):
            inclusion(store, "a-1", quorum=1, witnesses=(witness.vkey(),))
        feed.run_once()
        size, note = latest(store)
        assert witness.state[origin][0] == size and answers == [(url, "cosigned")]
        assert f"\u2014 {witness.name} " in note  # the checkpoint now carries it
        proof = inclusion(store, "a-1", quorum=1, witnesses=(witness.vkey(),))
        assert verify_proof(proof.render(), log["vkey"], [witness.vkey()]).ok
        feed.run_once()
        assert len(witness.requests) == 1  # nothing new: nothing posted
        grow(store, log["key"], "b", 6, every=5)
        feed.run_once()  # from the size it cosigned, with the consistency proof the spec's witness checks
        assert witness.requests[-1].startswith(f"old {size}\n") and answers[-1] == (url, "cosigned")
        restarted = WitnessFeed(store, (url,), (witness.vkey(),), _Recorder(answers))
        grow(store, log["key"], "c", 6, every=5)
        restarted.run_once()  # a restarted log starts from 0: the 409 names the size, and it resyncs at once
        assert [outcome for _, outcome in answers[-2:]] == ["conflict", "cosigned"]
        assert witness.state[origin][0] == latest(store)[0]
        with pytest.raises(ProofUnavailable, match="2 witness cosignatures"):
            inclusion(store, "a-1", quorum=2, witnesses=(witness.vkey(), _stranger_vkey()))


@pytest.mark.parametrize(("setup", "outcome"), [("fork", "inconsistent"), ("key", "forbidden"),
                                                ("origin", "unknown-log"), ("stranger", "unverified")])
def test_each_refusal_is_counted_and_nothing_kept(log: dict[str, Any], setup: str, outcome: str) -> None:
    store, origin = log["store"], log["origin"]
    logs = {origin: log["public"]} if setup != "origin" else {}
    if setup == "key":
        logs = {origin: Ed25519PrivateKey.generate().public_key()}
    witness = SpecWitness("witness.example/spec", Ed25519PrivateKey.generate(), logs)
    size, _ = latest(store)
    if setup == "fork":  # the witness cosigned another root for this size: this log is not consistent with it
        witness.state[origin] = (size - 1, b"\x03" * 32)
    allowed = witness.vkey() if setup != "stranger" else _stranger_vkey()
    answers: list[tuple[str, str]] = []
    with serving(witness) as url:
        feed = WitnessFeed(store, (url,), (allowed,), _Recorder(answers))
        if setup == "fork":
            feed._witnesses[0].size = size - 1  # as if it had cosigned that size before
        feed.run_once()
        feed.run_once()  # within the pause: not asked again
    assert answers == [(url, outcome)]
    assert store.cosignatures(size) == []


def test_a_witness_that_does_not_answer_is_retried_after_a_pause(log: dict[str, Any]) -> None:
    now = [100.0]
    answers: list[tuple[str, str]] = []
    feed = WitnessFeed(log["store"], (f"http://127.0.0.1:{free_port()}",), (_stranger_vkey(),), _Recorder(answers),
                       timeout_s=2, clock=lambda: now[0])
    feed.run_once()
    feed.run_once()
    now[0] += 1.5
    feed.run_once()
    assert [outcome for _, outcome in answers] == ["unreachable", "unreachable"]


def test_the_witness_command_serves_the_protocol(log: dict[str, Any], tmp_path: Path) -> None:
    """``proctor audit witness --listen``: the command as an operator starts it, asked by the spec's client."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "proctor.cli", "audit", "witness", "--listen", str(port),
                                "--log-key", log["vkey"], "--key", str(tmp_path / "w.key"), "--state",
                                str(tmp_path / "state")], stderr=subprocess.PIPE, text=True)
    try:
        url, deadline, answer = f"http://127.0.0.1:{port}", time.monotonic() + 60, (0, "", {})
        _, note = latest(log["store"])
        while time.monotonic() < deadline:
            try:
                answer = post_checkpoint(url, 0, [], note)
                break
            except OSError:
                time.sleep(0.2)
        assert answer[0] == 200 and answer[1].startswith("\u2014 proctor.witness/"), answer
    finally:
        process.terminate()
        process.wait(10)


class _Recorder:
    def __init__(self, answers: list[tuple[str, str]]) -> None:
        self.answers = answers

    def witness_answer(self, witness: str, outcome: str) -> None:
        self.answers.append((witness, outcome))

    def witness_cosigned(self, witness: str, size: int, at_s: float) -> None:
        assert size > 0 and at_s > 0


def _stranger_vkey() -> str:
    return vkey("stranger.example/w", 0x04, Ed25519PrivateKey.generate().public_key())


def _body(old: int, proof: list[bytes], note: str) -> bytes:
    return (f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof) + "\n" + note).encode()


def _raw_post(url: str, body: bytes) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/add-checkpoint", data=body, method="POST"),
                                    timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
