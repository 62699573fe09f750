"""The CPU budget: affinity and cgroup quota (v2 ``cpu.max``, v1 CFS files), read from fake cgroup trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proctor.cpus import IdleCpus, cgroup_cpu_quota, cpu_budget, parse_cfs, parse_cpu_max, parse_proc_stat


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(("text", "cpus"), [
    ("max 100000\n", None),
    ("150000 100000\n", 1.5),
    ("200000 100000", 2.0),
    ("50000 200000", 0.25),
    ("80000", 0.8),  # period omitted: the kernel's default 100 ms
    ("", None),
    ("abc 100000", None),
    ("0 100000", None),
])
def test_cpu_max(text: str, cpus: float | None) -> None:
    assert parse_cpu_max(text) == cpus


@pytest.mark.parametrize(("quota", "period", "cpus"), [
    ("-1\n", "100000\n", None),
    ("150000\n", "100000\n", 1.5),
    ("300000", "100000", 3.0),
    ("x", "100000", None),
    ("100000", "0", None),
])
def test_cfs_files(quota: str, period: str, cpus: float | None) -> None:
    assert parse_cfs(quota, period) == cpus


def test_v2_takes_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu memory\n")
    _write(root / "kubepods" / "cpu.max", "100000 100000\n")
    _write(root / "kubepods" / "pod1" / "cpu.max", "max 100000\n")
    _write(root / "kubepods" / "pod1" / "c1" / "cpu.max", "250000 100000\n")
    _write(tmp_path / "self", "0::/kubepods/pod1/c1\n")
    assert cgroup_cpu_quota(root, tmp_path / "self") == 1.0
    assert cpu_budget(affinity=8, root=root, proc_cgroup=tmp_path / "self") == 1


def test_v2_in_a_cgroup_namespace_reads_the_mount_root(tmp_path: Path) -> None:
    """The path names the host's cgroup, which does not exist in the container's mount."""
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu\n")
    _write(root / "cpu.max", "150000 100000\n")
    _write(tmp_path / "self", "0::/system.slice/docker-abc.scope\n")
    assert cgroup_cpu_quota(root, tmp_path / "self") == 1.5
    assert cpu_budget(affinity=4, root=root, proc_cgroup=tmp_path / "self") == 1  # floor(1.5)


def test_v2_without_a_limit(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu\n")
    _write(root / "app" / "cpu.max", "max 100000\n")
    _write(tmp_path / "self", "0::/app\n")
    assert cgroup_cpu_quota(root, tmp_path / "self") is None
    assert cpu_budget(affinity=3, root=root, proc_cgroup=tmp_path / "self") == 3


@pytest.mark.parametrize("mount", ["cpu,cpuacct", "cpu"])
def test_v1_cfs_quota(tmp_path: Path, mount: str) -> None:
    root = tmp_path / "cgroup"
    _write(root / mount / "docker" / "abc" / "cpu.cfs_quota_us", "300000\n")
    _write(root / mount / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    _write(root / mount / "cpu.cfs_quota_us", "-1\n")
    _write(root / mount / "cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "self", f"5:memory:/docker/abc\n4:{mount}:/docker/abc\n0::/\n")
    assert cgroup_cpu_quota(root, tmp_path / "self") == 3.0
    assert cpu_budget(affinity=16, root=root, proc_cgroup=tmp_path / "self") == 3
    assert cpu_budget(affinity=2, root=root, proc_cgroup=tmp_path / "self") == 2  # the mask is tighter


def test_hybrid_layout_reads_v1_cpu_and_the_unified_mount(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "unified" / "cgroup.controllers", "\n")
    _write(root / "unified" / "svc" / "cpu.max", "50000 100000\n")  # a tighter v2 limit also counts
    _write(root / "cpu" / "cpu.cfs_quota_us", "200000\n")
    _write(root / "cpu" / "cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "self", "2:cpuacct:/\n1:cpu:/\n0::/svc\n")
    assert cgroup_cpu_quota(root, tmp_path / "self") == 0.5
    assert cpu_budget(affinity=2, root=root, proc_cgroup=tmp_path / "self") == 1  # at least one


def test_no_cgroup_files_means_the_affinity_mask(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "none", tmp_path / "missing") is None
    assert cpu_budget(affinity=5, root=tmp_path / "none", proc_cgroup=tmp_path / "missing") == 5


def test_this_machine() -> None:
    budget = cpu_budget()
    assert 1 <= budget <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert budget <= len(os.sched_getaffinity(0))


STAT = """cpu  {u0} 0 {s0} {i0} 0 0 0 0 0 0
cpu0 {u0} 0 {s0} {i0} 0 0 0 0 0 0
cpu1 0 0 0 {i1} {w1} 0 0 0 0 0
intr 12345 0 0
ctxt 999
"""


def _stat(u0: int, s0: int, i0: int, i1: int, w1: int = 0) -> str:
    return STAT.format(u0=u0, s0=s0, i0=i0, i1=i1, w1=w1)


def test_proc_stat_sums_the_chosen_cpus_lines() -> None:
    text = _stat(u0=70, s0=10, i0=20, i1=90, w1=10)
    assert parse_proc_stat(text) == (20 + 100, 100 + 100)  # the aggregate "cpu" line is not counted twice
    assert parse_proc_stat(text, {0}) == (20, 100)
    assert parse_proc_stat(text, {1}) == (100, 100)  # iowait counts as idle
    assert parse_proc_stat(text, {5}) == (0, 0)


def test_idle_cpus_between_two_readings(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(_stat(u0=1000, s0=0, i0=0, i1=1000))
    idle = IdleCpus(stat, cpus={0, 1})
    stat.write_text(_stat(u0=1100, s0=0, i0=0, i1=1100))  # cpu0 busy, cpu1 idle: one idle CPU
    assert idle() == pytest.approx(1.0)
    stat.write_text(_stat(u0=1150, s0=50, i0=0, i1=1200))  # cpu0 busy (user and system), cpu1 idle
    assert idle() == pytest.approx(1.0)
    stat.write_text(_stat(u0=1150, s0=50, i0=100, i1=1250))  # both idle
    assert idle() == pytest.approx(2.0)
    assert idle() is None  # no time passed
    only_busy = IdleCpus(stat, cpus={0})
    stat.write_text(_stat(u0=1250, s0=50, i0=100, i1=1350))
    assert only_busy() == pytest.approx(0.0)  # the other CPU's idle time is not ours


def test_idle_cpus_without_proc_stat(tmp_path: Path) -> None:
    assert IdleCpus(tmp_path / "missing", cpus={0})() is None
