"""The callers file, roles, per-caller limits and exposure rules (api/callers.py, caller_limits.py, security.py)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from proctor.api import callers as callers_module
from proctor.api.admission import identify
from proctor.api.call_info import CallInfo
from proctor.api.caller_limits import CallerLimiter, output_limits
from proctor.api.callers import Caller, CallerBook, CallerLimits, CallersFileError, load_callers, role_for
from proctor.api.security import exposure_problem
from proctor.api.tls import peer_certificate
from proctor.config import Settings
from proctor.domain import GenerationRequest, RequestValidationError, StoppingParams, Unauthenticated
from proctor.domain.output_budget import budgeted
from tests.helpers.certs import CertificateAuthority


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


YAML = f"""
callers:
  - name: writer
    token_sha256: {sha("writer-token")}
    roles: [generate]
    limits: {{requests_per_second: 2, burst: 3, concurrent_streams: 1, max_new_tokens: 64}}
  - name: auditor
    tls_subject: "CN=auditor,O=Proctor Tests"
    roles: [audit:read]
  - name: ops
    tls_san: ops.internal
    roles: [admin]
"""

TOML = f"""
[[callers]]
name = "writer"
token_sha256 = "{sha("writer-token")}"
roles = ["generate"]
limits = {{ requests_per_second = 2, burst = 3, concurrent_streams = 1, max_new_tokens = 64 }}
"""


def test_yaml_and_toml_files_give_the_same_caller(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(YAML)
    (tmp_path / "c.toml").write_text(TOML)
    from_yaml, from_toml = load_callers(tmp_path / "c.yaml"), load_callers(tmp_path / "c.toml")
    assert from_yaml.by_token[sha("writer-token")] == from_toml.by_token[sha("writer-token")]
    writer = from_yaml.by_token[sha("writer-token")]
    assert writer.limits == CallerLimits(2.0, 3, 1, 64) and writer.roles == {"generate"}
    assert from_yaml.by_subject["CN=auditor,O=Proctor Tests"].name == "auditor"
    assert from_yaml.by_san["ops.internal"].may("audit:replay")  # admin holds every role
    assert len(from_yaml) == 3


def test_prompt_cache_is_the_entry_s_or_left_to_the_server(tmp_path: Path) -> None:
    path = tmp_path / "callers.yaml"
    path.write_text("callers:\n  - {name: a, tls_san: a, roles: [generate], prompt_cache: false}\n"
                    "  - {name: b, tls_san: b, roles: [generate], prompt_cache: true}\n"
                    "  - {name: c, tls_san: c, roles: [generate]}\n")
    callers = load_callers(path)
    assert [callers.by_san[name].prompt_cache for name in "abc"] == [False, True, None]


@pytest.mark.parametrize(("entry", "problem"), [
    ("- {name: a, token: abc, roles: [generate]}", "never the token"),
    ("- {name: a, token_sha256: abc, roles: [generate]}", "64 hex digits"),
    ("- {name: a, roles: [generate]}", "needs 'token_sha256'"),
    ("- {name: a, tls_san: x, roles: [root]}", "unknown roles ['root']"),
    ("- {name: a, tls_san: x, roles: []}", "non-empty list"),
    ("- {name: a, tls_san: x, roles: [generate], limits: {burst: 0}}", "limits.burst must be a number above 0"),
    ("- {name: a, tls_san: x, roles: [generate], limits: {burst: 1.5}}", "whole number"),
    ("- {name: a, tls_san: x, roles: [generate], limits: {rate: 1}}", "unknown limits"),
    ("- {name: a, tls_san: x, roles: [generate], prompt_cache: sometimes}", "'prompt_cache' must be true or false"),
    ("- {name: a, tls_san: x, roles: [generate]}\n  - {name: a, tls_san: y, roles: [generate]}", "appears twice"),
    ("- {name: a, tls_san: x, roles: [generate]}\n  - {name: b, tls_san: x, roles: [generate]}", "shares"),
])
def test_a_bad_entry_is_named_with_its_problem(tmp_path: Path, entry: str, problem: str) -> None:
    path = tmp_path / "callers.yaml"
    path.write_text(f"callers:\n  {entry}\n")
    with pytest.raises(CallersFileError, match="callers\\[") as err:
        load_callers(path)
    assert problem in str(err.value)


def test_an_unparsable_or_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "callers.toml"
    path.write_text("[[callers]\nname=")
    with pytest.raises(CallersFileError, match="does not parse"):
        load_callers(path)
    path.write_text("")
    with pytest.raises(CallersFileError, match="non-empty list"):
        load_callers(path)


def test_the_book_rereads_a_changed_file_and_keeps_the_old_callers_on_a_broken_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(callers_module, "RELOAD_CHECK_S", 0.0)
    path = tmp_path / "callers.yaml"
    path.write_text(YAML)
    book = CallerBook(path)
    assert sha("new-token") not in book.current().by_token
    path.write_text(YAML + f"  - {{name: newcomer, token_sha256: {sha('new-token')}, roles: [generate]}}\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert book.current().by_token[sha("new-token")].name == "newcomer"
    path.write_text("callers: [")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2_000_000))
    assert book.current().by_token[sha("new-token")].name == "newcomer"


def test_every_rpc_needs_its_role_and_unknown_rpcs_need_admin() -> None:
    assert role_for("/proctor.v1.Generation/Generate") == "generate"
    assert role_for("/proctor.v1.Audit/ExportRecords") == "audit:read"
    assert role_for("/proctor.v1.Audit/Replay") == "audit:replay"
    assert role_for("/proctor.v1.Generation/SomethingNew") == "admin"


def test_identify_by_token_and_by_certificate(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(YAML)
    book = CallerBook(tmp_path / "c.yaml")

    def call(metadata: dict[str, str], certificate: dict[str, list[bytes]]) -> CallInfo:
        return CallInfo(metadata=metadata, certificate=certificate)

    assert identify(book, call({"authorization": "Bearer writer-token"}, {})).caller.name == "writer"
    assert identify(book, call({"authorization": "bearer  writer-token "}, {})).source == "token"
    for metadata, message in (({}, "no credentials"), ({"authorization": "Bearer nope"}, "unknown bearer token"),
                              ({"authorization": "Basic d3JpdGVy"}, "must be 'Bearer")):
        with pytest.raises(Unauthenticated, match=message):
            identify(book, call(metadata, {}))
    ca = CertificateAuthority(tmp_path / "ca", "unit")
    auditor = ca.issue("auditor", server=False)
    ops = ca.issue("someone", server=False, sans=("ops.internal",))
    stranger = ca.issue("stranger", server=False)
    pem = {"x509_pem_cert": [auditor.cert.read_bytes()]}
    assert peer_certificate(pem).subject == "CN=auditor,O=Proctor Tests"  # type: ignore[union-attr]
    assert identify(book, call({}, pem)).caller.name == "auditor"
    assert identify(book, call({}, {"x509_pem_cert": [ops.cert.read_bytes()]})).caller.name == "ops"
    with pytest.raises(Unauthenticated, match="not a known caller"):
        identify(book, call({}, {"x509_pem_cert": [stranger.cert.read_bytes()]}))


def test_the_rate_limit_allows_the_burst_then_says_when_to_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("proctor.api.caller_limits.time.monotonic", lambda: clock[0])
    caller = Caller("w", frozenset({"generate"}), limits=CallerLimits(requests_per_second=2, burst=3))
    limiter = CallerLimiter()
    assert [limiter.take_request(caller) for _ in range(3)] == [None, None, None]
    assert limiter.take_request(caller) == 500  # half a second until the next token at 2/s
    clock[0] += 0.5
    assert limiter.take_request(caller) is None
    unlimited = Caller("u", frozenset({"generate"}))
    assert all(limiter.take_request(unlimited) is None for _ in range(100))


def test_concurrent_streams_are_counted_per_caller() -> None:
    caller = Caller("w", frozenset({"generate"}), limits=CallerLimits(concurrent_streams=2))
    limiter = CallerLimiter()
    assert limiter.open_stream(caller) and limiter.open_stream(caller)
    assert not limiter.open_stream(caller)
    limiter.close_stream(caller)
    assert limiter.open_stream(caller)


def test_the_token_cap_lowers_the_default_and_refuses_more() -> None:
    caller = Caller("w", frozenset({"generate"}), limits=CallerLimits(max_new_tokens=64))
    limits = output_limits(Settings(default_max_new_tokens=256), caller)
    unset = GenerationRequest(request_id="r", prompt="hi")
    assert budgeted(unset, limits).stopping.max_new_tokens == 64
    asked = GenerationRequest(request_id="r", prompt="hi", stopping=StoppingParams(max_new_tokens=65))
    with pytest.raises(RequestValidationError, match=r"stopping\.max_new_tokens.*at most 64"):
        budgeted(asked, limits)


def test_an_exposed_server_needs_tls_and_callers_unless_insecure() -> None:
    assert exposure_problem(Settings(host="127.0.0.1")) == ""
    assert exposure_problem(Settings(host="::1")) == ""
    problem = exposure_problem(Settings(host="0.0.0.0"))
    assert "TLS" in problem and "callers file" in problem and "--insecure" in problem
    assert "TLS" not in exposure_problem(Settings(host="0.0.0.0", tls_cert_file="c", tls_key_file="k"))
    assert exposure_problem(Settings(host="0.0.0.0", insecure=True)) == ""
    assert exposure_problem(Settings(host="10.0.0.5", tls_cert_file="c", tls_key_file="k", callers_file="f")) == ""
    assert not Settings(host="0.0.0.0").reflection_enabled and Settings(host="127.0.0.2").reflection_enabled
    with pytest.raises(ValueError, match="go together"):
        Settings(tls_cert_file="c")


def test_proctor_serve_on_an_exposed_address_refuses_with_a_clear_message(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "PROCTOR_AUDIT_DB": str(tmp_path / "audit.db")}
    env.pop("PROCTOR_INSECURE", None)
    result = subprocess.run([sys.executable, "-m", "proctor.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
                            capture_output=True, text=True, timeout=120, env=env, check=False)
    assert result.returncode == 1
    assert "refusing to serve on 0.0.0.0 without TLS" in result.stderr and "--insecure" in result.stderr
    assert "Traceback" not in result.stderr
