"""The running batch: which request is in which KV-cache slot (the only module that knows), and the step's forward.

Row ``i`` is slot ``i``. A request takes the next free slot when it joins, whether its prompt is fed whole
this step or in pieces over several (status PREFILLING until its last prompt token is in), and leaves by
moving the last row into its place, so the rows are always ``0..B-1``.

Every step is one ``forward`` over the feeds the scheduler planned (engine/scheduler.py): pieces of prompts,
the running rows' last tokens, and drafts. The plan reads the batch (``fits``, ``prefix_hit``) and changes nothing;
the engine applies it here (``join``, ``join_search``, ``remove``).

On the slot forward every position is a row of its own, so a prompt's keys, values and logits are the same bits
however it is split and whatever else shares the step (tests/unit/test_mixed_step.py). The prefix cache
(engine/prefix_cache.py) keeps prompts' full chunks of ``chunk_tokens`` as they are computed, and hands them back
to a later prompt that starts the same way before its first feed.

After a feed with a draft, ``settle`` keeps the positions the verification accepted.

A beam search (engine/beam.py) holds one slot per beam, taken from the top of the slots down, so the requests'
rows below them stay ``0..B-1``; when a search leaves, the searches below it move up into its slots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from proctor.engine.prefix_cache import CachedChunk, PrefixCache
from proctor.engine.sequence import SequenceState
from proctor.executor.protocol import Capabilities, Executor, Feed


class BeamRows(Protocol):
    """A beam search as the batch, the step plan and the update pass see it (engine/beam.BeamSearch)."""

    host: SequenceState
    slots: list[int]  # its beams' cache slots
    parents: list[int]  # after a selection: the beam each running one continues

    @property
    def num_beams(self) -> int: ...

    def lane_tokens(self) -> list[int]: ...

    def first(self, logits: torch.Tensor) -> bool: ...

    def next(self, logits: torch.Tensor) -> bool: ...


@dataclass(frozen=True, slots=True)
class RowFeed:
    """What one row is fed this step: a piece of its prompt (``prompt`` True; ``completes``: its last piece), or
    its last token and a draft. ``beam``: the row is that beam of ``state``'s search (its prompt: beam 0)."""

    state: SequenceState
    tokens: list[int]
    prompt: bool
    completes: bool = False
    beam: int | None = None

    @classmethod
    def piece(cls, state: SequenceState, tokens: list[int], beam: int | None = None, fed: int | None = None) -> RowFeed:
        """The next ``tokens`` of ``state``'s prompt (decided before the forward moves ``prompt_fed``; ``fed``: its
        tokens in the cache when it joins this step, else its ``prompt_fed``)."""
        start = state.prompt_fed if fed is None else fed
        return cls(state, tokens, prompt=True, completes=start + len(tokens) == len(state.prompt_ids), beam=beam)

    @property
    def logits(self) -> int:
        """Positions whose logits the update reads: every fed one of a draft, a prompt's last, else none."""
        return int(self.completes) if self.prompt else len(self.tokens)


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """What the prefix cache holds of a joining prompt: read by the step plan (``DecodeBatch.prefix_hit``, nothing
    changed), written into its slot when the engine applies the plan (``join``). ``chain``: the prompt's chunk keys
    (empty: the request neither reads nor leaves anything there)."""

    chain: tuple[bytes, ...] = ()
    chunks: tuple[CachedChunk, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(len(chunk.tokens) for chunk in self.chunks)


class DecodeBatch:
    def __init__(self, make_executor: Callable[[], Executor], max_rows: int, kv_capacity_bytes: int,
                 chunk_tokens: int = 0, prefix_cache: PrefixCache | None = None) -> None:
        self._make_executor = make_executor
        self._executor_built: Executor | None = None
        self._build_failure: Exception | None = None  # the executor could not be built (the engine fails requests)
        self.max_rows = max_rows
        self.kv_capacity_bytes = kv_capacity_bytes
        self.chunk_tokens = chunk_tokens  # the prefix cache's chunk (0: no prefix cache)
        self.states: list[SequenceState] = []  # row i = slot i; prompts still being fed included
        self.searches: list[BeamRows] = []  # beam searches, the first in the top slots, each below the last
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        self._chains: dict[int, list[bytes]] = {}  # id(state) → its prompt's chunk keys in the prefix cache
        self._fed: list[tuple[int, int]] = []  # (row, tokens) of each drafted feed of the last forward

    @property
    def _executor(self) -> Executor:
        """Built on first use, which is on the engine thread: oneDNN weights packed on one thread and
        used from another were measured 1.6x slower on the 2-core machine."""
        if self._executor_built is None:
            if self._build_failure is not None:  # a build that failed fails the same way: not rebuilt every step
                raise self._build_failure
            try:
                self._executor_built = self._make_executor()
            except Exception as exc:
                self._build_failure = exc
                raise
        return self._executor_built

    @property
    def capabilities(self) -> Capabilities:
        return self._executor.capabilities

    def __len__(self) -> int:
        return len(self.states)

    def thread_invariant(self) -> bool:
        """Whether the executor gives a row the same logits at any intra-op thread count (builds it)."""
        return self.capabilities.thread_invariant

    def held_bytes(self) -> int:
        """KV-cache bytes the requests' tokens occupy (metrics; read from any thread)."""
        executor = self._executor_built
        if executor is None:
            return 0
        beams = sum(executor.lengths[slot] for search in list(self.searches) for slot in search.slots)
        return executor.bytes_per_token * (sum(s.prompt_fed + len(s.generated) for s in list(self.states)) + beams)

    def prefix_blocks(self) -> tuple[int, int] | None:
        """The prefix cache's chunk (tokens) and how many chunks it holds (metrics; read from any thread); (0, 0)
        when prompts are not reused here, None before the executor is built (a chunk's bytes are not known yet)."""
        executor = self._executor_built
        if executor is None:
            return None
        cache = self.prefix_cache
        if cache is None or not executor.capabilities.spans:
            return 0, 0
        return cache.chunk_tokens, cache.capacity_chunks(executor.bytes_per_token)

    def free_rows(self) -> int:
        """Rows no request or beam holds (read from any thread: a hint)."""
        return self.max_rows - len(self.states) - sum(search.num_beams for search in list(self.searches))

    def fits(self, joining: list[SequenceState], leaving: frozenset[int] = frozenset()) -> bool:
        """Whether the rows plus ``joining`` fit the batch (a beam request takes a row a beam) and their cache
        stays within the memory budget, once the requests ``leaving`` (by ``id``) are gone.

        Each request reserves its prompt plus ``max_new_tokens`` in each of its rows, so a request admitted
        never runs out of cache. A request alone in the batch is always admitted (its size was validated)."""
        held = [*self.states, *(search.host for search in self.searches)]
        everyone = [*(state for state in held if id(state) not in leaving), *joining]
        if sum(_rows(state) for state in everyone) > self.max_rows:
            return False
        if len(everyone) <= 1:
            return True
        lengths = [len(s.prompt_ids) + s.output_budget.max_new_tokens for s in everyone for _ in range(_rows(s))]
        return self._executor.bytes_for(lengths) <= self.kv_capacity_bytes

    def prefix_hit(self, state: SequenceState) -> PrefixHit:
        """What the prefix cache holds of ``state``'s prompt now (changes nothing: the step plan asks)."""
        cache, scope = self.prefix_cache, state.request.prefix_cache_scope
        if cache is None or scope is None or not self.capabilities.spans:
            return PrefixHit()
        chain = cache.chain(scope, state.prompt_ids)
        return PrefixHit(tuple(chain), tuple(cache.peek(chain, state.prompt_ids)))

    def join(self, state: SequenceState, hit: PrefixHit) -> None:
        """Give ``state`` the next free slot; its prompt starts with ``hit``, what the prefix cache held of it."""
        self.states.append(state)
        self._take_prefix(state, len(self.states) - 1, hit)

    def join_search(self, search: BeamRows, hit: PrefixHit) -> None:
        """Give a beam search a slot per beam, below the other searches' (its prompt goes into the first)."""
        low = self.max_rows - sum(other.num_beams for other in self.searches) - search.num_beams
        search.slots = list(range(low, low + search.num_beams))
        self.searches.append(search)
        self._take_prefix(search.host, search.slots[0], hit)

    def reorder_search(self, search: BeamRows, parents: list[int]) -> None:
        """Beam ``i``'s slot takes the cache of beam ``parents[i]``'s."""
        self._executor.reorder(search.slots, parents)

    def release_search(self, search: BeamRows) -> None:
        """Free a search's slots; the searches below it move up, so every search's slots stay at the top."""
        for slot in search.slots:
            self._executor.free(slot)
        self._chains.pop(id(search.host), None)
        index = self.searches.index(search)
        self.searches.pop(index)
        for below in self.searches[index:]:  # highest slots first: each target is free by the time it is written
            moved = [slot + search.num_beams for slot in below.slots]
            for source, target in zip(reversed(below.slots), reversed(moved), strict=True):
                self._executor.move(source, target)
            below.slots = moved

    def _take_prefix(self, state: SequenceState, slot: int, hit: PrefixHit) -> None:
        """Start ``state``'s prompt in ``slot`` with the chunks the plan found in the prefix cache."""
        state.prompt_fed = 0
        if self.prefix_cache is None or not hit.chain:
            return
        chain = self._chains[id(state)] = list(hit.chain)
        self.prefix_cache.use(chain, state.prompt_ids, list(hit.chunks))
        for chunk in hit.chunks:
            self._executor.write_span(slot, state.prompt_fed, chunk.keys, chunk.values)
            state.prompt_fed += len(chunk.tokens)
        state.cached_prompt_tokens = state.prompt_fed

    def forward(self, feeds: list[RowFeed]) -> torch.Tensor:
        """One forward over every feed; the logits the update reads ([sum of ``feed.logits``, V], feed by feed).
        Prompts advance by what they were fed, and leave their newly completed chunks in the prefix cache."""
        rows = {id(state): row for row, state in enumerate(self.states)}
        searches = {id(search.host): search for search in self.searches}

        def slot(feed: RowFeed) -> int:
            return rows[id(feed.state)] if feed.beam is None else searches[id(feed.state)].slots[feed.beam]

        logits = self._executor.forward([Feed(slot(feed), feed.tokens, feed.logits) for feed in feeds])
        self._fed = [(slot(feed), len(feed.tokens)) for feed in feeds if not feed.prompt and feed.beam is None]
        for feed in feeds:
            if feed.prompt:
                before = feed.state.prompt_fed
                feed.state.prompt_fed += len(feed.tokens)
                self._keep_chunks(slot(feed), feed.state, before)
        return logits

    def _keep_chunks(self, row: int, state: SequenceState, before: int) -> None:
        """Put the full chunks of ``state``'s prompt that its last feed completed into the prefix cache."""
        chain = self._chains.get(id(state))
        if self.prefix_cache is None or not chain:
            return
        size = self.chunk_tokens
        for index in range(before // size, min(state.prompt_fed // size, len(chain))):
            start = index * size
            keys, values = self._executor.read_span(row, start, start + size)
            self.prefix_cache.store(chain[:index + 1], CachedChunk(tuple(state.prompt_ids[start:start + size]),
                                                                   keys, values, state.request.subject_id))
        if state.prompt_fed == len(state.prompt_ids):
            del self._chains[id(state)]

    def settle(self, kept: list[int]) -> None:
        """After a forward with drafts: each drafted row keeps the first ``kept[i]`` positions it was fed."""
        executor = self._executor
        for (row, fed), keep in zip(self._fed, kept, strict=True):
            if keep < fed:
                executor.trim(row, executor.lengths[row] - fed + keep)
        self._fed = []

    def remove(self, rows: list[int]) -> None:
        """Free the slots of these rows; the last row moves into each hole."""
        for row in sorted(rows, reverse=True):
            self._chains.pop(id(self.states[row]), None)
            last = len(self.states) - 1
            if row != last:
                self._executor.move(last, row)
                self.states[row] = self.states[last]
            else:
                self._executor.free(row)
            self.states.pop()

    def clear(self) -> None:
        for slot in [*range(len(self.states)), *(slot for search in self.searches for slot in search.slots)]:
            self._executor.free(slot)
        self.states = []
        self.searches = []
        self._chains.clear()


def logit_rows(feeds: list[RowFeed], start: int) -> list[tuple[RowFeed, range]]:
    """Each feed with the rows of the step's logits that hold its wanted positions, the first at ``start``."""
    spans = []
    for feed in feeds:
        spans.append((feed, range(start, start + feed.logits)))
        start += feed.logits
    return spans


def _rows(state: SequenceState) -> int:
    """The batch rows a request takes: one, or one a beam."""
    return max(1, state.request.sampling.num_beams)

