"""Small pieces the three adapters share: EOS bit rows, the JSON guard call, error text."""

from __future__ import annotations

import json
import re

import torch

from proctor.constraints.errors import ConstraintError
from proctor.constraints.json_schema import check_schema
from proctor.constraints.spec import ConstraintSpec

MAX_REASON_CHARS = 500
_CPP_PREFIX = re.compile(r"\[[\d:]+\] \S+:\d+: ")


def eos_row(eos_token_ids: tuple[int, ...], words: int) -> torch.Tensor:
    """An int32 bitmask row with only the EOS bits set: what a finished constraint allows."""
    row = torch.zeros(words, dtype=torch.int64)
    for token in eos_token_ids:
        row[token // 32] |= 1 << (token % 32)
    return torch.where(row >= 1 << 31, row - (1 << 32), row).to(torch.int32)  # bit 31 is the sign bit


def allows_other_than(row: torch.Tensor, eos: torch.Tensor) -> bool:
    """Whether a bitmask row allows any token that is not an EOS token."""
    return bool(torch.any(row & ~eos))


def checked_schema(spec: ConstraintSpec, backend: str) -> str:
    """The schema text to compile, once the spec passed the soundness guard (``json_schema.check_schema``).

    Compact, in the author's key order, in 2020-12 terms, with ``pattern`` regexes carried into
    ECMA terms. Limits are the server's (checked before the compile is sent); a schema that still
    nests too deeply for the recursive walks is refused here rather than crashing the worker.
    """
    try:
        schema = check_schema(spec.schema, backend)
    except RecursionError as exc:
        raise ConstraintError("the schema nests too deeply to analyse (max_schema_depth)", backend) from exc
    except ConstraintError as exc:
        raise ConstraintError(exc.reason, backend) from None
    except ValueError as exc:  # spec.schema parses the text
        raise ConstraintError(f"the schema is not valid JSON: {exc}", backend) from exc
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def reason(exc: BaseException) -> str:
    """An engine's error message, without C++ log prefixes, bounded in length."""
    text = _CPP_PREFIX.sub("", str(exc)).strip() or type(exc).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS] + "…"


def check_row(bitmask: torch.Tensor, row: int) -> torch.Tensor:
    """``bitmask[row]`` after the checks a raw-pointer write needs (CPU, int32, contiguous)."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.device.type != "cpu":
        raise ValueError("the bitmask must be a 2-D int32 CPU tensor")
    target = bitmask[row]
    if not target.is_contiguous():
        raise ValueError("the bitmask row must be contiguous")
    return target
