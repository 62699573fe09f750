"""The slot forward's steps padded to a few row counts and replayed as CUDA graphs (issue 43).

Why: an eager step on CUDA is launch-bound. The default model's 30 layers are hundreds of small kernels, each
a few microseconds of launch for less work than that (measured on a lent H200: 14–16 ms a step at any width,
slower at one stream than this project's 2-core CPU). A graph captured once and replayed is one launch a step.
vLLM and SGLang do the same per batch size.

How:
- A step's rows (prompt pieces, decode rows and drafts alike: each position a row, as the slot forward feeds
  them) are padded to the next of ``row_buckets`` (1, 2, 4, … up to the step budget). Rows past the largest
  bucket run eagerly: the same arithmetic.
- Each bucket's inputs (token, slot, position, attended length, and which rows' logits are wanted) sit in one
  static buffer, copied in from pinned memory before a replay, and its outputs (every row's logits) in another,
  from which the wanted rows are copied out. Nothing in a step waits for the device, so the engine fills the
  constraints' masks while it computes (decoding/masks.py ``constraints_ahead``).
- Padding rows write their key and value at the cache's last position of slot 0 and attend to one position.
  No row reads a position before writing it, and a step's own rows stay below that position (``ready_for``
  keeps one spare), so the padding is never read.
- The cache holds every slot's row from the start. A graph holds the addresses of the cache and the rotary
  table: when either grows (the cache's length in steps of ``KV_GROWTH_TOKENS``), the graphs are dropped and
  each is captured again at its next use.
- The arithmetic is ``TritonStep.rows_hidden`` (triton_step.py): the kernels' products and norms with
  ``invariant_products`` (every row its own bits at any bucket), cuBLAS's without. Attention is the kernel's in
  both, so it reads each row's own prefix whatever the others' lengths.

On the CPU nothing is captured: the same padded step runs eagerly. The tests hold its padding, buffers and
re-capture to the unpadded step, bit for bit, under Triton's interpreter (tests/unit/test_graph_step.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from proctor.executor.strategies import Capture, Step
from proctor.executor.triton_step import TritonStep

log = logging.getLogger("proctor.executor")


def row_buckets(largest: int) -> tuple[int, ...]:
    """Powers of two from 1 up to ``largest`` rounded up to one: the row counts steps are padded to."""
    buckets = [1]
    while buckets[-1] < largest:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket of at least ``rows`` rows (None: more rows than the largest)."""
    return next((bucket for bucket in buckets if bucket >= rows), None)


def eager(step: Step) -> Step:
    """No capture: the step runs as it is at every call (the CPU)."""
    return step


class CudaGraphs:
    """Captures a step as a CUDA graph; every graph shares one memory pool (one replays at a time, and its
    wanted rows are copied out before the next)."""

    def __init__(self) -> None:
        self._pool = torch.cuda.graph_pool_handle()

    def __call__(self, step: Step) -> Step:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # one eager run first: Triton compiles, cuBLAS sets up its handles
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = step()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


@dataclass
class _Bucket:
    inputs: torch.Tensor  # [5, rows] on the device: token, slot, position, attended length; the wanted rows
    replay: Step


class GraphReplay:
    """The Triton step ``rows`` with its steps padded to ``row_buckets(largest_bucket)`` and replayed (``capture``:
    CUDA graphs on CUDA, eager elsewhere): the slot forward's row forward under ``graphs`` replay."""

    def __init__(self, rows: TritonStep, largest_bucket: int, capture: Capture | None = None) -> None:
        self.rows = rows
        self._cache = rows.cache
        self._device = rows.cache.device
        self.buckets = row_buckets(largest_bucket)
        self._capture: Capture = capture if capture is not None else (
            CudaGraphs() if self._device.type == "cuda" else eager)
        self._graphs: dict[int, _Bucket] = {}
        self._signature: tuple[int, ...] = ()
        # pinned on CUDA, so the copy to a bucket's inputs does not wait; flat, so a bucket's [5, rows] is contiguous
        self._staging = torch.empty(5 * self.buckets[-1], dtype=torch.long, pin_memory=self._device.type == "cuda")
        self.captures = 0  # graphs captured so far (diagnostics and tests)
        self.graphs_failed = ""  # why capture was given up (then every step runs eagerly)
        self._cache.reserve(self._cache.max_slots, 1)  # every slot's row now: only its length grows (moving graphs)

    def __call__(self, token_ids: list[int], slots: list[int], positions: list[int],
                 wanted: list[int] | None = None) -> torch.Tensor:
        rows = len(token_ids)
        bucket = bucket_for(rows, self.buckets)
        if bucket is None or self.graphs_failed:
            return self.rows(token_ids, slots, positions, wanted)
        self.rows.ready_for(max(slots) + 1, max(positions) + 2)  # + 2: the last position stays free for the padding
        padding = bucket - rows
        chosen = list(range(rows)) if wanted is None else wanted
        staged = torch.tensor([token_ids + [0] * padding, slots + [0] * padding,
                               positions + [self._cache.capacity - 1] * padding,
                               [position + 1 for position in positions] + [1] * padding,
                               chosen + [0] * (bucket - len(chosen))], dtype=torch.long)
        self._staged(bucket).copy_(staged)
        graph = self._graph(bucket)
        if graph is None:
            return self.rows(token_ids, slots, positions, wanted)
        graph.inputs.copy_(self._staged(bucket), non_blocking=True)  # nothing here waits for the device
        # the wanted rows copied out of the static buffer, which the next replay overwrites
        return graph.replay().index_select(0, graph.inputs[4, :len(chosen)])

    def _graph(self, bucket: int) -> _Bucket | None:
        """The bucket's captured step, captured now if the cache or the rotary table moved since (None: capture
        failed, and every step runs eagerly from now on)."""
        signature = self._addresses()
        if signature != self._signature:
            self._graphs.clear()
            self._signature = signature
        graph = self._graphs.get(bucket)
        if graph is not None:
            return graph
        inputs = torch.zeros((5, bucket), dtype=torch.long, device=self._device)
        inputs.copy_(self._staged(bucket))
        ids, slots, positions, lengths = inputs[:4]

        def step() -> torch.Tensor:
            return self.rows.head(self.rows.rows_hidden(ids, slots, positions, lengths))

        try:
            replay = self._capture(step)
        except Exception as exc:  # a driver or compiler that will not capture must not stop the service
            self.graphs_failed = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graphs given up, steps run eagerly: %s", self.graphs_failed)
            return None
        self.captures += 1
        graph = self._graphs[bucket] = _Bucket(inputs, replay)
        return graph

    def _staged(self, bucket: int) -> torch.Tensor:
        return self._staging[:5 * bucket].view(5, bucket)

    def _addresses(self) -> tuple[int, ...]:
        """What a captured graph holds the addresses of: the cache's storage (and shape, which its strides follow)
        and the rotary table's."""
        tables = self.rows.rotary.by_key[self.rows.rope_key]
        return (*self._cache.storage(), *(table.data_ptr() for table in tables))
