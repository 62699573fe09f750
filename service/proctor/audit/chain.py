"""Hash chain and signed checkpoints over canonical JSON (RFC 8785).

Each stored row's hash covers its sequence number, the previous row's hash and its body, so
changing, removing, inserting or reordering any row breaks the chain at that row. Every N rows
(or T seconds) a checkpoint row carries an Ed25519 signature over the sequence number and hash
it closes; checkpoints are also appended to a file outside the store, so cutting off the tail
of the log (checkpoints included) is detected as well.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import secrets
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GENESIS = "0" * 64


MAX_SAFE_INTEGER = 2**53 - 1
_MARK = f"\x00{secrets.token_hex(8)}:"  # wraps a pre-formatted number; unguessable, so no text can fake it
_MARKED = re.compile('"' + re.escape(json.dumps(_MARK)[1:-1]) + r'([-0-9.e+]+)\\u0000"')


def es6_number(value: float) -> str:
    """ECMAScript Number::toString (what RFC 8785 prescribes): shortest round-trip digits, and
    plain decimals for 1e-6 <= |x| < 1e21 (Python's repr switches to exponents earlier)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    integer, _, fraction = mantissa.partition(".")
    digits = (integer + fraction.rstrip("0")).lstrip("0") if fraction != "0" else integer.lstrip("0")
    point = len(integer.lstrip("0")) if integer != "0" else -(len(fraction) - len(fraction.lstrip("0")))
    point += int(exponent or 0)  # the decimal point sits after `point` digits
    digits = digits.rstrip("0") or "0"
    if len(digits) <= point <= 21:
        text = digits + "0" * (point - len(digits))
    elif 0 < point <= 21:
        text = f"{digits[:point]}.{digits[point:]}"
    elif -6 < point <= 0:
        text = "0." + "0" * -point + digits
    else:
        power = point - 1
        text = digits[0] + ("." + digits[1:] if len(digits) > 1 else "") + f"e{'+' if power > 0 else '-'}{abs(power)}"
    return sign + text


def clean(value: Any, *, mark_floats: bool = False) -> Any:
    """JSON-safe for RFC 8785: non-finite floats become None, integers beyond 2^53 become strings.

    With ``mark_floats`` (the fast path of ``canonical``), finite floats become marked strings
    holding their ECMAScript form, restored after ``json.dumps``; a dict key outside the BMP raises
    ``_NeedsReference`` (keys are then ordered by UTF-16 units, unlike Python's order).
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return f"{_MARK}{es6_number(value)}\x00" if mark_floats else value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        return str(value)
    if isinstance(value, dict):
        if mark_floats and any(any(ord(ch) > 0xFFFF for ch in str(k)) for k in value):
            raise _NeedsReference
        return {str(k): clean(v, mark_floats=mark_floats) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v, mark_floats=mark_floats) for v in value]
    return value


class _NeedsReference(Exception):
    pass


def canonical(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes. The fast path is ``json.dumps`` with sorted keys and numbers
    pre-formatted the ECMAScript way (equal to the reference for our data, checked by a property
    test); keys outside the BMP take the reference implementation."""
    try:
        text = json.dumps(clean(value, mark_floats=True), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except _NeedsReference:
        return rfc8785.dumps(clean(value))
    return _MARKED.sub(lambda m: m.group(1), text).encode("utf-8")


def row_hash(seq: int, prev_hash: str, body_json: bytes) -> str:
    """sha256 over ``canonical({"seq", "prev", "body"})``; ``body_json`` is already canonical."""
    head = canonical({"seq": seq, "prev": prev_hash})
    return hashlib.sha256(head + b"\n" + body_json).hexdigest()


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
