"""RFC 9162 §2.1 Merkle tree hashing and proof verification (SHA-256), as Certificate Transparency,
Sigstore's Rekor and Go's checksum database use it.

Leaf hash ``SHA-256(0x00 || leaf)``, node hash ``SHA-256(0x01 || left || right)``, the empty tree's
root ``SHA-256("")``. The verifiers follow the RFC's algorithms step for step (§2.1.3.2 inclusion,
§2.1.4.2 consistency) and raise ``ProofError`` saying what did not hold.
"""

from __future__ import annotations

import hashlib

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(ValueError):
    """A proof that does not prove what it claims."""


def leaf_hash(leaf: bytes) -> bytes:
    digest = hashlib.sha256(b"\x00")
    digest.update(leaf)  # a large leaf is hashed without copying it behind the prefix
    return digest.digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_from_inclusion(index: int, size: int, leaf: bytes, path: list[bytes]) -> bytes:
    """The root that ``path`` proves leaf hash ``leaf`` at ``index`` of a tree of ``size`` leaves under."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not inside a tree of {size} leaves")
    _check_hashes([leaf, *path])
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            raise ProofError("the inclusion path is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the inclusion path is shorter than the tree is deep")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, path: list[bytes], root: bytes) -> None:
    """Raise ``ProofError`` unless ``path`` proves leaf hash ``leaf`` at ``index`` under ``root``."""
    if root_from_inclusion(index, size, leaf, path) != root:
        raise ProofError("the inclusion path leads to another root than the checkpoint's")


def verify_consistency(size1: int, size2: int, proof: list[bytes], root1: bytes, root2: bytes) -> None:
    """Raise ``ProofError`` unless ``proof`` shows the tree of ``size2`` (``root2``) extends the one of ``size1``."""
    _check_hashes([*proof])
    if not 0 <= size1 <= size2:
        raise ProofError(f"a tree of {size1} leaves cannot be a prefix of one of {size2}")
    if size1 == size2:
        if proof:
            raise ProofError("trees of the same size need an empty consistency proof")
        if root1 != root2:
            raise ProofError("two trees of the same size have different roots")
        return
    if size1 == 0:
        if proof:
            raise ProofError("the empty tree needs an empty consistency proof")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = [root1, *proof] if size1 & (size1 - 1) == 0 else list(proof)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is longer than the trees need")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the consistency proof is shorter than the trees need")
    if fr != root1:
        raise ProofError(f"the proof does not lead to the root of the tree of {size1} leaves")
    if sr != root2:
        raise ProofError(f"the proof does not lead to the root of the tree of {size2} leaves")


def _check_hashes(hashes: list[bytes]) -> None:
    for value in hashes:
        if len(value) != HASH_SIZE:
            raise ProofError(f"a hash of {len(value)} bytes, not {HASH_SIZE}")
