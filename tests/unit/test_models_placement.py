"""Device/dtype/thread settings map to torch terms, and bad values fail with a clear message."""

from __future__ import annotations

import pytest
import torch

from proctor.cpus import cpu_budget
from proctor.models.errors import ModelError
from proctor.models.placement import apply_threads, resolve_device, resolve_dtype

CPU = torch.device("cpu")


def test_auto_device_follows_cuda_availability() -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match="CUDA is not available"):
        resolve_device("cuda")


def test_unknown_device_is_rejected() -> None:
    with pytest.raises(ModelError, match="unknown device"):
        resolve_device("tpu")


def test_auto_dtype_is_float32_on_cpu() -> None:
    assert resolve_dtype("auto", CPU) == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_dtype_is_half_precision_on_cuda() -> None:
    assert resolve_dtype("auto", torch.device("cuda")) in {torch.bfloat16, torch.float16}


@pytest.mark.parametrize(
    ("name", "dtype"), [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)]
)
def test_explicit_dtype_is_honoured(name: str, dtype: torch.dtype) -> None:
    assert resolve_dtype(name, CPU) == dtype


def test_unknown_dtype_is_rejected() -> None:
    with pytest.raises(ModelError, match="unknown dtype 'int8'"):
        resolve_dtype("int8", CPU)


def test_threads() -> None:
    before = torch.get_num_threads()
    try:
        apply_threads(0)
        assert torch.get_num_threads() == cpu_budget()
        apply_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ModelError):
        apply_threads(-1)
