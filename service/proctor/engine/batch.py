"""The running batch: which request is in which KV-cache slot (the only module that knows).

Row ``i`` of every step is slot ``i``. Requests join by a prefill into the next free slot and leave
by moving the last row into their place, so the running rows are always ``0..B-1`` and a decode
step needs no gather. Each prompt is prefilled on its own: a forward over a whole prompt already
runs at matrix-product speed on CPU, and a prompt's cache then never depends on its companions.

A prompt longer than ``chunk_tokens`` is *staged* instead: prefilled ``chunk_tokens`` at a time into a
one-slot staging cache, one chunk per engine step between the running rows' decode steps, and moved
into the next free slot when its last chunk is done. A long prompt then delays the running rows by
one chunk per step instead of its whole prefill. The chunk boundaries depend only on the prompt's
length, so its logits are the same whatever else runs. The same grid makes the prefix cache exact
(engine/prefix_cache.py): a staged prompt takes its first full chunks from the cache when they are there,
and leaves the chunks it computes there for the next prompt that starts the same way.

A decode step may also *extend* rows by several tokens (``extend``: a draft to verify, engine/drafting.py);
``settle`` then keeps the positions the verification accepted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from proctor.engine.llama_step import LlamaSlots
from proctor.engine.model_runner import SlotRunner
from proctor.engine.prefix_cache import CachedChunk, PrefixCache
from proctor.engine.sequence import SequenceState


class DecodeBatch:
    def __init__(self, make_runner: Callable[[], SlotRunner], max_rows: int, kv_budget_bytes: int,
                 chunk_tokens: int = 0, prefix_cache: PrefixCache | None = None) -> None:
        self._make_runner = make_runner
        self._runner_built: SlotRunner | None = None
        self.max_rows = max_rows
        self.kv_budget_bytes = kv_budget_bytes
        self.chunk_tokens = chunk_tokens  # 0: every prompt prefilled whole
        self.states: list[SequenceState] = []
        self.staged: list[SequenceState] = []  # long prompts waiting for or in their chunked prefill, oldest first
        self._staging: LlamaSlots | None = None  # the one-slot runner of staged[0]
        self._staged_tokens = 0  # prompt tokens of staged[0] already prefilled
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        self._chain: list[bytes] = []  # staged[0]'s chunk keys in the prefix cache (empty: not cached)
        self._fed: list[int] = []  # tokens each row was fed by the last extend

    @property
    def _runner(self) -> SlotRunner:
        """Built on first use, which is on the engine thread: oneDNN weights packed on one thread and
        used from another were measured 1.6x slower on the 2-core machine."""
        if self._runner_built is None:
            self._runner_built = self._make_runner()
        return self._runner_built

    def __len__(self) -> int:
        return len(self.states)

    def thread_invariant(self) -> bool:
        """Whether the runner gives a row the same logits at any intra-op thread count (builds it)."""
        return bool(getattr(self._runner, "thread_invariant", False))

    def held_bytes(self) -> int:
        """KV-cache bytes the running requests' tokens occupy (metrics; read from any thread)."""
        runner = self._runner_built
        per_token = getattr(runner, "bytes_per_token", 0)
        return per_token * (sum(len(s.prompt_ids) + len(s.generated) for s in list(self.states))
                            + (self._staged_tokens if self.staged else 0))

    def fits(self, joining: list[SequenceState], leaving: set[int] | None = None) -> bool:
        """Whether the cache for the running rows plus ``joining`` stays within the memory budget.

        Each request reserves its prompt plus ``max_new_tokens``, so a request admitted never runs
        out of cache. A request alone in the batch is always admitted (its size was validated)."""
        everyone = [s for s in self.states + self.staged if not leaving or id(s) not in leaving] + joining
        if len(everyone) > self.max_rows:
            return False
        if len(everyone) <= 1:
            return True
        longest = max(len(s.prompt_ids) + s.max_new_tokens for s in everyone)
        return self._runner.bytes_for(len(everyone), longest) <= self.kv_budget_bytes

    def decode(self) -> torch.Tensor:
        """Feed every running row its last token; return next-token logits [B, V]."""
        return self._runner.decode([s.generated[-1] for s in self.states])

    @property
    def can_extend(self) -> bool:
        """Whether the runner feeds several tokens to a row in one forward with each position's bits those of its
        own decode step (drafts are verified only then): the slot forward on CPU, where every product and
        attention is row by row (tests/unit/test_extend.py). On CUDA the libraries choose their kernels by the
        batch's shape, so an extend is not known to keep a row's bits: stepwise there."""
        runner = self._runner
        return isinstance(runner, LlamaSlots) and runner.device.type == "cpu"

    def extend(self, drafts: list[list[int]]) -> torch.Tensor:
        """Feed every running row its last token and its draft; return every fed position's logits, row by row."""
        runner = self._runner
        assert isinstance(runner, LlamaSlots)  # can_extend
        feeds = [[state.generated[-1], *draft] for state, draft in zip(self.states, drafts, strict=True)]
        self._fed = [len(feed) for feed in feeds]
        return runner.extend(feeds)

    def settle(self, kept: list[int]) -> None:
        """After ``extend``: row ``i`` keeps the first ``kept[i]`` positions it was fed (the rest were rejected)."""
        runner = self._runner
        assert isinstance(runner, LlamaSlots)
        for row, (fed, keep) in enumerate(zip(self._fed, kept, strict=True)):
            if keep < fed:
                runner.trim(row, runner.lengths[row] - fed + keep)
        self._fed = []

    def admit(self, joining: list[SequenceState]) -> torch.Tensor:
        """Prefill each joining request into the next free slot; return their logits [n, V]."""
        logits = []
        for state in joining:
            # Joined before the prefill: if it fails, the engine fails every row of the batch, this one too.
            self.states.append(state)
            logits.append(self._runner.prefill(len(self.states) - 1, state.prompt_ids))
        return torch.cat(logits)

    def needs_chunks(self, state: SequenceState) -> bool:
        """Whether ``state``'s prompt is prefilled in chunks (long, and the runner can stage)."""
        return 0 < self.chunk_tokens < len(state.prompt_ids) and isinstance(self._runner, LlamaSlots)

    def prefill_chunk(self) -> tuple[SequenceState, torch.Tensor] | None:
        """Prefill the next chunk of ``staged[0]``; once its last chunk is done it joins the running
        rows and this returns it with its logits [1, V]."""
        state, done = self.staged[0], self._staged_tokens
        runner = self._runner
        assert isinstance(runner, LlamaSlots)  # needs_chunks staged it
        if self._staging is None:
            self._staging = runner.staging()
        staging = self._staging
        if done == 0:
            done = self._staged_tokens = self._from_cache(state, staging)
        chunk = state.prompt_ids[done:done + self.chunk_tokens]
        logits = staging.prefill(0, chunk, done)
        self._staged_tokens += len(chunk)
        index = done // self.chunk_tokens
        if self.prefix_cache is not None and index < len(self._chain):  # a full chunk: kept for later prompts
            self.prefix_cache.store(self._chain[:index + 1], CachedChunk(tuple(chunk), *staging.read_span(
                0, done, done + len(chunk))))
        if self._staged_tokens < len(state.prompt_ids):
            return None
        self.staged.pop(0)
        self._staged_tokens = 0
        self._chain = []
        self.states.append(state)
        runner.adopt(self._staging, len(self.states) - 1)
        return state, logits

    def _from_cache(self, state: SequenceState, staging: LlamaSlots) -> int:
        """Put the cached chunks that begin ``state``'s prompt into the staging slot; the tokens they cover."""
        cache, scope = self.prefix_cache, state.request.prefix_cache_scope
        self._chain = []
        if cache is None or scope is None:
            return 0
        self._chain = cache.chain(scope, state.prompt_ids)
        start = 0
        for chunk in cache.lookup(self._chain, state.prompt_ids):
            staging.write_span(0, start, chunk.keys, chunk.values)
            start += len(chunk.tokens)
        state.cached_prompt_tokens = start
        return start

    def drop_staged(self, state: SequenceState) -> None:
        """Take a staged request out (cancelled or expired before it joined)."""
        if self.staged and self.staged[0] is state:
            self._staged_tokens = 0
            self._chain = []
            if self._staging is not None:
                self._staging.free(0)
        self.staged.remove(state)

    def remove(self, rows: list[int]) -> None:
        """Free the slots of these rows; the last running row moves into each hole."""
        for row in sorted(rows, reverse=True):
            last = len(self.states) - 1
            if row != last:
                self._runner.move(last, row)
                self.states[row] = self.states[last]
            else:
                self._runner.free(row)
            self.states.pop()

    def clear(self) -> None:
        for slot in range(len(self.states)):
            self._runner.free(slot)
        self.states = []
        for state in list(self.staged):
            self.drop_staged(state)
