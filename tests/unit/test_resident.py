"""Resident memory while the slot weights are built (executor/resident.py).

``page_out`` must drop a file-mapped tensor's pages (the process's resident memory falls by its
size) and leave its values intact (they fault back in from the file), and must never touch memory
that no file backs, where dropping pages would zero the data.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from proctor.executor.resident import page_out

MB = 2**20


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_file_mapped_tensor_is_paged_out_and_keeps_its_values(tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    save_file({"w": torch.randn(4096, 4096)}, str(path))  # 64 MB
    weight = load_file(str(path))["w"]  # a view of the file's memory map, as transformers loads it
    total = float(weight.double().sum())
    before = resident_mb()
    dropped = page_out([weight])
    assert dropped > 63 * MB
    assert before - resident_mb() > 48, "resident memory did not fall"
    assert float(weight.double().sum()) == total  # read back from the file, unchanged


def test_memory_no_file_backs_is_left_alone() -> None:
    weight = torch.randn(2048, 2048)
    copy = weight.clone()
    assert page_out([weight, weight[:, :100], torch.empty(0)]) == 0
    assert torch.equal(weight, copy)

