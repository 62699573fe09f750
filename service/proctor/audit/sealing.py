"""A request record's personal content sealed under its subject's key (AES-256-GCM), so that destroying the key
erases it while the row, the chain, the tree and every proof stay valid (audit/keystore.py).

What is sealed (``CONTENT_FIELDS``): everything a person wrote or was answered — the request (prompt, messages,
tools and the parameters beside them), the raw request of one that did not convert, the rendered prompt, the
output, every token (ids, text pieces and alternatives: token ids decode back to the text, so they are the text),
beams, attempts, a contract section, moderation replies and ``must_include`` phrases; and, out of the sections an
auditor reads, the fields that quote any of it (audit/quoting.py: a refusal's message, the finish detail, the
schema validation's messages). What stays in the clear: who called, when, which model, the status code, finish
reason, usage, timings, schema validity with each error's JSON path and keyword — what an auditor needs to
account for a call whose content was erased.

The sealed body holds ``sealed``: the algorithm, the key id, the nonce and the ciphertext of the content's
canonical JSON, bound to the record's audit id (GCM's associated data: a ciphertext moved to another record does
not open). ``open_body`` restores the content when the key is live, and marks it ``erased`` when it is not.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from proctor.audit import quoting
from proctor.audit.canonical import canonical
from proctor.audit.keystore import KeyStore

ALGORITHM = "A256GCM"
CONTENT_FIELDS = ("request", "raw_request", "prompt", "output", "reasoning", "tokens", "sequences", "attempts",
                  "contract", "moderation", "must_include")
ERASED = {"policy": "erased"}  # what an erased record's prompt and output read as


class SealError(ValueError):
    """A sealed record that does not open with its key (altered, or moved from another record)."""


def seal(body: dict[str, Any], key_id: str, key: bytes) -> dict[str, Any]:
    """``body`` with its content fields replaced by their ciphertext under ``key``."""
    clear, quoted = quoting.take(body)
    content = {field: body[field] for field in CONTENT_FIELDS if field in body}
    if quoted:  # only when a field quotes anything: records without keep their shape
        content["quoted"] = quoted
    nonce = os.urandom(12)
    ciphertext = AESGCM(key).encrypt(nonce, canonical(content), str(body["audit_id"]).encode())
    sealed = {field: value for field, value in clear.items() if field not in CONTENT_FIELDS}
    sealed["sealed"] = {"alg": ALGORITHM, "key_id": key_id, "nonce": base64.b64encode(nonce).decode(),
                        "ciphertext": base64.b64encode(ciphertext).decode()}
    return sealed


def sealed_key_id(body: dict[str, Any]) -> str | None:
    """The key id a record is sealed under (None: not sealed)."""
    sealed = body.get("sealed")
    return str(sealed["key_id"]) if isinstance(sealed, dict) else None


def open_body(body: dict[str, Any], keys: KeyStore | None) -> dict[str, Any]:
    """The record as written: its content restored when its key is live; else ``erased`` set (the key id) and the
    content fields read as erased. A record that is not sealed is returned as it is."""
    key_id = sealed_key_id(body)
    if key_id is None:
        return body
    rest = {field: value for field, value in body.items() if field != "sealed"}
    key = keys.key(key_id) if keys is not None else None
    if key is None:
        erased = {**rest, "request": None, "prompt": dict(ERASED), "output": dict(ERASED), "tokens": [],
                  "erased": {"key_id": key_id}}
        return erased if "reasoning" not in rest else {**erased, "reasoning": dict(ERASED)}
    envelope = body["sealed"]
    try:
        plaintext = AESGCM(key).decrypt(base64.b64decode(envelope["nonce"]), base64.b64decode(envelope["ciphertext"]),
                                        str(body["audit_id"]).encode())
    except (InvalidTag, ValueError, KeyError) as exc:
        raise SealError(f"record {body.get('audit_id')}: its sealed content does not open with key {key_id}") from exc
    content = json.loads(plaintext)
    quoted = content.pop("quoted", {})
    return quoting.put({**rest, **content}, quoted)
