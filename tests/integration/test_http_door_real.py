"""The doors against a real server (real model, a callers file, real clients: httpx, http.client, ``openai`` and
``ProctorClient``) — issue 54, parts 5 and 6.

- The HTTP door admits before it works: an unknown caller's body is never parsed (``{not json`` is 401, not a
  400 describing the parse error) nor read (a request that declares 15 MB and sends none of it is answered 401 at
  once, and its connection closed), and an admitted caller's body is read against its own ``max_request_bytes``.
- Metric labels are the route's template or ``other``: an unauthenticated flood of random paths leaves the
  ``/metrics`` series count as it was.
- A failing audit store reaches neither door's client: both get the fixed message and an error id, which the
  server log shows beside the store's own words.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import secrets
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers.reliability import free_port
from helpers.requirements import require_module
from helpers.tlog_spec import (
    SpecWitness,
    fetch,
    log_signature_ok,
    parse_checkpoint,
    read_tree,
    serving,
    split_note,
    tile_url,
)

from proctor.audit.chain import load_or_create_signing_key, log_signer
from proctor.audit.store import AuditStore, Build, Row
from proctor.config import Settings
from proctor_client import ProctorClient, ProctorError

openai = require_module("openai", "the official openai client (pip install -e '.[dev]')")
httpx = require_module("httpx", "httpx (pip install -e '.[dev]')")

pytestmark = pytest.mark.real_model
WRITER, READER, SMALL, CAPPED = (f"door-{name}-{secrets.token_hex(6)}"
                                 for name in ("writer", "reader", "small", "capped"))
SMALL_LIMIT = 2048
TOKEN_CAP = 32
AT_ONCE_S = 5.0  # an answer from the headers alone: far less than a body's wait (the client sends none)
SECRET = f"host=audit-db.internal user=proctor_owner password={secrets.token_hex(6)} INSERT INTO audit_log"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _serve(tmp: Path, **extra: Any) -> Any:
    from proctor.app import BackgroundServer

    callers = tmp / "callers.yaml"
    callers.write_text(f"""callers:
  - {{name: writer, token_sha256: {_sha(WRITER)}, roles: [generate]}}
  - {{name: reader, token_sha256: {_sha(READER)}, roles: [audit:read]}}
  - {{name: small, token_sha256: {_sha(SMALL)}, roles: [generate], limits: {{max_request_bytes: {SMALL_LIMIT}}}}}
  - {{name: capped, token_sha256: {_sha(CAPPED)}, roles: [generate], limits: {{max_new_tokens: {TOKEN_CAP}}}}}
""")
    settings = Settings.load({"port": 0, "host": "127.0.0.1", "http_port": free_port(), "warmup": False,
                              "metrics_port": free_port(), "callers_file": str(callers),
                              "audit_db": str(tmp / "audit.db"), **extra})
    return BackgroundServer(settings).start(timeout_s=300)


@pytest.fixture(scope="module")
def witness() -> Iterator[tuple[SpecWitness, str]]:
    """A tlog-witness written from the spec (helpers/tlog_spec.py), knowing no log until the server's key is read."""
    spec = SpecWitness("witness.example/door", Ed25519PrivateKey.generate(), {})
    with serving(spec) as url:
        yield spec, url


@pytest.fixture(scope="module")
def door(model_dir: Path, tmp_path_factory: pytest.TempPathFactory, witness: tuple[SpecWitness, str]) -> Iterator[Any]:
    directory = tmp_path_factory.mktemp("http-door")
    key = load_or_create_signing_key(directory / "audit.db.key")  # the server's log key, made first to tell the witness
    signer = log_signer(key)
    witness[0].logs[signer.name] = key.public_key()
    server = _serve(directory, audit_witness_urls=witness[1], audit_witnesses=witness[0].vkey())
    yield server
    server.stop()


def _base(server: Any) -> str:
    return f"http://127.0.0.1:{server.settings.http_port}"


def _series(server: Any) -> list[str]:
    """Every sample line /metrics serves (one per series)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.settings.metrics_port}/metrics", timeout=10) as got:
        return [line for line in got.read().decode().splitlines() if line and not line.startswith("#")]


def test_an_unauthenticated_flood_of_random_paths_leaves_the_metric_series_unchanged(door: Any) -> None:
    base = _base(door)
    with httpx.Client(base_url=base, timeout=30) as client:
        def flood(tag: str) -> None:
            assert client.get(f"/v1/models/{tag}").status_code == 401
            assert client.get(f"/v1/models/{tag}", headers={"authorization": "Bearer nobody"}).status_code == 401
            assert client.get(f"/{tag}/v1/chat/completions").status_code == 404
            assert client.post(f"/v1/chat/completions/{tag}", content=b"{}").status_code in (404, 307)
            assert client.delete(f"/v1/models/{tag}").status_code == 405

        flood("warm-up")  # each kind's first answer may add its (closed) series
        before = _series(door)
        for _ in range(50):
            flood(secrets.token_hex(8))
    after = _series(door)
    # The series a request can add are those labelled by its method; others (a constraint engine's, whose first
    # compile may land during the flood) are not the flood's.
    by_method = [line for line in after if 'method="' in line]
    assert len(by_method) == len([line for line in before if 'method="' in line]), \
        sorted(set(by_method) - set(before))[:10]
    assert not any("warm-up" in line for line in after)
    assert any('method="/v1/models/{model}"' in line and 'code="UNAUTHENTICATED"' in line for line in after)
    assert any('method="other"' in line for line in after)


def test_an_unauthenticated_bad_body_is_401_and_an_admitted_one_400(door: Any) -> None:
    url = f"{_base(door)}/v1/chat/completions"
    for headers in ({}, {"authorization": "Bearer nobody"}):
        refused = httpx.post(url, content=b"{not json", headers=headers, timeout=30)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["type"] == "authentication_error" and "JSON" not in refused.text
    denied = httpx.post(url, content=b"{not json", headers={"authorization": f"Bearer {READER}"}, timeout=30)
    assert denied.status_code == 403, denied.text
    parsed = httpx.post(url, content=b"{not json", headers={"authorization": f"Bearer {WRITER}"}, timeout=30)
    assert parsed.status_code == 400 and parsed.json()["error"]["param"] == "body", parsed.text


def test_the_audit_log_is_a_tiled_log_for_audit_readers(door: Any, witness: tuple[SpecWitness, str]) -> None:
    """/tlog/ on the HTTP port (c2sp.org/tlog-tiles), read by the tests' own client: the checkpoint signed by the log's
    key and cosigned by the spec's witness (--audit-witness-url), a tree whose tiles rebuild its root, for callers with
    audit:read only (no token 401, a generate caller 403), and a flood of tile paths adds no metric series (the label
    is the route's template)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    with ProctorClient(door.address, timeout_s=120, token=WRITER) as writer:
        for number in range(3):
            writer.generate(f"Tile {number}", max_new_tokens=2)
    with ProctorClient(door.address, timeout_s=60, token=READER) as reader_client:
        made = reader_client.create_checkpoint()
    base, reader = f"{_base(door)}/tlog", {"authorization": f"Bearer {READER}"}
    assert fetch(base + "/checkpoint")[0] == 401
    assert fetch(base + "/checkpoint", {"authorization": f"Bearer {WRITER}"})[0] == 403
    deadline = time.monotonic() + 30  # the server posts each new checkpoint to the witness within a second or so
    while True:
        status, body, headers = fetch(base + "/checkpoint", reader)
        if f"\u2014 {witness[0].name} ".encode() in body or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200 and headers["content-type"] == "text/plain; charset=utf-8", (status, body)
    assert f"\u2014 {witness[0].name} ".encode() in body, body  # the witness's cosignature, kept with it
    assert headers["cache-control"] == "private, max-age=2"
    note = body.decode()
    origin, size, root = parse_checkpoint(split_note(note)[0])
    assert size >= made.tree_size >= 3 and origin == made.origin
    key = load_pem_private_key(Path(f"{door.settings.audit_db}.key").read_bytes(), None)
    assert log_signature_ok(note, origin, key.public_key())  # type: ignore[arg-type]
    assert read_tree(base, size, reader)[0] == root
    assert fetch(tile_url(base, 0, 0, size), reader)[0] == 200
    assert fetch(tile_url(base, 0, 0, 255), {"authorization": f"Bearer {WRITER}"})[0] == 403
    before = [line for line in _series(door) if "tlog" in line]
    for width in range(1, 40):
        assert fetch(tile_url(base, 0, 7, width), reader)[0] == 404  # past the log: not there
    after = [line for line in _series(door) if "tlog" in line]
    assert len(after) == len(before) and any('method="/tlog/tile/{path}"' in line for line in after), after
    assert any(line.startswith("proctor:audit_witness_answers_total") and 'outcome="cosigned"' in line
               for line in _series(door))
    assert witness[0].state[origin][0] >= made.tree_size


@pytest.mark.parametrize("declared", [15_000_000, 40_000_000], ids=["15MB", "over-the-server-limit"])
def test_an_unauthenticated_large_body_is_refused_before_it_is_read(door: Any, declared: int) -> None:
    """Headers that declare a large body, and no body: only an answer from the headers can come back (a server
    that read first would wait for bytes that never come). The connection then closes: the body is never read."""
    connection = http.client.HTTPConnection("127.0.0.1", door.settings.http_port, timeout=AT_ONCE_S)
    try:
        started = time.monotonic()
        connection.putrequest("POST", "/v1/chat/completions")
        connection.putheader("content-type", "application/json")
        connection.putheader("content-length", str(declared))
        connection.endheaders()
        answer = connection.getresponse()
        body = answer.read()
        seconds = time.monotonic() - started
        assert answer.status == 401, (answer.status, body)
        assert seconds < AT_ONCE_S and answer.getheader("connection") == "close"
        sock = connection.sock
        assert sock is None or sock.recv(1) == b""  # closed by the server, nothing more to say
    finally:
        connection.close()


def test_an_admitted_callers_body_is_read_against_its_own_limit(door: Any) -> None:
    client = openai.OpenAI(base_url=f"{_base(door)}/v1", api_key=SMALL, max_retries=0, timeout=60)
    model = openai.OpenAI(base_url=f"{_base(door)}/v1", api_key=WRITER, max_retries=0).models.list().data[0].id
    with pytest.raises(openai.APIStatusError) as too_big:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x" * SMALL_LIMIT}],
                                       max_tokens=2)
    assert too_big.value.status_code == 413 and f"the limit is {SMALL_LIMIT}" in too_big.value.body["message"]
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert answer.choices[0].message.content is not None
    writer = ProctorClient(door.address, timeout_s=60, retries=0, token=SMALL)
    with writer, pytest.raises(ProctorError) as grpc_too_big:  # the same limit on the gRPC door
        writer.generate("x" * SMALL_LIMIT, max_new_tokens=2)
    assert grpc_too_big.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and "max_request_bytes" in \
        grpc_too_big.value.message


def test_a_minimum_above_the_callers_token_cap_is_refused_on_both_doors(door: Any) -> None:
    """Issue 55's defect: the minimum was checked against the server's default (256), the caller's cap (32) then
    lowered the maximum, and the call was served 32 tokens, finish LENGTH. One output budget refuses it, naming
    the field, on both doors; a minimum within the cap is served at least that many tokens."""
    with ProctorClient(door.address, timeout_s=120, retries=0, token=CAPPED) as client:
        with pytest.raises(ProctorError) as refused:
            client.generate("Count to one hundred:", min_new_tokens=TOKEN_CAP + 8)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert [field for field, _ in refused.value.field_violations] == ["stopping.min_new_tokens"]
        assert f"({TOKEN_CAP}, caller 'capped''s cap)" in refused.value.field_violations[0][1]
        served = client.generate("Say hi.", min_new_tokens=TOKEN_CAP - 2, temperature=0)
        assert TOKEN_CAP - 2 <= served.usage.completion_tokens <= TOKEN_CAP
    http = openai.OpenAI(base_url=f"{_base(door)}/v1", api_key=CAPPED, max_retries=0, timeout=120)
    model = http.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as bad:
        http.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to one hundred:"}],
                                     extra_body={"min_new_tokens": TOKEN_CAP + 8})
    assert bad.value.body["param"] == "min_new_tokens" and "caller 'capped''s cap" in bad.value.body["message"]


class FailingStore:
    """The server's own store, except that writes fail with the text a database error carries (reads go through,
    so the writer's probe finds the store again between the calls)."""

    def __init__(self, store: AuditStore) -> None:
        self._store = store

    def append_chained(self, build: Build) -> list[Row]:
        raise RuntimeError(SECRET)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _store_back(sink: Any, within_s: float = 10.0) -> None:
    end = time.monotonic() + within_s
    while not sink.store_healthy:
        assert time.monotonic() < end, "the audit store never came back"
        time.sleep(0.05)


def _failed_over_http(server: Any, sink: Any, model: str) -> Any:
    """An HTTP call admitted while the store is back for reads, whose record then fails to be written. The writer
    may still be retrying the gRPC call's record, which turns the store unhealthy again: a call admitted in that
    moment is refused (503, the store is not taking records), rightly; it is asked again."""
    client = openai.OpenAI(base_url=f"{_base(server)}/v1", api_key=WRITER, max_retries=0, timeout=60)
    for _ in range(5):
        _store_back(sink)
        with pytest.raises(openai.InternalServerError) as over_http:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        if over_http.value.status_code != 503:
            return over_http
    raise AssertionError("every call was refused while the audit store was unhealthy")


def test_a_failing_audit_store_reaches_the_clients_only_as_an_error_id(
        model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = _serve(tmp_path)
    sink = server.running.audit_sink
    try:
        model = openai.OpenAI(base_url=f"{_base(server)}/v1", api_key=WRITER, max_retries=0).models.list().data[0].id
        real, sink.store = sink.store, FailingStore(sink.store)
        with caplog.at_level(logging.ERROR, logger="proctor"):
            with ProctorClient(server.address, timeout_s=60, retries=0, token=WRITER) as client, \
                    pytest.raises(ProctorError) as over_grpc:
                client.generate("Hello", max_new_tokens=2)
            over_http = _failed_over_http(server, sink, model)
        sink.store = real
        logged = "\n".join(record.getMessage() for record in caplog.records)
    finally:
        server.stop()
    assert over_grpc.value.code is grpc.StatusCode.INTERNAL
    http_error = over_http.value.body
    error_ids = []
    for message in (over_grpc.value.message, http_error["message"]):
        assert SECRET not in message and "INSERT" not in message and "audit-db" not in message, message
        assert message.startswith("internal error (error id ") and message.endswith("): see the server log")
        error_ids.append(message.removeprefix("internal error (error id ").split(")")[0])
    assert over_http.value.response.headers["x-proctor-error-id"] == error_ids[1]
    assert error_ids[0] != error_ids[1]
    for error_id in error_ids:  # each id leads to the line that holds the store's own words
        assert any(error_id in line and SECRET in line for line in logged.splitlines()), (error_id, logged[-2000:])
