"""Opening the audit trail from the settings: store, signing key, checkpoint file, privacy policy, sink."""

from __future__ import annotations

import logging
from pathlib import Path

from proctor.audit.chain import load_or_create_signing_key, public_key_text
from proctor.audit.records import PrivacyPolicy
from proctor.audit.sink import AuditSink
from proctor.audit.store import AuditStore
from proctor.config import Settings

log = logging.getLogger("proctor.audit")


def open_store(settings: Settings, *, readonly: bool = False) -> AuditStore:
    if settings.audit_dsn:
        from proctor.audit.postgres_store import PostgresAuditStore

        return PostgresAuditStore(settings.audit_dsn)
    from proctor.audit.sqlite_store import SQLiteAuditStore

    return SQLiteAuditStore(Path(settings.audit_db), readonly=readonly)


def _base(settings: Settings) -> Path:
    return Path(settings.audit_db) if not settings.audit_dsn else Path(settings.audit_db).with_name("postgres")


def signing_key_path(settings: Settings) -> Path:
    return Path(settings.audit_signing_key) if settings.audit_signing_key else Path(f"{_base(settings)}.key")


def checkpoint_path(settings: Settings) -> Path:
    return Path(settings.audit_checkpoint_file) if settings.audit_checkpoint_file \
        else Path(f"{_base(settings)}.checkpoints")


def privacy_policy(settings: Settings) -> PrivacyPolicy:
    key = None
    if settings.audit_hmac_key_file:
        key = Path(settings.audit_hmac_key_file).read_bytes().strip()
        if len(key) < 16:
            raise ValueError(f"{settings.audit_hmac_key_file}: the HMAC key must be at least 16 bytes")
    return PrivacyPolicy(settings.audit_prompt_policy, settings.audit_output_policy, key)


def open_sink(settings: Settings) -> AuditSink | None:
    """The running audit sink, or None when the audit is off. Raises when the store cannot be opened."""
    if not settings.audit:
        log.warning("the audit trail is OFF (--no-audit): calls are not recorded")
        return None
    store = open_store(settings)
    key = load_or_create_signing_key(signing_key_path(settings))
    sink = AuditSink(store, key, checkpoint_file=checkpoint_path(settings),
                     checkpoint_every=settings.audit_checkpoint_every,
                     checkpoint_interval_s=settings.audit_checkpoint_interval_s, queue_size=settings.audit_queue_size)
    log.info("audit trail: %s (%d rows), checkpoints signed with Ed25519 key %s, compliance mode %s",
             store.description, store.count(), public_key_text(key.public_key()),
             "on" if settings.audit_compliance else "off")
    return sink
