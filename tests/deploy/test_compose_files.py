"""deploy/compose/: the files the Compose stack runs, checked in every ``make test`` (no podman, no images).

* compose.yaml: the replicas pass the exposure gate (TLS, callers) and drain within their stop grace period;
  secrets are files, never environment values; every published port is on loopback;
* make-secrets.sh writes every file compose mounts, and they work (certificate chain, callers, keys, passfiles);
* prometheus/prometheus.yml scrapes each replica and the witness on the ports they serve metrics on, loads the
  alert rules compose mounts, and holds every job the alert rules name;
* the ``audit-init`` one-shot: its own command, taken from compose.yaml, run for real against the test
  PostgreSQL (twice: a second ``up`` runs it again): what it prints, the tables it creates, and the grants
  (the replicas' role may SELECT and INSERT, nothing else; the store opens as that role).

The stack itself runs in ``make compose-check`` (tests/deploy/test_compose.py), which keeps only what needs
the running containers; an assertion about one of these files belongs here, where CI sees it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest
import yaml
from helpers.postgres import appender_dsn, postgres_dsn
from helpers.requirements import missing
from psycopg import sql
from psycopg.conninfo import make_conninfo

from proctor.api.security import exposure_problem
from proctor.config import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
PROMETHEUS_YML = COMPOSE_DIR / "prometheus" / "prometheus.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"


def _compose() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
    return spec


def _replicas(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if name.startswith("proctor-")}


def _scrape_jobs() -> dict[str, set[str]]:
    """prometheus.yml's scrape jobs: job name → its targets."""
    prometheus = yaml.safe_load(PROMETHEUS_YML.read_text())
    return {job["job_name"]: {t for sc in job["static_configs"] for t in sc["targets"]}
            for job in prometheus["scrape_configs"]}


# --- compose.yaml and its secrets ---------------------------------------------------------------------

def test_compose_replicas_pass_the_exposure_gate_with_tls_and_callers_and_drain_in_time() -> None:
    compose = _compose()
    replicas = _replicas(compose)
    assert len(replicas) == 2
    for name, svc in replicas.items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        known = {f"PROCTOR_{n.upper()}" for n in Settings.__dataclass_fields__}
        assert set(env) <= known, f"{name}: not settings: {sorted(set(env) - known)}"
        settings = Settings.load(environ=env)
        assert not settings.insecure and settings.tls_cert_file and settings.callers_file
        assert exposure_problem(settings) == ""
        assert settings.audit_dsn and settings.health_port and settings.metrics_port
        grace = float(svc["stop_grace_period"].rstrip("s"))
        assert grace >= settings.drain_notice_s + settings.grace_period_s + 5
        # Each replica keeps its own checkpoint file in its own audit volume.
        assert any(v.endswith(":/var/lib/proctor/audit") for v in svc["volumes"])
    audit_volumes = [next(v for v in svc["volumes"] if v.endswith(":/var/lib/proctor/audit"))
                     for svc in replicas.values()]
    assert len(set(audit_volumes)) == 2


def test_every_published_port_is_on_loopback() -> None:
    """``HOST:PUBLISHED:CONTAINER`` with HOST 127.0.0.1; ``50051:50051`` or ``50051`` would bind every interface."""
    compose = _compose()
    published = {name: [str(port) for port in svc.get("ports", [])] for name, svc in compose["services"].items()}
    assert all(published[name] for name in _replicas(compose)), "each replica publishes its gRPC port"
    for name, ports in published.items():
        for port in ports:
            assert port.count(":") == 2 and port.startswith("127.0.0.1:"), f"{name} is published beyond loopback: " \
                f"{port}"


def test_compose_secrets_are_files_never_environment_values() -> None:
    compose = _compose()
    for name, svc in compose["services"].items():
        mounted = {f"/run/secrets/{s}" for s in svc.get("secrets", [])}
        env = svc.get("environment", {}) or {}
        for key, value in env.items():
            value = str(value)
            if re.search(r"PASSWORD|TOKEN|SECRET|_KEY$", key):
                assert key.endswith("_FILE") or value.startswith("/run/secrets/"), f"{name}: {key} is a value"
            for path in re.findall(r"/run/secrets/\w+", value):
                assert path in mounted, f"{name}: {key} names {path}, which it does not mount"
            if value.startswith("postgresql://"):
                assert urlparse(value).password is None, f"{name}: a password in {key}"
        for word in svc.get("entrypoint", []) + svc.get("command", []):
            for dsn in re.findall(r"postgresql://[^' ]+", str(word)):
                assert urlparse(dsn).password is None and "passfile=/run/secrets/" in dsn
                assert dsn.split("passfile=")[1] in mounted
    for secret in compose["secrets"].values():
        assert secret["file"].startswith("./secrets/")


def test_make_secrets_writes_every_file_compose_mounts_and_they_work(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from proctor.api.callers import load_callers

    if shutil.which("openssl") is None:
        missing("openssl is not installed")
    out = tmp_path / "secrets"
    subprocess.run(["bash", str(COMPOSE_DIR / "make-secrets.sh")], env={**os.environ, "SECRETS_DIR": str(out)},
                   check=True, capture_output=True, timeout=60)
    compose = _compose()
    files = {name: out / Path(s["file"]).name for name, s in compose["secrets"].items()}
    for name, path in files.items():
        assert path.is_file() and path.stat().st_size > 0, name
    # The callers file names the operator's token by its sha256, with the admin role.
    token = (out / "client.token").read_text().strip()
    callers = load_callers(files["callers"])
    assert callers.by_token[hashlib.sha256(token.encode()).hexdigest()].may("generate")
    # The server certificate is signed by the CA and names both replicas.
    cert = x509.load_pem_x509_certificate(files["tls_crt"].read_bytes())
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert {"proctor-1", "proctor-2"} <= set(sans)
    load_pem_private_key(files["tls_key"].read_bytes(), password=None)
    assert type(load_pem_private_key(files["audit_signing_key"].read_bytes(), password=None)).__name__ \
        == "Ed25519PrivateKey"
    assert len(files["audit_hmac_key"].read_bytes().strip()) >= 16
    # libpq ignores a passfile that group or others may read; its line matches the DSN that names it.
    for service, key in (("audit-init", "pg_owner_pgpass"), ("proctor-1", "pg_appender_pgpass")):
        assert files[key].stat().st_mode & 0o077 == 0
        host, port, db, user, password = files[key].read_text().strip().split(":")
        svc = compose["services"][service]
        text = json.dumps(svc.get("environment", {})) + json.dumps(svc.get("entrypoint", []))
        assert f"postgresql://{user}@{host}:{port}/{db}?passfile=/run/secrets/{key}" in text
        password_file = out / ("pg-owner-password" if "owner" in key else "pg-appender-password")
        assert password == password_file.read_text().strip()


# --- prometheus.yml and the alert rules ----------------------------------------------------------------

def test_compose_prometheus_scrapes_both_replicas_and_the_witness_and_grafana_mounts_exist() -> None:
    compose = _compose()
    prometheus = yaml.safe_load(PROMETHEUS_YML.read_text())
    targets = _scrape_jobs()
    assert targets["proctor"] == {f"{name}:{svc['environment']['PROCTOR_METRICS_PORT']}"
                                  for name, svc in _replicas(compose).items()}
    witness = compose["services"]["witness"]["entrypoint"]
    from proctor.cli import build_parser

    args = build_parser().parse_args(witness[1:])  # the real command line of `proctor audit witness`
    assert args.audit_command == "witness" and len(args.logs) == len(_replicas(compose)) and args.interval > 0
    secrets = {f"/run/secrets/{name}" for name in compose["services"]["witness"]["secrets"]}
    assert {*args.log_keys, args.key, args.tls_ca, args.token_file} <= secrets
    assert targets["proctor-witness"] == {f"witness:{args.metrics_port}"}
    # Every target is a service of this stack (a renamed service would leave a job scraping nothing).
    hosts = {target.rsplit(":", 1)[0] for job in targets.values() for target in job}
    assert hosts <= set(compose["services"]), f"not services: {sorted(hosts - set(compose['services']))}"
    for name in ("prometheus", "grafana", "postgres"):
        for volume in compose["services"][name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source} is missing"
    rules = next(v for v in compose["services"]["prometheus"]["volumes"] if "alerts.yml" in v)
    assert (COMPOSE_DIR / rules.split(":")[0]).resolve() == ALERTS
    assert rules.split(":")[1] in prometheus["rule_files"]


def test_every_job_the_alert_rules_name_is_a_scrape_job_of_the_stack() -> None:
    """``up{job="proctor"} == 0`` (ProctorReplicaDown) never fires when no job has that name."""
    exprs = [rule["expr"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    named = {job for expr in exprs for job in re.findall(r'\bjob\s*=\s*"([^"]+)"', expr)}
    assert "proctor" in named
    assert named <= set(_scrape_jobs()), f"rules name jobs prometheus.yml lacks: {sorted(named - set(_scrape_jobs()))}"


# --- audit-init, run for real ------------------------------------------------------------------------

def audit_init_command(compose: dict[str, Any]) -> list[str]:
    """The ``proctor …`` words that audit-init's retry loop runs (``sh -c "for …; do proctor … && exit 0; …"``)."""
    entrypoint = compose["services"]["audit-init"]["entrypoint"]
    assert entrypoint[:2] == ["sh", "-c"], entrypoint
    words = shlex.split(entrypoint[2].replace("$$", "$"))  # compose's $$ is a literal $
    start = words.index("proctor")
    return words[start:words.index("&&", start)]


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


@pytest.fixture
def owner_schema() -> Iterator[tuple[str, str]]:
    """A fresh schema of the test PostgreSQL, empty, that the appender role may use: (owner DSN, schema)."""
    owner = postgres_dsn()
    if owner is None:
        missing("PostgreSQL is not running (make test starts it; PROCTOR_TEST_POSTGRES_DSN)")
    schema = f"t_init_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield owner, schema
    finally:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_audit_init_creates_the_tables_and_grants_the_replicas_role_select_and_insert_only(
        owner_schema: tuple[str, str]) -> None:
    from proctor.audit.postgres_store import TABLES, PostgresAuditStore

    owner, schema = owner_schema
    compose = _compose()
    command = audit_init_command(compose)
    assert command[1:3] == ["audit", "init-postgres"], command
    role = option(command, "--grant-to")
    # The role granted is the one the replicas connect as, and the one PostgreSQL's first start creates;
    # audit-init connects as the database's owner.
    replicas_dsn = urlparse(compose["x-proctor"]["environment"]["PROCTOR_AUDIT_DSN"])
    assert replicas_dsn.username == role
    assert re.search(rf"CREATE ROLE {role}\b", (COMPOSE_DIR / "postgres" / "init-appender.sh").read_text())
    assert urlparse(option(command, "--dsn")).username == compose["services"]["postgres"]["environment"][
        "POSTGRES_USER"]

    with psycopg.connect(owner, autocommit=True) as conn:  # what init-appender.sh grants (here: on the schema)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role)))
    scoped = make_conninfo(owner, options=f"-c search_path={schema}")
    argv = [sys.executable, "-m", "proctor.cli", *command[1:]]
    argv[argv.index("--dsn") + 1] = scoped
    for run in ("first up", "a later up on the same database"):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, f"{run}: {result.stdout}{result.stderr}"
        assert result.stdout.strip() == f"{', '.join(TABLES)} ready; {role} may SELECT and INSERT only", run

    with psycopg.connect(owner, autocommit=True) as conn:
        created = {row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))}
        assert created == set(TABLES)
        for table in TABLES:
            qualified = f"{schema}.{table}"
            granted = {privilege for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES",
                                                   "TRIGGER")
                       if conn.execute("SELECT has_table_privilege(%s, %s, %s)",
                                       (role, qualified, privilege)).fetchone() == (True,)}
            assert granted == {"SELECT", "INSERT"}, f"{role} on {table}: {sorted(granted)}"
    appender = make_conninfo(appender_dsn(owner), user=role, options=f"-c search_path={schema}")
    with psycopg.connect(appender, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == (0,)
        for statement in ("DELETE FROM audit_log", "UPDATE audit_log SET caller = caller"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(statement)
    store = PostgresAuditStore(appender)  # a replica's store opens on what audit-init made, as that role
    store.close()
