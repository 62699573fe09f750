"""The C2SP transparency-log specifications, implemented here from their text alone (signed-note, tlog-checkpoint,
tlog-cosignature, tlog-tiles, tlog-witness; RFC 9162 §2.1), with no import from the project: the other side the
tests hold Proctor to.

- ``SpecNotes``: Ed25519 note signatures (type 0x01) and cosignature/v1 lines (type 0x04), made and checked.
- ``mth``, ``consistent``: RFC 9162's Merkle tree hash and consistency-proof check (§2.1.1, §2.1.4.2).
- ``tile_url``, ``read_tree``: a tiled log read as a client would, its root rebuilt from the level-0 tiles and every
  higher tile checked against the one below.
- ``SpecWitness``: a tlog-witness ``add-checkpoint`` endpoint on loopback, answering every status the spec names.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

EMPTY = hashlib.sha256(b"").digest()
DASH = "\u2014"


def raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(name: str, kind: int, public: Ed25519PublicKey) -> bytes:
    """signed-note: SHA-256(key name || 0x0A || signature type || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + raw(public)).digest()[:4]


def vkey(name: str, kind: int, public: Ed25519PublicKey) -> str:
    """signed-note's verifier key: <name>+<hex key ID>+base64(type || public key)."""
    return f"{name}+{key_id(name, kind, public).hex()}+{base64.b64encode(bytes([kind]) + raw(public)).decode()}"


def split_note(note: str) -> tuple[str, list[tuple[str, bytes]]]:
    """A note's text (up to and with its last newline before the blank line) and its signatures (name, decoded)."""
    text, _, signatures = note.partition("\n\n")
    lines = [line for line in signatures.split("\n") if line]
    parsed = []
    for line in lines:
        assert line.startswith(DASH + " "), f"not a signature line: {line!r}"
        name, _, blob = line[2:].rpartition(" ")
        parsed.append((name, base64.b64decode(blob)))
    return text + "\n", parsed


def parse_checkpoint(text: str) -> tuple[str, int, bytes]:
    """tlog-checkpoint: origin, decimal size, base64 root (extension lines ignored)."""
    origin, size, root = text.split("\n")[:3]
    return origin, int(size), base64.b64decode(root)


def sign_checkpoint(text: str, name: str, key: Ed25519PrivateKey) -> str:
    """The note of ``text`` signed by a log key (type 0x01)."""
    signature = key.sign(text.encode())
    blob = base64.b64encode(key_id(name, 0x01, key.public_key()) + signature).decode()
    return f"{text}\n{DASH} {name} {blob}\n"


def log_signature_ok(note: str, name: str, public: Ed25519PublicKey) -> bool | None:
    """True: the log key signed it; False: a line of the key's name and ID does not verify; None: no such line."""
    text, signatures = split_note(note)
    wanted = key_id(name, 0x01, public)
    found = None
    for signer, blob in signatures:
        if signer == name and blob[:4] == wanted:
            try:
                public.verify(blob[4:], text.encode())
                found = True if found is None else found
            except InvalidSignature:
                return False
    return found


def cosignature_line(text: str, name: str, key: Ed25519PrivateKey, when: int) -> str:
    """tlog-cosignature v1 over checkpoint ``text``: the message is 'cosignature/v1', 'time T', then the text."""
    message = f"cosignature/v1\ntime {when}\n".encode() + text.encode()
    blob = key_id(name, 0x04, key.public_key()) + struct.pack(">Q", when) + key.sign(message)
    return f"{DASH} {name} {base64.b64encode(blob).decode()}\n"


def cosigned_at(text: str, line: str, name: str, public: Ed25519PublicKey) -> int | None:
    """The timestamp of a valid cosignature/v1 ``line`` by (name, key) over ``text``; None otherwise."""
    signer, _, blob_text = line.strip()[2:].rpartition(" ")
    blob = base64.b64decode(blob_text)
    if signer != name or blob[:4] != key_id(name, 0x04, public):
        return None
    (when,) = struct.unpack(">Q", blob[4:12])
    try:
        public.verify(blob[12:], f"cosignature/v1\ntime {when}\n".encode() + text.encode())
    except InvalidSignature:
        return None
    return int(when)


def node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 §2.1.1 MTH over leaf *hashes*: split at the largest power of two below the count."""
    if not leaves:
        return EMPTY
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return node(mth(leaves[:k]), mth(leaves[k:]))


def consistent(first: int, second: int, proof: list[bytes], first_hash: bytes, second_hash: bytes) -> bool:
    """RFC 9162 §2.1.4.2, for 0 < first < second, step by step."""
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_hash)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node(c, fr), node(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_hash and sr == second_hash and sn == 0


def tile_url(base: str, level: int, index: int, width: int = 256) -> str:
    """tlog-tiles: <prefix>/tile/<L>/<N>[.p/<W>], N in zero-padded 3-digit elements, 'x' before all but the last."""
    digits = f"{index:03d}"
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i:i + 3] for i in range(0, len(digits), 3)]
    path = "/".join([f"x{g}" for g in groups[:-1]] + [groups[-1]])
    return f"{base}/tile/{level}/{path}" + (f".p/{width}" if width < 256 else "")


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def read_tree(base: str, size: int, headers: dict[str, str] | None = None) -> tuple[bytes, list[bytes]]:
    """A tree of ``size`` leaves read from its tiles as a client would: every level-0 tile's leaf hashes, the root
    rebuilt from them, and every tile of every higher level checked: each of its hashes is the MTH of the full tile
    below it. Returns (root, leaf hashes)."""
    by_level: list[list[bytes]] = []
    level = 0
    while (count := size // 256 ** level) > 0:
        hashes: list[bytes] = []
        for index in range((count + 255) // 256):
            width = min(256, count - 256 * index)
            status, body, _ = fetch(tile_url(base, level, index, width), headers)
            assert status == 200, f"tile {level}/{index} width {width}: HTTP {status} {body[:200]!r}"
            assert len(body) == 32 * width, f"tile {level}/{index}: {len(body)} bytes for {width} hashes"
            hashes += [body[i:i + 32] for i in range(0, len(body), 32)]
        if level:
            below = by_level[-1]
            for i, digest in enumerate(hashes):
                assert digest == mth(below[256 * i:256 * (i + 1)]), f"level {level} hash {i} is not its tile's MTH"
        by_level.append(hashes)
        level += 1
    leaves = by_level[0] if by_level else []
    return mth(leaves), leaves


@dataclass
class SpecWitness:
    """tlog-witness ``add-checkpoint`` on 127.0.0.1: logs it knows (origin → log public key), the latest checkpoint
    it cosigned per origin (size, root), checked and updated under one lock, as the spec requires."""

    name: str
    key: Ed25519PrivateKey
    logs: dict[str, Ed25519PublicKey]
    state: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def vkey(self) -> str:
        return vkey(self.name, 0x04, self.key.public_key())

    def answer(self, body: bytes) -> tuple[int, str, dict[str, str]]:
        """(status, body, headers) for a request body, in the spec's order of checks."""
        text = body.decode()
        self.requests.append(text)
        head, sep, note = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or not lines[0].startswith("old ") or len(lines) - 1 > 63:
            return 400, "malformed\n", {}
        old_text = lines[0][4:]
        if not old_text.isdigit() or (old_text != "0" and old_text.startswith("0")):
            return 400, "old size\n", {}
        old = int(old_text)
        try:
            proof = [base64.b64decode(line, validate=True) for line in lines[1:]]
            checkpoint_text, _ = split_note(note)
            origin, size, root = parse_checkpoint(checkpoint_text)
        except (ValueError, AssertionError):
            return 400, "malformed\n", {}
        public = self.logs.get(origin)
        if public is None:
            return 404, "unknown log\n", {}
        if not log_signature_ok(note, origin, public):
            return 403, "no valid signature from the log's key\n", {}
        if old > size:
            return 400, "old size above the checkpoint's\n", {}
        with self.lock:
            latest_size, latest_root = self.state.get(origin, (0, EMPTY))
            if old != latest_size:
                return 409, f"{latest_size}\n", {"Content-Type": "text/x.tlog.size"}
            if size == 0 and root != EMPTY:
                return 422, "a size-zero checkpoint's root is the empty tree's\n", {}
            if old == 0 and proof:
                return 422, "no proof from the empty tree\n", {}
            if old == size and root != latest_root:
                return 422, "two roots for one size\n", {}
            if 0 < old < size and not consistent(old, size, proof, latest_root, root):
                return 422, "the consistency proof does not verify\n", {}
            self.state[origin] = (size, root)
        return 200, cosignature_line(checkpoint_text, self.name, self.key, int(time.time())), {}


@contextmanager
def serving(witness: SpecWitness) -> Iterator[str]:
    """The witness's submission prefix (http://127.0.0.1:PORT) while the context lasts."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/add-checkpoint":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status, text, headers = witness.answer(body)
            data = text.encode()
            self.send_response(status)
            for name, value in {"Content-Type": "text/plain; charset=utf-8", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def post_checkpoint(prefix: str, old: int, proof: list[bytes], note: str) -> tuple[int, str, dict[str, str]]:
    """A tlog-witness request, as a log sends it: old size line, proof lines, a blank line, the checkpoint."""
    body = f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof) + "\n" + note
    request = urllib.request.Request(prefix + "/add-checkpoint", data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)
