"""Opening the audit trail from the settings: store, signing key, checkpoint file, privacy policy, sink."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from proctor.audit.chain import load_or_create_signing_key, public_key_text
from proctor.audit.keystore import FileKeyStore
from proctor.audit.periodic import Periodic
from proctor.audit.records import PrivacyPolicy
from proctor.audit.sink import AuditSink
from proctor.audit.store import AuditStore
from proctor.config import Settings

if TYPE_CHECKING:
    from proctor.audit.retention import RetentionPolicy
    from proctor.audit.witness_feed import WitnessObserver

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


def key_dir(settings: Settings) -> Path:
    return Path(settings.audit_key_dir) if settings.audit_key_dir else Path(f"{_base(settings)}.keys")


def key_store(settings: Settings, *, existing: bool = False) -> FileKeyStore | None:
    """The subjects' key store: with --audit-encryption subject (or, ``existing``, wherever one was kept: a reader
    opens the records sealed under it); else None."""
    path = key_dir(settings)
    if settings.audit_encryption == "subject" or (existing and path.is_dir()):
        return FileKeyStore(path)
    return None


def privacy_policy(settings: Settings) -> PrivacyPolicy:
    key = None
    if settings.audit_hmac_key_file:
        key = Path(settings.audit_hmac_key_file).read_bytes().strip()
        if len(key) < 16:
            raise ValueError(f"{settings.audit_hmac_key_file}: the HMAC key must be at least 16 bytes")
    return PrivacyPolicy(settings.audit_prompt_policy, settings.audit_output_policy, key)


def ensure_tree(store: AuditStore, processes: int | None = None) -> int:
    """Build the Merkle tree over rows that have no leaf yet (a log from before the tree: the first start
    after the upgrade), with a progress bar; returns the leaves added (``audit/tree_build.py``)."""
    from tqdm import tqdm

    from proctor.audit.tree_build import CHUNK_ROWS, build_tree

    size, last = store.tree_size() or 0, store.last()
    missing = (last.seq if last is not None else 0) - size
    if missing <= 0:
        return 0
    log.info("audit trail: building the Merkle tree over %d rows (the first start with audit proofs)", missing)
    began = time.perf_counter()
    with tqdm(total=missing, unit="rec", desc="audit tree", file=sys.stderr, disable=missing < CHUNK_ROWS) as bar:
        added = build_tree(store, bar.update, processes)
    seconds = time.perf_counter() - began
    log.info("audit trail: Merkle tree built over %d rows in %.1f s (%.0f rows/s)", added, seconds,
             added / seconds if seconds else 0.0)
    return added


def open_sink(settings: Settings) -> AuditSink | None:
    """The running audit sink, or None when the audit is off. Raises when the store cannot be opened."""
    if not settings.audit:
        log.warning("the audit trail is OFF (--no-audit): calls are not recorded")
        return None
    store = open_store(settings)
    key = load_or_create_signing_key(signing_key_path(settings))
    ensure_tree(store)
    sink = AuditSink(store, key, checkpoint_file=checkpoint_path(settings),
                     checkpoint_every=settings.audit_checkpoint_every,
                     checkpoint_interval_s=settings.audit_checkpoint_interval_s, queue_size=settings.audit_queue_size,
                     origin=settings.audit_origin)
    log.info("audit trail: %s (%d rows), checkpoints signed with Ed25519 key %s, compliance mode %s",
             store.description, store.count(), public_key_text(key.public_key()),
             "on" if settings.audit_compliance else "off")
    return sink


def audit_jobs(settings: Settings, sink: AuditSink | None, keys: FileKeyStore | None, policy: RetentionPolicy,
               observer: WitnessObserver | None) -> list[Periodic]:
    """The audit trail's jobs while the server runs (not started): each new checkpoint to the witnesses of
    ``--audit-witness-url``, and the retention sweep."""
    from proctor.audit.retention import retention_sweeper
    from proctor.audit.witness_feed import WITNESS_FEED_S, WitnessFeed

    jobs: list[Periodic] = []
    if sink is not None and settings.witness_urls:
        feed = WitnessFeed(sink.store, settings.witness_urls, settings.witness_vkeys, observer)
        jobs.append(Periodic("witness-feed", WITNESS_FEED_S, feed.run_once))
    if sink is not None and keys is not None and policy.on:
        jobs.append(retention_sweeper(sink, keys, policy))
    return jobs
