"""Hash chain and signed checkpoints.

Each stored row's hash covers its sequence number, the previous row's hash, its filter columns
and its body, so changing, removing, inserting or reordering any row, or editing a column, breaks
the chain at that row (``row_hash``; ``proctor.audit/1`` rows, whose hash covers only the sequence
number, the previous hash and the body, are read with ``row_hash_v1``). Every N rows (or T
seconds) a checkpoint row carries an Ed25519 signature over the sequence number and hash it
closes; checkpoints are also appended to a file outside the store, so cutting off the tail of the
log (checkpoints included) is detected as well. The layout is docs/audit-format.md.
"""

from __future__ import annotations

import base64
import hashlib
from json.encoder import encode_basestring  # the C encoder's JSON string (no ASCII escaping): RFC 8785's
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proctor.audit import FORMAT_V2, FORMAT_V3
from proctor.audit.canonical import canonical
from proctor.audit.stored_body import is_compressed

GENESIS = "0" * 64
_HEADS = {FORMAT_V2: encode_basestring(FORMAT_V2), FORMAT_V3: encode_basestring(FORMAT_V3)}


def row_head(seq: int, prev_hash: str, kind: str, audit_id: str, time_ms: int, caller: str, request_id: str,
             finish_reason: str, form: str = FORMAT_V3) -> bytes:
    """What a ``proctor.audit/2`` or ``/3`` row's hash covers before its body: the canonical JSON
    (RFC 8785) of ``[format, seq, prev_hash, kind, audit_id, time_ms, caller, request_id,
    finish_reason]`` and a newline. It starts with ``[`` where the v1 head starts with ``{``: no
    bytes hash as both; and the format in it tells v2 from v3."""
    return (f"[{_HEADS[form]},{seq:d},{encode_basestring(prev_hash)},{encode_basestring(kind)},"
            f"{encode_basestring(audit_id)},{time_ms:d},{encode_basestring(caller)},{encode_basestring(request_id)},"
            f"{encode_basestring(finish_reason)}]\n").encode()


def chained_format(body: bytes) -> str:
    """The format of a row with a v2/v3 hash, told by its stored body: a zstd frame is v3, the
    canonical JSON itself v2."""
    return FORMAT_V3 if is_compressed(body) else FORMAT_V2


def row_hash(seq: int, prev_hash: str, kind: str, audit_id: str, time_ms: int, caller: str, request_id: str,
             finish_reason: str, body: bytes) -> str:
    """sha256 (hex) of ``row_head(...) + body``, ``body`` as stored (``chained_format`` names the head)."""
    digest = hashlib.sha256(row_head(seq, prev_hash, kind, audit_id, time_ms, caller, request_id, finish_reason,
                                     chained_format(body)))
    digest.update(body)  # releases the GIL for large bodies: another thread can read the store meanwhile
    return digest.hexdigest()


def row_hash_v1(seq: int, prev_hash: str, body: bytes) -> str:
    """A ``proctor.audit/1`` row's hash: sha256 over ``canonical({"seq", "prev"}) + "\\n" + body``."""
    return hashlib.sha256(canonical({"seq": seq, "prev": prev_hash}) + b"\n" + body).hexdigest()


def checkpoint_message(seq: int, hash_: str, time_ms: int) -> bytes:
    return canonical({"checkpoint_seq": seq, "checkpoint_hash": hash_, "time_ms": time_ms})


def load_or_create_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 key (PEM, PKCS#8). Created (mode 0600) when the file does not exist yet."""
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.touch(mode=0o600)
    path.write_bytes(pem)
    return key


def public_key_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def load_public_key(text_or_path: str) -> Ed25519PublicKey:
    """A base64 raw key, a PEM public key file, or a PEM private key file (its public half)."""
    path = Path(text_or_path)
    if path.is_file():
        data = path.read_bytes()
        if b"PRIVATE KEY" in data:
            private = serialization.load_pem_private_key(data, password=None)
            assert isinstance(private, Ed25519PrivateKey)
            return private.public_key()
        public = serialization.load_pem_public_key(data)
        if not isinstance(public, Ed25519PublicKey):
            raise ValueError(f"{path}: not an Ed25519 public key")
        return public
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text_or_path))


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    return base64.b64encode(key.sign(message)).decode()


def signature_ok(key: Ed25519PublicKey, message: bytes, signature: str) -> bool:
    try:
        key.verify(base64.b64decode(signature), message)
    except Exception:
        return False
    return True
