"""The key memory compiled (``keys.cpp``), built on first use like the decode kernels; layer.py's where it cannot be.

Why compiled: in Python the memory's reading and lookups cost 3-4 µs a token beside the engine's ~14 µs mask (1.26×,
bench/key_memory.py --mask); the issue's bound is 1.1×. The C++ twin reads the output's bytes and answers
``banned()`` the same way for a fraction of a microsecond. It is a plain CPython extension (no torch headers), built
by torch's JIT builder into its own folder beside the kernels (``make kernels`` builds it ahead), so a server
without a compiler still serves every schema, on the Python memory (tests/unit/test_key_memory_native.py holds the
two to the same answers).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from proctor.constraints.backends.vocab import token_bytes
from proctor.constraints.key_memory.vocabulary import per_tokenizer

SOURCE = Path(__file__).with_name("keys.cpp")
CFLAGS = ["-O2", "-std=c++17", "-fno-fast-math"]

log = logging.getLogger(__name__)


@functools.cache
def native_module() -> ModuleType | None:
    """The compiled key memory (built once), or None when it cannot be built here (logged once)."""
    try:
        import torch
        from torch.utils import cpp_extension

        from proctor.config import default_kernel_cache
    except ImportError:  # pragma: no cover - torch is a serving dependency
        return None
    build = default_kernel_cache() / f"torch-{torch.__version__}" / "keys"
    build.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    fresh = not any(build.glob("*.so"))
    try:
        module: ModuleType = cpp_extension.load(name="proctor_keys", sources=[str(SOURCE)], extra_cflags=CFLAGS,
                                    build_directory=str(build), is_python_module=True, verbose=False)
    except (RuntimeError, OSError, ImportError, ValueError) as exc:  # no compiler, no ninja, a failed build
        log.warning("the compiled key memory could not be built (%s): the Python one serves (slower masks)",
                    str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__)
        return None
    if fresh:
        log.info("built the compiled key memory in %.1f s", time.monotonic() - started)
    return module


def native_memory(tokenizer: object, vocab_size: int) -> Callable[[], Any] | None:
    """A maker of one row's compiled memory over this vocabulary (its index built once per tokenizer), or None
    without the compiled memory."""
    module = native_module()
    if module is None:
        return None
    vocab = per_tokenizer(tokenizer, vocab_size, "native",
                          lambda: module.Vocabulary(token_bytes(tokenizer, vocab_size)))
    return functools.partial(module.KeyMemory, vocab)


def main() -> int:
    """``python -m proctor.constraints.key_memory.native``: build it now (``make kernels``)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    if native_module() is None:
        print("key memory: the compiled one could not be built; the Python one serves")
        return 1
    print(f"key memory: compiled ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
