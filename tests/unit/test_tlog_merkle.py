"""The audit log's Merkle tree against published RFC 6962/9162 vectors and an independent implementation.

The vectors are Certificate Transparency's, as transparency-dev/merkle tests against them
(proof/verify_test.go: the 8 leaves, the roots of the trees of 1..8 of them, and the inclusion and
consistency proofs listed there; the same ones as in google/certificate-transparency's C++ tests).
The independent implementation below is written from the RFC 9162 §2.1 text alone (recursive
MTH, PATH, PROOF) and shares no code with ``proctor.audit.tree`` or ``proctor_client.tlog``.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proctor.audit.tree import (
    CompactRange,
    TreeError,
    border_keys,
    consistency_proof,
    inclusion_proof,
    leaves_for,
    node_id,
    nodes_for,
    post_order,
    root,
    stored,
    tree_size,
)
from proctor_client.tlog.merkle import (
    EMPTY_ROOT,
    ProofError,
    leaf_hash,
    root_from_inclusion,
    verify_consistency,
    verify_inclusion,
)

h = bytes.fromhex
LEAVES = [h(""), h("00"), h("10"), h("2021"), h("3031"), h("40414243"), h("5051525354555657"),
          h("606162636465666768696a6b6c6d6e6f")]
ROOTS = [h(x) for x in (  # the root of the tree of the first 1, 2, ... 8 leaves
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")]
INCLUSION = [  # (leaf index, tree size, path)
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (1, 5, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
    (0, 1, []),
]
CONSISTENCY = [  # (old size, new size, proof)
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
    (6, 7, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
]


# --- RFC 9162 §2.1, written from its text and nothing else -------------------------------------
def rfc_mth(d: list[bytes]) -> bytes:
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = 1
    while k * 2 < len(d):
        k *= 2
    return hashlib.sha256(b"\x01" + rfc_mth(d[:k]) + rfc_mth(d[k:])).digest()


def rfc_path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = 1
    while k * 2 < len(d):
        k *= 2
    if m < k:
        return [*rfc_path(m, d[:k]), rfc_mth(d[k:])]
    return [*rfc_path(m - k, d[k:]), rfc_mth(d[:k])]


def rfc_subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    if m == len(d):
        return [] if b else [rfc_mth(d)]
    k = 1
    while k * 2 < len(d):
        k *= 2
    if m <= k:
        return [*rfc_subproof(m, d[:k], b), rfc_mth(d[k:])]
    return [*rfc_subproof(m - k, d[k:], False), rfc_mth(d[:k])]


# --- the stored-node tree, as the stores keep it ------------------------------------------------
def stored_tree(leaves: list[bytes]) -> dict[tuple[int, int], bytes]:
    """Every complete node, appended one leaf at a time as the writer does (border read back each time)."""
    nodes: dict[tuple[int, int], bytes] = {}
    for size, leaf in enumerate(leaves):
        border = [nodes[key] for key in border_keys(size)]
        compact = CompactRange(size, border)
        compact.append(leaf_hash(leaf))
        nodes.update({(level, index): digest for level, index, digest in compact.nodes})
    return nodes


def lookup_in(nodes: dict[tuple[int, int], bytes]):  # type: ignore[no-untyped-def]
    return lambda keys: {key: nodes[key] for key in keys if key in nodes}


def test_published_roots_and_the_empty_tree() -> None:
    nodes = stored_tree(LEAVES)
    empty = h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    assert root(0, lookup_in(nodes)) == EMPTY_ROOT == empty
    assert [root(n, lookup_in(nodes)) for n in range(1, 9)] == ROOTS
    assert [rfc_mth(LEAVES[:n]) for n in range(1, 9)] == ROOTS


@pytest.mark.parametrize(("index", "size", "path"), INCLUSION)
def test_published_inclusion_proofs(index: int, size: int, path: list[str]) -> None:
    proof = [h(x) for x in path]
    assert inclusion_proof(index, size, lookup_in(stored_tree(LEAVES))) == proof
    verify_inclusion(index, size, leaf_hash(LEAVES[index]), proof, ROOTS[size - 1])
    for bad_index, bad_size, bad_proof in ((index + 1, size, proof), (index, size * 2, proof),
                                           (index, size, [*proof, ROOTS[0]]), (index, size, proof[:-1])):
        if proof or bad_proof:
            with pytest.raises(ProofError):
                verify_inclusion(bad_index, bad_size, leaf_hash(LEAVES[index]), bad_proof, ROOTS[size - 1])
    for position in range(len(proof)):
        flipped = [bytes([p[0] ^ 8]) + p[1:] if i == position else p for i, p in enumerate(proof)]
        with pytest.raises(ProofError):
            verify_inclusion(index, size, leaf_hash(LEAVES[index]), flipped, ROOTS[size - 1])


@pytest.mark.parametrize(("old", "new", "path"), CONSISTENCY)
def test_published_consistency_proofs(old: int, new: int, path: list[str]) -> None:
    proof = [h(x) for x in path]
    assert consistency_proof(old, new, lookup_in(stored_tree(LEAVES))) == proof
    verify_consistency(old, new, proof, ROOTS[old - 1], ROOTS[new - 1])
    if not proof:
        return
    for bad in ([], proof[:-1], [*proof, ROOTS[0]], [proof[0], *proof]):
        with pytest.raises(ProofError):
            verify_consistency(old, new, bad, ROOTS[old - 1], ROOTS[new - 1])
    with pytest.raises(ProofError):
        verify_consistency(old, new, proof, ROOTS[new - 1], ROOTS[old - 1])  # swapped roots
    for position in range(len(proof)):
        flipped = [bytes([p[0] ^ 16]) + p[1:] if i == position else p for i, p in enumerate(proof)]
        with pytest.raises(ProofError):
            verify_consistency(old, new, flipped, ROOTS[old - 1], ROOTS[new - 1])


def test_every_pair_of_the_eight_leaf_tree() -> None:
    nodes = lookup_in(stored_tree(LEAVES))
    for new in range(1, 9):
        for index in range(new):
            path = inclusion_proof(index, new, nodes)
            assert path == rfc_path(index, LEAVES[:new])
            assert root_from_inclusion(index, new, leaf_hash(LEAVES[index]), path) == ROOTS[new - 1]
        for old in range(1, new + 1):
            proof = consistency_proof(old, new, nodes)
            assert proof == rfc_subproof(old, LEAVES[:new], True)
            verify_consistency(old, new, proof, ROOTS[old - 1], ROOTS[new - 1])


def test_trivial_and_impossible_proofs() -> None:
    one = leaf_hash(b"data")
    verify_inclusion(0, 1, one, [], one)
    for index, size in ((0, 0), (1, 1), (2, 1)):
        with pytest.raises(ProofError):
            verify_inclusion(index, size, one, [], one)
    verify_consistency(0, 5, [], EMPTY_ROOT, ROOTS[4])
    verify_consistency(3, 3, [], ROOTS[2], ROOTS[2])
    for old, new, proof, r1, r2 in ((3, 3, [], ROOTS[2], ROOTS[3]), (2, 1, [], ROOTS[1], ROOTS[0]),
                                    (1, 2, [], ROOTS[0], ROOTS[1]), (0, 1, [EMPTY_ROOT], EMPTY_ROOT, ROOTS[0])):
        with pytest.raises(ProofError):
            verify_consistency(old, new, proof, r1, r2)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 2000), data=st.data())
def test_random_logs_match_the_rfc_text(size: int, data: st.DataObject) -> None:
    leaves = [size.to_bytes(2, "big") + i.to_bytes(4, "big") for i in range(size)]
    nodes = lookup_in(stored_tree(leaves))
    new = data.draw(st.integers(1, size), label="new")
    old = data.draw(st.integers(1, new), label="old")
    index = data.draw(st.integers(0, new - 1), label="index")
    root_new, root_old = rfc_mth(leaves[:new]), rfc_mth(leaves[:old])
    assert root(new, nodes) == root_new and root(old, nodes) == root_old
    path = inclusion_proof(index, new, nodes)
    assert path == rfc_path(index, leaves[:new])
    verify_inclusion(index, new, leaf_hash(leaves[index]), path, root_new)
    proof = consistency_proof(old, new, nodes)
    assert proof == rfc_subproof(old, leaves[:new], True)
    verify_consistency(old, new, proof, root_old, root_new)
    if old < new:
        with pytest.raises(ProofError):
            verify_consistency(old, new, proof, root_old, rfc_mth(leaves[:new - 1]) if new - 1 > old else EMPTY_ROOT)


@settings(max_examples=200, deadline=None)
@given(before=st.integers(0, 300), batches=st.lists(st.integers(0, 70), min_size=1, max_size=4))
def test_appending_many_leaves_at_once_gives_the_same_tree(before: int, batches: list[int]) -> None:
    """``CompactRange.extend`` (the first-start build's bulk path) against ``append`` leaf by leaf."""
    leaves = [leaf_hash(i.to_bytes(4, "big")) for i in range(before + sum(batches))]
    one, bulk = CompactRange(0, []), CompactRange(0, [])
    for digest in leaves[:before]:
        one.append(digest)
        bulk.append(digest)
    done = before
    for count in batches:
        for digest in leaves[done:done + count]:
            one.append(digest)
        bulk.extend(leaves[done:done + count])
        done += count
        assert (bulk.size, bulk.root()) == (one.size, one.root())
    assert sorted(bulk.nodes) == sorted(one.nodes)
    assert bulk.root() == rfc_mth([i.to_bytes(4, "big") for i in range(done)])


# --- where the stores keep each node: its post-order number --------------------------------------
@given(size=st.integers(0, 2000))
def test_nodes_are_numbered_in_the_order_leaves_complete_them(size: int) -> None:
    """``node_id`` of the nodes ``append`` completes, leaf after leaf, is 0, 1, 2, … (every insert appends), and
    ``post_order`` lists them in that order; the node count of a size gives the size back."""
    compact = CompactRange(0, [])
    for i in range(size):
        compact.append(leaf_hash(i.to_bytes(4, "big")))
    assert [node_id(level, index) for level, index, _ in compact.nodes] == list(range(len(compact.nodes)))
    assert [(level, index) for level, index, _ in compact.nodes] == list(post_order(0, size))
    assert len(compact.nodes) == nodes_for(size) and leaves_for(nodes_for(size)) == size == tree_size(nodes_for(size))
    if size:  # a tree that ends inside a leaf's nodes (its last parent removed) is refused, and counted short
        cut = nodes_for(size) - 1
        assert leaves_for(cut) == size - 1
        if cut != nodes_for(size - 1):
            with pytest.raises(TreeError, match="ends inside the nodes of leaf"):
                tree_size(cut)


def test_bulk_nodes_are_stored_in_id_order() -> None:
    """``stored`` puts ``extend``'s level-by-level nodes in id order (the build's inserts append too)."""
    bulk = CompactRange(0, [])
    bulk.extend([leaf_hash(bytes([i])) for i in range(37)])
    assert [id_ for id_, _ in stored(bulk.nodes)] == list(range(nodes_for(37)))
