"""An erasure reaches every copy (issue 54), on SQLite and PostgreSQL, with the real model and a real server under
``--audit-encryption subject``: a canary planted in every field of a subject's requests that can hold what a
person wrote (prompt, stop strings, ``must_include``, forbidden phrases, a schema's ``const``/``enum``/``default``/
``examples``, choices, a refused message's role, a contract's parties and facts) and in every field that quotes
them back (the finish detail, the schema validation's messages, a refusal's status message), a replay of one of
those records by another caller through ``proctor audit replay``; then ``proctor audit erase --subject``. After it,
no byte of the database, no export and no ``audit show`` holds any canary, while another subject's are intact."""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.reliability import free_port
from test_receipts_real import store_settings

from proctor_client import ProctorClient, ProctorError
from proctor_client.v1 import generation_pb2 as pb

pytestmark = pytest.mark.real_model
CANARY = "Canary" + secrets.token_hex(5)
SUBJECT = "customer-17"


def canary(field: str) -> str:
    return f"{CANARY}x{field}"


def planted(text: str) -> set[str]:
    return set(re.findall(re.escape(CANARY) + r"x([a-z]+)", text))


def plant(client: ProctorClient) -> list[str]:
    """The subject's calls, one canary per field; their audit ids."""
    ids = [client.generate(canary("prompt"), max_new_tokens=4, subject_id=SUBJECT, stop=[canary("stop")],
                           must_include=[canary("include")], forbidden=[canary("forbidden")]).audit_id]
    matched = client.generate("Answer.", choice=[f"Yes {canary('choice')} {canary('matched')} end"],
                              stop=[canary("matched")], subject_id=SUBJECT, max_new_tokens=40)
    assert canary("matched") not in matched.text and matched.finish_reason == pb.FINISH_REASON_STOP_STRING
    ids.append(matched.audit_id)
    schema = {"type": "object", "properties": {
        "k": {"enum": [canary("enum")], "default": canary("default"), "examples": [canary("examples")]},
        "v": {"type": "string", "const": canary("const"), "not": {"const": canary("const")}}},
        "required": ["k", "v"], "additionalProperties": False}
    invalid = client.generate("Fill it in.", json_schema=schema, subject_id=SUBJECT, max_new_tokens=60)
    ids.append(invalid.audit_id)
    with pytest.raises(ProctorError) as refused:
        client.generate(messages=[{"role": canary("role"), "content": "hi"}], subject_id=SUBJECT)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and canary("role") in refused.value.message
    parts: dict[str, Any] = {"parties": [f"{canary('party')} Inc:provider:Delaware", "Tailspin LLC:client"],
                             "required_clauses": ["5"], "subject_id": SUBJECT, "timeout_s": 300,
                             "forbidden_phrases": [canary("draftforbidden")]}
    with pytest.raises(ProctorError) as small:
        client.draft_contract("contract/service-agreement", max_new_tokens=10, **parts)
    minimum = int(re.search(r"ask for at least (\d+)", str(small.value)).group(1))  # type: ignore[union-attr]
    ids.append(client.draft_contract("contract/service-agreement", max_new_tokens=minimum + 12, **parts).audit_id)
    return ids


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_after_an_erasure_no_copy_of_the_subjects_content_is_left(kind: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from proctor.app import BackgroundServer
    from proctor.audit.setup import key_dir, open_store, signing_key_path
    from proctor.audit.store import Filters
    from proctor.audit.stored_body import record_json
    from proctor.cli import main
    from proctor.config import Settings

    settings = Settings.load({"port": 0, "host": "127.0.0.1", "warmup": False, **store_settings(kind, tmp_path),
                              "audit_encryption": "subject", "audit_key_dir": str(tmp_path / "keys"),
                              "metrics_port": free_port()}, environ={})
    flags = ["--db", settings.audit_db] if kind == "sqlite" else ["--dsn", settings.audit_dsn]
    keyed = [*flags, "--key-dir", str(key_dir(settings))]
    server = BackgroundServer(settings).start()
    try:
        with ProctorClient(server.address, timeout_s=300) as client:
            ids = plant(client)
            assert [cached(client, SUBJECT) for _ in range(2)][1] > 0  # the subject's long prompt, kept
            assert [cached(client, "someone-else") for _ in range(2)][1] > 0
            other = client.generate(f"Note for {canary('other')}.", max_new_tokens=4, subject_id="someone-else")
            assert main(["audit", "replay", ids[0], "--addr", server.address]) == 0  # an auditor's replay
            capsys.readouterr()
            before = exported(main, keyed, tmp_path / "before.jsonl")
            expected = {"prompt", "stop", "include", "forbidden", "choice", "matched", "enum", "default", "examples",
                        "const", "role", "party", "draftforbidden", "other"}
            assert planted(before) == expected  # every canary was there to be found (the test can fail)
            replays = [r for r in map(json.loads, before.splitlines()) if r["record"].get("replay_of") == ids[0]]
            assert len(replays) == 1 and replays[0]["record"]["request"]["subject_id"] == SUBJECT
            quoting = {field: planted(json.dumps(value)) for field, value in quoted_fields(before).items()}
            assert quoting == {"finish.detail": {"matched"}, "schema_validation.errors": {"const"},
                               "status.message": {"role", "party"}}, quoting  # a refused draft quotes its party

            erase = ["audit", "erase", "--subject", SUBJECT, "--reason", "GDPR request 17", "--operator", "dpo",
                     *keyed, "--signing-key", str(signing_key_path(settings))]
            assert main(erase) == 0
            said = capsys.readouterr().err
            assert "prefix cache" in said  # it says what becomes of the server's memory
            dropped_chunks(server, at_least=1)  # the server's watcher read the key store...
            assert cached(client, SUBJECT) == 0  # ...and the subject's prompt is no longer in its memory
            assert cached(client, "someone-else") > 0
            after = exported(main, keyed, tmp_path / "after.jsonl")
            assert planted(after) == {"other"}  # the other subject's record still opens
            assert json.loads(client.audit_record(other.audit_id).record_json)["output"]["text"] == other.text
            for audit_id in [*ids, replays[0]["record"]["audit_id"]]:
                assert main(["audit", "show", audit_id, *keyed]) == 0
                shown = capsys.readouterr().out
                assert "erased" in shown and planted(shown) == set(), audit_id
                assert planted(client.audit_record(audit_id).record_json) == set()
    finally:
        server.stop()
    store = open_store(settings, readonly=True)
    stored = b"".join(record_json(row.body) for row in store.iterate(Filters(include_checkpoints=True)))
    assert stored.count(b'"sealed":') >= 8 and planted(stored.decode()) == set()  # every row, inflated
    if kind == "sqlite":
        files = [p for p in Path(settings.audit_db).parent.iterdir() if p.name.startswith(Path(settings.audit_db).name)]
        assert not any(CANARY.encode() in p.read_bytes() for p in files)


def cached(client: ProctorClient, subject: str) -> int:
    """How many prompt tokens of the subject's long prompt came from the prefix cache."""
    prompt = f"The file of {subject}: " + "the clause binds both parties. " * 60
    return int(client.generate(prompt, max_new_tokens=1, subject_id=subject).usage.cached_prompt_tokens)


def dropped_chunks(server: Any, at_least: int, timeout_s: float = 15.0) -> float:
    """The server's count of prefix-cache chunks dropped for erasure, once it reaches ``at_least``."""
    port = server.running.observability.metrics.port
    end = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            found = re.search(r"^proctor:prefix_cache_erased_chunks_total (\S+)$", response.read().decode(), re.M)
        value = float(found.group(1)) if found else 0.0
        if value >= at_least or time.monotonic() > end:
            assert value >= at_least, f"{value} chunks dropped after {timeout_s} s"
            return value
        time.sleep(0.2)


def exported(main: Any, flags: list[str], out: Path) -> str:
    """Every request record as ``proctor audit export`` writes it (sealed records opened with the key store)."""
    assert main(["audit", "export", *flags, "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def quoted_fields(export: str) -> dict[str, Any]:
    """The values of the fields outside the content sections that quote content, over every exported record."""
    found: dict[str, list[Any]] = {"finish.detail": [], "schema_validation.errors": [], "status.message": []}
    for line in export.splitlines():
        record = json.loads(line)["record"]
        for path in found:
            section, name = path.split(".")
            value = (record.get(section) or {}).get(name)
            if value:
                found[path].append(value)
    return found
