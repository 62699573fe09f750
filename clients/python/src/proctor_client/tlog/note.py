"""C2SP signed notes (c2sp.org/signed-note), checkpoints (c2sp.org/tlog-checkpoint) and Ed25519
witness cosignatures (c2sp.org/tlog-cosignature), byte for byte as Go's ``golang.org/x/mod/sumdb/note``
and the transparency-dev witnesses write them.

A note is its text (ending in a newline), a blank line, then lines ``— <key name> base64(key ID ||
signature)``. A key ID is ``SHA-256(name || "\\n" || type || public key)[:4]``: type 0x01 for a log's
Ed25519 note signature (over the text), 0x04 for a witness's cosignature (over ``cosignature/v1``,
``time <t>`` and the text, its signature prefixed by the 8-byte big-endian time). A verifier key is
written ``<name>+<key ID hex>+base64(type || public key)`` (a "vkey").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proctor_client.tlog.merkle import HASH_SIZE

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
DASH = "\u2014 "
VKEY = re.compile(r"^[^+\s]+\+[0-9a-fA-F]{8}\+[A-Za-z0-9+/]+=*$")  # name+keyid+base64(type || key)


class NoteError(ValueError):
    """A note, checkpoint or key that is malformed or does not verify."""


@dataclass(frozen=True, slots=True)
class Verifier:
    """A public key with its name and signature type (0x01 note signer, 0x04 cosigner)."""

    name: str
    key: Ed25519PublicKey
    type: int = ED25519

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.type, _raw(self.key))

    def vkey(self) -> str:
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(bytes([self.type]) + _raw(self.key)).decode()}"


@dataclass(frozen=True, slots=True)
class Signer:
    """A private key that signs notes (0x01) or cosigns checkpoints (0x04) under ``name``."""

    name: str
    key: Ed25519PrivateKey
    type: int = ED25519

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, self.key.public_key(), self.type)

    def signature_line(self, text: str, timestamp: int = 0) -> str:
        """The note signature line of ``text`` (a cosignature: at ``timestamp``, POSIX seconds)."""
        ident = self.verifier.key_id
        if self.type == COSIGNATURE_V1:
            signed = ident + struct.pack(">Q", timestamp) + self.key.sign(cosigned_message(text, timestamp))
        else:
            signed = ident + self.key.sign(text.encode())
        return f"{DASH}{self.name} {base64.b64encode(signed).decode()}\n"


def key_id(name: str, type_: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([type_]) + public).digest()[:4]


def cosigned_message(text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


def parse_vkey(vkey: str) -> Verifier:
    """A verifier key ``name+hash+base64(type || key)``; its key ID must match."""
    try:
        name, ident, encoded = vkey.strip().split("+", 2)  # the base64 may hold "+" too
        raw = base64.b64decode(encoded, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise NoteError(f"not a verifier key (name+hash+base64): {vkey!r}") from exc
    if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
        raise NoteError(f"verifier key {name!r}: only Ed25519 (type 0x01 or 0x04) keys are supported")
    verifier = Verifier(name, Ed25519PublicKey.from_public_bytes(raw[1:]), raw[0])
    if verifier.key_id.hex() != ident.lower():
        raise NoteError(f"verifier key {name!r}: its key ID {ident} does not match its name and key")
    return verifier


def load_public_key(text_or_path: str) -> Ed25519PublicKey:
    """A raw Ed25519 key in base64, a PEM public key file, or a PEM private key file (its public half)."""
    path = Path(text_or_path)
    try:
        if path.is_file():
            data = path.read_bytes()
            loaded = (serialization.load_pem_private_key(data, password=None) if b"PRIVATE KEY" in data
                      else serialization.load_pem_public_key(data))
            key = loaded.public_key() if isinstance(loaded, Ed25519PrivateKey) else loaded
            if not isinstance(key, Ed25519PublicKey):
                raise NoteError(f"{path}: not an Ed25519 key")
            return key
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text_or_path, validate=True))
    except (ValueError, binascii.Error) as exc:
        if isinstance(exc, NoteError):
            raise
        raise NoteError(f"cannot read a public key from {text_or_path!r}: {exc}") from exc


def load_verifier(text_or_path: str, name: str, type_: int = ED25519) -> Verifier:
    """A vkey (its own name), or else a raw Ed25519 key (``load_public_key``) named ``name``."""
    path = Path(text_or_path)
    text = path.read_text(errors="replace") if path.is_file() else text_or_path
    if VKEY.match(text.strip()):
        return parse_vkey(text)
    return Verifier(name, load_public_key(text_or_path), type_)


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    key_id: bytes
    signature: bytes  # after the key ID (a cosignature: 8-byte time, then the Ed25519 signature)
    line: str


@dataclass(frozen=True, slots=True)
class Note:
    text: str
    signatures: tuple[Signature, ...]

    def render(self) -> str:
        return self.text + "\n" + "".join(s.line for s in self.signatures)


def parse_note(data: str) -> Note:
    """Split a signed note into its text and signature lines (the text ends at the last blank line)."""
    if any(ord(c) < 0x20 and c != "\n" for c in data):
        raise NoteError("a signed note holds no control characters but newlines")
    cut = data.rfind("\n\n")
    if cut < 0 or not data.endswith("\n"):
        raise NoteError("a signed note is text, a blank line and signature lines, each ending in a newline")
    text, lines = data[:cut + 1], data[cut + 2:].splitlines(keepends=True)
    if not lines:
        raise NoteError("the note has no signature")
    signatures = []
    for line in lines:
        if not line.startswith(DASH):
            raise NoteError(f"not a signature line: {line.rstrip()!r}")
        try:
            name, encoded = line[len(DASH):].rstrip("\n").split(" ")
            raw = base64.b64decode(encoded, validate=True)
        except (ValueError, binascii.Error) as exc:
            raise NoteError(f"malformed signature line: {line.rstrip()!r}") from exc
        if not name or "+" in name or len(raw) < 5:
            raise NoteError(f"malformed signature line: {line.rstrip()!r}")
        signatures.append(Signature(name, raw[:4], raw[4:], line))
    return Note(text, tuple(signatures))


def signed_by(note: Note, verifier: Verifier) -> int | None:
    """Whether ``verifier`` signed ``note``: None when it has no line of that key, else the time of its
    cosignature (0 for a plain note signature); ``NoteError`` when its line does not verify."""
    for signature in note.signatures:
        if signature.name != verifier.name or signature.key_id != verifier.key_id:
            continue  # another key's line (a verifier must ignore those)
        timestamp, message, raw = 0, note.text.encode(), signature.signature
        if verifier.type == COSIGNATURE_V1:
            if len(raw) != 8 + 64:
                raise NoteError(f"the cosignature of {verifier.name} is not 72 bytes")
            timestamp = struct.unpack(">Q", raw[:8])[0]
            message, raw = cosigned_message(note.text, timestamp), raw[8:]
        try:
            verifier.key.verify(raw, message)
        except InvalidSignature:
            raise NoteError(f"the signature of {verifier.name} does not verify") from None
        return timestamp
    return None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A tlog checkpoint's text: origin, tree size, root hash, then any extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        return "".join(f"{line}\n" for line in (self.origin, str(self.size), base64.b64encode(self.root).decode(),
                                                  *self.extensions))


def parse_checkpoint(text: str) -> Checkpoint:
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise NoteError("a checkpoint is at least three lines: origin, tree size, root hash")
    origin, size, root, *extensions = lines[:-1]
    if not origin or not size.isdigit() or (size != "0" and size.startswith("0")):
        raise NoteError("a checkpoint's origin is not empty and its tree size is a decimal without leading zeroes")
    try:
        digest = base64.b64decode(root, validate=True)
    except binascii.Error:
        digest = b""
    if len(digest) != HASH_SIZE:
        raise NoteError("a checkpoint's third line is the base64 of a 32-byte root hash")
    return Checkpoint(origin, int(size), digest, tuple(extensions))


def sign_checkpoint(checkpoint: Checkpoint, signer: Signer) -> str:
    text = checkpoint.text()
    return text + "\n" + signer.signature_line(text)


def add_signature_lines(note: str, lines: list[str]) -> str:
    """``note`` with signature ``lines`` added (each once: a line already there is not repeated)."""
    parsed = parse_note(note)
    have = {s.line for s in parsed.signatures}
    extra = [line if line.endswith("\n") else line + "\n" for line in lines]
    return parsed.render() + "".join(line for line in dict.fromkeys(extra) if line not in have)
