"""How many CPUs this process may really use: its affinity mask and its cgroup CPU quota.

``os.cpu_count()`` counts the machine's CPUs. A process pinned with ``taskset``/cpusets sees fewer
in ``os.sched_getaffinity``, and a container limited to 1.5 CPUs by its cgroup gets 150 ms of CPU
time per 100 ms period however many CPUs it sees: more compute threads than that only wait for each
other at every OpenMP barrier. The budget is the smaller of the two, the quota rounded down, at
least 1.

The quota comes from the cgroup of this process (``/proc/self/cgroup``) and each of its ancestors
(the tightest one rules): cgroup v2 ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``),
cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: none). Inside a container the
listed path may not exist under the mount (another cgroup namespace); the mount's root counts then.

``IdleCpus`` says how many of this process's CPUs sat idle since it was last asked (``/proc/stat``):
the engine's thread tuner asks it before trying more threads, so that it does not pay a slow probe
step while neighbours keep every CPU busy.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_STAT = Path("/proc/stat")
# Where cgroup v1 mounts the cpu controller, by distribution habit.
V1_CPU_MOUNTS = ("cpu,cpuacct", "cpuacct,cpu", "cpu")


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.cpu_count()`` where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` line, or None for no limit (or an unreadable line)."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``; None for no limit."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None


def _lineage(mount: Path, relative: str) -> list[Path]:
    """The cgroup's directory under ``mount`` and its ancestors up to the mount (the mount alone when
    the path does not exist there)."""
    parts = [p for p in relative.strip("/").split("/") if p and p != ".."]
    directory = mount.joinpath(*parts)
    if not directory.is_dir():
        return [mount]
    chain = [directory]
    while directory != mount:
        directory = directory.parent
        chain.append(directory)
    return chain


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    return parse_cpu_max(text) if text is not None else None


def _v1_quota(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    return parse_cfs(quota, period) if quota is not None and period is not None else None


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The tightest CPU quota over this process's cgroups (v2 and v1), in CPUs; None when unlimited."""
    membership = _read(proc_cgroup) or ""
    quotas: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            mount = root / "unified" if (root / "unified" / "cgroup.controllers").is_file() else root
            found = [_v2_quota(d) for d in _lineage(mount, relative)]
        elif "cpu" in controllers.split(","):
            mounts = [root / name for name in V1_CPU_MOUNTS if (root / name).is_dir()]
            found = [_v1_quota(d) for mount in mounts[:1] for d in _lineage(mount, relative)]
        else:
            continue
        quotas.extend(q for q in found if q is not None)
    return min(quotas) if quotas else None


def cpu_budget(affinity: int | None = None, root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """Compute threads this process can keep busy: min(affinity CPUs, floor(cgroup quota)), at least 1.

    ``affinity`` overrides the process's mask, ``root``/``proc_cgroup`` the cgroup files (tests)."""
    cpus = affinity if affinity is not None else affinity_cpus()
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, math.floor(quota + 1e-9))
    return max(1, cpus)


def parse_proc_stat(text: str, cpus: set[int] | None = None) -> tuple[int, int]:
    """(idle, total) jiffies summed over the ``cpuN`` lines of ``/proc/stat`` for N in ``cpus``
    (all CPUs when None). Idle counts idle and iowait; total counts user..steal (guest time is
    already inside user)."""
    idle = total = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or (cpus is not None and int(name[3:]) not in cpus):
            continue
        fields = [int(v) for v in rest.split()[:8]]
        if len(fields) < 4:
            continue
        idle += fields[3] + (fields[4] if len(fields) > 4 else 0)
        total += sum(fields)
    return idle, total


class IdleCpus:
    """Idle CPUs (of this process's affinity mask) since the previous call; None when unknown."""

    def __init__(self, path: Path = PROC_STAT, cpus: set[int] | None = None) -> None:
        self._path = path
        if cpus is None and hasattr(os, "sched_getaffinity"):
            cpus = set(os.sched_getaffinity(0))
        self._cpus = cpus
        self._last = self._sample()

    def _sample(self) -> tuple[int, int] | None:
        text = _read(self._path)
        if text is None:
            return None
        idle, total = parse_proc_stat(text, self._cpus)
        return (idle, total) if total > 0 else None

    def __call__(self) -> float | None:
        previous, self._last = self._last, self._sample()
        if previous is None or self._last is None or self._last[1] <= previous[1]:
            return None
        count = len(self._cpus) if self._cpus else affinity_cpus()
        return count * (self._last[0] - previous[0]) / (self._last[1] - previous[1])
