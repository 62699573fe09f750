"""Repetition, presence, frequency and no-repeat-n-gram penalties, with incremental per-request state.

Conventions (documented in the API): the repetition penalty (Hugging Face/CTRL style: divide
positive logits, multiply negative ones) and the no-repeat-n-gram ban look at prompt + output,
as ``transformers`` does, so greedy output equals ``generate()``; presence and frequency
penalties (OpenAI style) count only generated tokens.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from proctor.domain import SamplingParams


class PenaltyState:
    """What the penalties need to know about one sequence, updated once per committed token."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab_size: int) -> None:
        self.params = params
        self._vocab_size = vocab_size
        self._seen: set[int] = set(prompt_ids)
        self._counts: dict[int, int] = {}
        self._n = params.no_repeat_ngram_size
        self._history: list[int] = list(prompt_ids) if self._n > 0 else []
        self._ngrams: defaultdict[tuple[int, ...], set[int]] = defaultdict(set)
        if self._n > 0:
            for i in range(len(self._history) - self._n + 1):
                gram = self._history[i : i + self._n]
                self._ngrams[tuple(gram[:-1])].add(gram[-1])

    def commit(self, token_id: int) -> None:
        self._seen.add(token_id)
        self._counts[token_id] = self._counts.get(token_id, 0) + 1
        if self._n > 0:
            self._history.append(token_id)
            if len(self._history) >= self._n:
                gram = self._history[-self._n :]
                self._ngrams[tuple(gram[:-1])].add(gram[-1])

    def apply(self, row: torch.Tensor) -> None:
        """Penalise one row of logits in place."""
        p = self.params
        if p.repetition_penalty != 1.0 and self._seen:
            ids = torch.tensor(sorted(self._seen), dtype=torch.long, device=row.device)
            ids = ids[ids < row.shape[-1]]
            score = row[ids]
            row[ids] = torch.where(score < 0, score * p.repetition_penalty, score / p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self._counts:
            ids = torch.tensor(list(self._counts), dtype=torch.long, device=row.device)
            counts = torch.tensor(list(self._counts.values()), dtype=row.dtype, device=row.device)
            row[ids] -= p.presence_penalty + p.frequency_penalty * counts
        if self._n > 0 and len(self._history) >= self._n - 1:
            banned = self._ngrams.get(tuple(self._history[len(self._history) - self._n + 1 :]))
            if banned:
                row[torch.tensor(sorted(banned), dtype=torch.long, device=row.device)] = float("-inf")
