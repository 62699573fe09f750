"""Where the model runs and in which precision: turns the ``device``/``dtype``/``threads`` settings into torch terms.

``dtype=auto`` means bfloat16 on CUDA (float16 where the GPU lacks bf16) and float32 on CPU: on this
project's CPUs fp32 was faster than bf16 at batch size 1 for the 135M default model, and it keeps
greedy output identical to the fp32 reference conversion, which the tests rely on.
"""

from __future__ import annotations

import torch

from proctor.cpus import cpu_budget
from proctor.models.errors import ModelError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(name: str) -> torch.device:
    """``auto`` → cuda when available else cpu; ``cpu``; ``cuda`` or ``cuda:N`` (error when CUDA is absent)."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ModelError(
                f"device={name!r} requested but CUDA is not available to torch {torch.__version__}; "
                "use --device cpu (or auto)"
            )
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelError(f"device={name!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
        return device
    raise ModelError(f"unknown device {name!r}; expected auto, cpu, cuda or cuda:N")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` → bf16 on CUDA (fp16 without bf16 support), fp32 on CPU; explicit names are honoured."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"unknown dtype {name!r}; expected auto, {', '.join(DTYPES)}") from None


def apply_threads(threads: int) -> None:
    """Set torch's intra-op thread count: ``threads`` when > 0, else the CPUs this process may use
    (affinity and cgroup quota, ``proctor/cpus.py``; the engine thread then tunes it, engine/thread_tuner.py)."""
    if threads < 0:
        raise ModelError(f"threads must be >= 0, got {threads}")
    torch.set_num_threads(threads if threads > 0 else cpu_budget())


def resolve_weights(name: str, device: torch.device, dtype: torch.dtype, gguf_file: bool = False) -> str:
    """``auto`` → for a ``.gguf`` file its own blocks (gguf), else the first of ``CPU_PREFERENCE`` that can
    run here (a CPU with fbgemm, fp32 activations, and for q4 and q8 the compiled kernels), else dense (the
    order measured: bench/weights.py)."""
    from proctor.executor.weights import CPU_PREFERENCE, mode_problem

    name = (name or "auto").strip().lower()
    if name == "gguf" and not gguf_file:
        raise ModelError("--weights gguf serves a .gguf file's own blocks; pass --model FILE.gguf "
                         "(or another --weights mode)")
    if name == "auto":
        preference = ("gguf", *CPU_PREFERENCE) if gguf_file else CPU_PREFERENCE
        return next((mode for mode in preference if mode_problem(mode, device, dtype) is None), "dense")
    problem = mode_problem(name, device, dtype)
    if problem is not None:
        raise ModelError(problem)
    return name
