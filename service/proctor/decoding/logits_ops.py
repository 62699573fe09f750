"""Row passes over logits [B, V] in the kernel library's vectorised loops (executor/kernels/pipeline.cpp).

Each gives the same bits as the PyTorch expression it replaces, and falls back to that expression until
the library is loaded (``executor/fused_decode.py`` builds and loads it, then calls ``library_loaded``;
these functions never build it). They live with the decoding pipeline that calls them.
"""

from __future__ import annotations

from typing import cast

import torch

_loaded = False  # set by library_loaded once the kernel library is in this process


def library_loaded() -> None:
    """Called by the kernel loader once ``torch.ops.proctor`` holds the row passes."""
    global _loaded
    _loaded = True


def fill_banned(logits: torch.Tensor, banned: torch.Tensor) -> bool:
    """``logits.masked_fill_(banned, -inf)`` in the library's one vectorised pass (the same bits), if the
    library is already loaded and the tensors suit it; False otherwise (this never builds it)."""
    if not _loaded or logits.device.type != "cpu" or logits.dtype != torch.float32 or not logits.is_contiguous():
        return False
    torch.ops.proctor.fill_banned(logits, banned.contiguous())
    return True


def unpack_banned(bitmask: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The constraint's int32 bitmasks as a [B, V] bool tensor of banned tokens and each row's allowed
    count, in one pass (``~bitmask_to_bool(...)`` and its sum), if the library is loaded; else None."""
    if not _loaded or bitmask.device.type != "cpu":
        return None
    banned, allowed = torch.ops.proctor.unpack_banned(bitmask.contiguous(), vocab)
    return banned, allowed


def row_argmax(logits: torch.Tensor) -> list[int]:
    """``logits.argmax(dim=-1).tolist()`` (the same indices) in one vectorised pass per row when the library
    is loaded and the tensor suits it."""
    if not suits(logits):
        return logits.argmax(dim=-1).tolist()
    return cast(list[int], torch.ops.proctor.row_argmax(logits.contiguous()).tolist())


def suits(logits: torch.Tensor) -> bool:
    """The library is loaded and ``logits`` is a 2-D float32 CPU tensor its row passes take."""
    return _loaded and logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2


def row_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """``torch.logsumexp(logits, dim=-1)`` [B] (to float rounding) in one vectorised pass per row."""
    if not suits(logits):
        return torch.logsumexp(logits, dim=-1)
    return cast(torch.Tensor, torch.ops.proctor.row_logsumexp(logits.contiguous()))


def row_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.topk(k, dim=-1)`` (values and indices, largest first; ties lowest index first) in one pass."""
    if not suits(logits):
        values, indices = logits.topk(k, dim=-1)
        return values, indices
    values, indices = torch.ops.proctor.row_topk(logits.contiguous(), k)
    return values, indices


def masked_pick(logits: torch.Tensor, bitmask: torch.Tensor) -> tuple[list[int], torch.Tensor, list[int]] | None:
    """For each row, as if its logits were -inf wherever its int32 bitmask has a clear bit: the argmax, the
    log Σ exp [B] and the allowed count (the same bits ``row_argmax``/``row_logsumexp`` give on the masked
    copy), without editing or copying the logits; None when the library is not loaded or the tensors do
    not suit it."""
    if not suits(logits) or bitmask.device.type != "cpu":
        return None
    chosen, lse, allowed = torch.ops.proctor.masked_pick(logits.contiguous(), bitmask.contiguous())
    return chosen.tolist(), lse, allowed.tolist()
