"""The parts behind fewer steps per token, each on its own: the prefix cache's keys, hits and eviction, prompt
lookup, forced tokens from a mask, and who drafts what (engine/prefix_cache.py, decoding/prompt_lookup.py,
constraints/forced.py, engine/drafting.py). The end-to-end exactness is checked on the real model in
tests/integration/test_fewer_steps_real.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from proctor.config import Settings
from proctor.constraints.backend import bitmask_words
from proctor.constraints.forced import accepted_prefix, forced_tokens, single_allowed
from proctor.decoding.prompt_lookup import PromptLookup
from proctor.domain.output_budget import OutputBudget
from proctor.domain.request import Speculation
from proctor.engine.drafting import Drafter, DraftPolicy
from proctor.engine.prefix_cache import CachedChunk, PrefixCache

CHUNK = 4


def chunk(tokens: list[int], fill: float = 1.0) -> CachedChunk:
    keys = torch.full((2, 1, len(tokens), 8), fill, dtype=torch.float16)
    return CachedChunk(tuple(tokens), keys, keys.clone())


def cache(budget_chunks: float = 100) -> PrefixCache:
    return PrefixCache(int(budget_chunks * chunk([0] * CHUNK).nbytes), "weights:q4", CHUNK)


def fill(store: PrefixCache, scope: str, prompt: list[int]) -> list[bytes]:
    keys = store.chain(scope, prompt)
    for index in range(len(keys)):
        store.store(keys[:index + 1], chunk(prompt[index * CHUNK:(index + 1) * CHUNK], float(index)))
    return keys


def test_a_prompt_reuses_only_full_chunks_before_its_last_token() -> None:
    store = cache()
    prompt = list(range(1, 13))  # three full chunks
    keys = fill(store, "", prompt)
    assert len(keys) == 3
    assert len(store.lookup(keys, prompt)) == 2  # the last token's chunk is always prefilled
    longer = [*prompt, 99]
    assert [c.tokens for c in store.lookup(store.chain("", longer), longer)] == [(1, 2, 3, 4), (5, 6, 7, 8),
                                                                                (9, 10, 11, 12)]
    assert store.lookup(store.chain("", prompt[:4]), prompt[:4]) == []  # a prompt of one chunk: nothing reused


def test_a_chunk_is_keyed_by_everything_before_it_and_the_scope() -> None:
    store = cache()
    fill(store, "alice", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    same_second_chunk = [0, 2, 3, 4, 5, 6, 7, 8, 9]  # the second chunk's tokens match, the first does not
    assert store.lookup(store.chain("alice", same_second_chunk), same_second_chunk) == []
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert store.lookup(store.chain("bob", prompt), prompt) == []  # another caller's namespace
    other_model = PrefixCache(store.capacity_bytes, "weights:q8", CHUNK)
    assert other_model.chain("alice", prompt) != store.chain("alice", prompt)
    assert len(store.lookup(store.chain("alice", prompt), prompt)) == 2
    assert store.counts.hit_tokens == 8


def test_a_hash_that_names_other_tokens_is_never_reused() -> None:
    store = cache()
    prompt = [1, 2, 3, 4, 5]
    keys = store.chain("", prompt)
    store.store(keys[:1], chunk([7, 7, 7, 7]))  # a forged collision: the key of one chunk, the tokens of another
    assert store.lookup(keys, prompt) == []


def test_eviction_keeps_the_budget_and_the_first_chunks_of_a_chain() -> None:
    store = cache(budget_chunks=3)
    fill(store, "", list(range(100, 113)))  # three chunks
    fill(store, "", list(range(200, 209)))  # two more: two of the first prompt's leave
    assert store.counts.bytes <= store.capacity_bytes
    assert store.counts.evicted_chunks == 2
    first = list(range(100, 113))
    kept = store.lookup(store.chain("", first), first)
    assert [c.tokens for c in kept] == [(100, 101, 102, 103)]  # its first chunk outlived its later ones
    second = list(range(200, 209))
    assert len(store.lookup(store.chain("", second), second)) == 2


def test_prompt_lookup_drafts_what_followed_the_latest_earlier_occurrence() -> None:
    lookup = PromptLookup([5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3])
    assert lookup.draft([], 3) == []  # "7 3" and "3" alone: no earlier bigram
    assert lookup.draft([5, 6], 3) == [7, 3, 5]  # "5 6" last followed by "7 3", then the output goes on
    assert lookup.draft([5, 6, 7], 2) == [3, 5]
    assert lookup.draft([5, 6, 7, 4], 2) == []


class MaskOnly:
    """A matcher without a forced-token API: a fixed path of tokens, each the only one allowed."""

    def __init__(self, path: list[int], vocab: int) -> None:
        self.path, self.at, self.vocab = path, 0, vocab

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        if self.at < len(self.path):
            token = self.path[self.at]
            value = 1 << (token % 32)
            bitmask[row, token // 32] = value - (1 << 32) if value >= 1 << 31 else value
        else:
            bitmask[row] = -1  # free choice after the path

    def advance(self, token: int) -> bool:
        if self.at < len(self.path) and token != self.path[self.at]:
            raise AssertionError("advanced with a token the mask forbids")
        self.at += 1
        return True

    def must_end(self) -> bool:
        return False

    def rollback(self, tokens: int) -> None:
        self.at -= tokens


def test_forced_tokens_from_the_mask_leave_the_matcher_where_it_was() -> None:
    matcher = MaskOnly([40, 63, 100], vocab=128)
    assert forced_tokens(matcher, 16, 128) == [40, 63, 100]
    assert matcher.at == 0
    assert forced_tokens(matcher, 2, 128) == [40, 63]
    matcher.at = 3
    assert forced_tokens(matcher, 16, 128) == []  # a free choice: nothing forced


def test_a_looked_up_draft_is_cut_where_the_mask_forbids_without_advancing_past_it() -> None:
    matcher = MaskOnly([40, 63, 100], vocab=128)
    assert accepted_prefix(matcher, [40, 63, 7, 100], 128) == [40, 63]  # MaskOnly raises on a forbidden advance
    assert matcher.at == 0


def test_single_allowed_reads_one_bit_only() -> None:
    words = torch.zeros(bitmask_words(100), dtype=torch.int32)
    assert single_allowed(words) is None
    words[2] = 1 << 5
    assert single_allowed(words) == 69
    words[0] = 1
    assert single_allowed(words) is None
    words[0] = 0
    words[2] = 3
    assert single_allowed(words) is None


def test_speculation_follows_the_request_then_the_server() -> None:
    def state(speculation: str) -> Any:
        return SimpleNamespace(request=SimpleNamespace(speculation=speculation))

    auto = DraftPolicy.from_settings(Settings(speculation="auto", speculation_max_rows=2))
    assert auto.speculates(state(Speculation.DEFAULT), rows=2)
    assert not auto.speculates(state(Speculation.DEFAULT), rows=3)
    assert auto.speculates(state(Speculation.ON), rows=16)
    assert not auto.speculates(state(Speculation.OFF), rows=1)
    assert not DraftPolicy.from_settings(Settings(speculation="off")).speculates(state(Speculation.DEFAULT), rows=1)
    assert DraftPolicy.from_settings(Settings(speculation="on")).speculates(state(Speculation.DEFAULT), rows=32)


def test_a_mask_is_asked_for_forced_tokens_only_after_a_forced_step() -> None:
    """Without a forced-token API, asking costs a mask fill: only after a step the masks forced."""
    drafter = Drafter(DraftPolicy.from_settings(Settings(speculation="off")), 128)

    def state(last_forced: bool) -> Any:
        return SimpleNamespace(output_budget=OutputBudget(50), generated=[1], finished=False,
                               matcher=MaskOnly([40, 63], 128), last_forced=last_forced, closing_draft=lambda limit: [],
                               request=SimpleNamespace(speculation=Speculation.DEFAULT))

    assert drafter.draft(state(last_forced=False), rows=1) == []
    assert drafter.draft(state(last_forced=True), rows=1) == [40, 63]


def test_an_erased_subjects_chunks_leave_the_cache_and_a_fresh_ones_wait_for_its_key(tmp_path: Any) -> None:
    """Issue 54: an erasure reaches the prefix cache (audit/memory_erasure.py reads the real key store)."""
    import time

    from proctor.audit.keystore import FileKeyStore
    from proctor.audit.memory_erasure import GRACE_S, MemoryErasure

    store = cache()
    keys = FileKeyStore(tmp_path / "keys")
    alice_key, _ = keys.key_for("alice", "2026-12-07", "svc")
    keys.key_for("bob", "2026-12-07", "svc")
    now = time.monotonic()
    # carol: her first call runs (no key yet); dave: a key made and destroyed before the server ever read it
    for subject, first, stored_at in (("alice", 1, now), ("bob", 100, now), ("carol", 200, now),
                                      ("dave", 300, now - GRACE_S - 1)):
        prompt = list(range(first, first + 9))
        chain = store.chain("svc", prompt)
        for index in range(2):
            tokens = tuple(prompt[index * CHUNK:(index + 1) * CHUNK])
            store.store(chain[:index + 1], CachedChunk(tokens, chunk(list(tokens)).keys, chunk(list(tokens)).values,
                                                       subject, stored_at))
    watcher = MemoryErasure(keys, store.forget)
    before = store.counts.bytes
    assert watcher.poll(now) == 2  # dave's, old enough; every other subject has a key or is too fresh to tell
    keys.destroy(alice_key)
    assert watcher.poll(now) == 2  # alice lost her key since the last reading: at once, however fresh
    alice = list(range(1, 10))
    assert store.lookup(store.chain("svc", alice), alice) == []
    bob = list(range(100, 109))
    assert len(store.lookup(store.chain("svc", bob), bob)) == 2
    assert store.counts.bytes == before - 4 * chunk([0] * CHUNK).nbytes and store.counts.forgotten_chunks == 4
    assert watcher.poll(now) == 0
    assert watcher.poll(now + GRACE_S + 1) == 2  # carol's, past the grace with still no key
