"""The q8 and q4 decode steps as one C++ call per layer (``kernels/``), compiled on first use.

Why: at a few rows a q8 decode step of the default model is ~9 ms of int8 matrix products and, as
~60 small PyTorch operations per layer (norm, per-row scaling, rotary, cache writes, attention,
activation), another ~11 ms of dispatch and allocation around vectors of 576 numbers. The kernel
does all but the products (still fbgemm's, through the same packed weights) in plain AVX2 loops, and
reads a float16 KV cache: on the 2-core machine a step at 1 / 16 rows went from 24.5 / 67.5 ms to
11.7 / 42.4 ms (bench/weights.py; bench/README.md, "Per-step overhead"). Attention runs over each
row's exact prefix, one (row, kv head) per job, so a row's result does not depend on the batch or
the thread count (tests/unit/test_fused_decode.py, tests/unit/test_weight_modes.py).

Why compiled here rather than shipped: the extension must match the installed torch's headers and
ABI exactly; torch's own JIT builder (``torch.utils.cpp_extension.load``, ninja + g++) compiles it in
~15 s once and reuses the build while the source, flags and torch are unchanged. ``make setup``
builds it (``python -m proctor.executor.fused_decode``); without a compiler, ``--weights q8`` is
unavailable and ``auto`` falls back to fp16 (weights.py).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import time
from pathlib import Path

import torch

from proctor.config import default_kernel_cache
from proctor.decoding import logits_ops

KERNELS = Path(__file__).with_name("kernels")
SOURCES = (KERNELS / "pipeline.cpp", KERNELS / "q8_decode.cpp", KERNELS / "q4_decode.cpp", KERNELS / "q4_vnni.cpp",
           KERNELS / "ggml_linear.cpp", KERNELS / "ggml_vnni.cpp")
HEADERS = (KERNELS / "layer_step.h", KERNELS / "q4_dot.h", KERNELS / "q4_types.h", KERNELS / "ggml_blocks.h",
           KERNELS / "ggml_dot.h", KERNELS / "ggml_wide.h", KERNELS / "ggml_r8.h",
           KERNELS / "ggml_r8_blocks.h")
# AVX2 + FMA + F16C (the float16 cache; every AVX2 CPU has it) only: what fbgemm's q8 path needs
# anyway, and the same code on every x86 machine that runs q8 or q4, so a record replays to the same bits.
# -fopenmp: at::parallel_for is inline in ATen's headers, so without it every parallel loop here runs on
# one thread. The library then needs libgomp.so.1, which resolves to the one torch already loaded: one
# thread pool, sized by torch.set_num_threads.
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fno-fast-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]

log = logging.getLogger(__name__)


@functools.cache
def load_problem() -> str | None:
    """Build (once) and load the kernel; why it cannot be used here, or None when it is loaded."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return "fbgemm (an x86 CPU with AVX2) is missing"
    from torch.utils import cpp_extension

    build = default_kernel_cache() / f"torch-{torch.__version__}"
    build.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)  # the venv's ninja, when PATH does not name the venv
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    started = time.monotonic()
    fresh = not any(build.glob("*.so"))
    if fresh:
        log.info("building the decode kernels (q8, q4) into %s (once, ~15 s)", build)
    try:
        cpp_extension.load(name="proctor_decode", sources=[str(source) for source in SOURCES],
                           extra_cflags=[*CFLAGS, f"-DPROCTOR_HEADERS_DIGEST={_headers_digest()}"],
                           extra_ldflags=LDFLAGS, build_directory=str(build), is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError, ValueError) as exc:  # no compiler, no ninja, a failed build
        first = _first_error(str(exc)) or type(exc).__name__
        log.warning("the decode kernels could not be built (%s): --weights q8 and q4 are unavailable", first)
        return f"its C++ decode kernels could not be built here ({first}); see {build}"
    if fresh:
        log.info("built the decode kernels in %.1f s", time.monotonic() - started)
    logits_ops.library_loaded()  # the row passes (decoding/logits_ops.py) may use the library from now on
    return None


def _headers_digest() -> str:
    """A digest of the shared headers: torch's builder rebuilds when sources or flags change, not headers."""
    return hashlib.sha256(b"".join(header.read_bytes() for header in HEADERS)).hexdigest()[:16]


def _first_error(message: str) -> str:
    """The compiler's first ``error:`` line (torch's message leads with the whole command line)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line or "not found" in line.lower()]
    return (errors or lines or [""])[0][:300]


def decode_layer(mode: str = "q8") -> torch._ops.OpOverloadPacket:
    """The layer step of weights mode ``mode`` (q8 or q4); loads the kernels first, raises when they
    cannot be built."""
    problem = load_problem()
    if problem is not None:
        raise RuntimeError(f"--weights {mode}: {problem}")
    return {"q4": torch.ops.proctor.decode_layer_q4, "gguf": torch.ops.proctor.decode_layer_ggml}.get(
        mode, torch.ops.proctor.decode_layer)


def main() -> int:
    """``python -m proctor.executor.fused_decode``: build the kernel now (``make setup``)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    problem = load_problem()
    if problem is not None:
        print(f"decode kernels: {problem}", file=sys.stderr)
        return 1
    print(f"decode kernels ready ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
