"""Proctor: constrained, audited text generation served over gRPC.

Importing the package caps oneDNN (PyTorch's CPU matrix kernels) at AVX2 on x86, unless
``ONEDNN_MAX_CPU_ISA`` is already set: with AVX-512/AMX kernels a row's logits differ in the last
bits alone and in a batch, which breaks the promise that an audited request replays to the same
tokens whatever ran beside it. Measured on an AMX Xeon (bench/README.md): batch 1 43 vs 54 ms per
step (faster), 16 rows 106 vs 79 ms (0.74×), bit-identical rows only with the cap. It must be set
before oneDNN first runs, hence here. ``ONEDNN_MAX_CPU_ISA=ALL`` lifts it (throughput over replay).

It also puts off a dependency's import-time grammar building until first use (deferred_imports.py):
~0.9 s of every start.
"""

import os
import platform

from proctor.deferred_imports import defer_iri_grammars

if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
defer_iri_grammars()

__version__ = "0.1.0"
