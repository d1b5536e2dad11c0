"""How much memory this process may still back: the machine's RAM, or less inside a memory cgroup.

In a container (a CI runner, a Kubernetes pod) the kernel's OOM killer ends the process (SIGKILL) once its
cgroup's limit is reached, long before the machine's RAM runs out — so what a card's segments and pinned
host buffers may take is bounded by the tightest of the RAM and every memory cgroup from this process's own
up to the hierarchy's root: cgroup v2 ``memory.max`` / ``memory.current`` and cgroup v1
``memory.limit_in_bytes`` / ``memory.usage_in_bytes``, found through /proc/self/cgroup and
/proc/self/mountinfo. Reclaimable page cache (inactive file pages) is not counted as in use.
"""

from __future__ import annotations

import dataclasses
import functools
import os

UNLIMITED = 1 << 60          # cgroup v1 reports "no limit" as a page-rounded LONG_MAX
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
_V2 = ("memory.max", "memory.current", "inactive_file")
_MAX_FILE = 1 << 20          # /proc and cgroup files are small; never read more than this


@dataclasses.dataclass(frozen=True)
class CgroupLimit:
    path: str                # the cgroup directory holding the limit
    limit: int
    usage: int               # in use, not counting reclaimable page cache

    @property
    def available(self) -> int:
        return max(0, self.limit - self.usage)


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    total: int               # RAM, or the tightest cgroup limit if lower
    available: int           # what can still be backed now
    cgroup: CgroupLimit | None   # the binding cgroup, if one is tighter than the host

    def describe(self) -> str:
        if self.cgroup is None:
            return f"the host has {self.available} bytes of memory available (of {self.total})"
        c = self.cgroup
        return (f"the memory cgroup {c.path} allows {c.limit} bytes and {c.usage} are in use "
                f"({c.available} available)")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_FILE).decode("ascii", "replace")
    except OSError:
        return None


def _mounts(root: str) -> dict[str, list[tuple[str, str]]]:
    """``{"v1": [(hierarchy root, mount point)], "v2": [...]}`` of the memory-capable cgroup mounts."""
    found: dict[str, list[tuple[str, str]]] = {"v1": [], "v2": []}
    text = _read(os.path.join(root, "proc/self/mountinfo"))
    if text is None:   # no /proc/self/mountinfo: the usual places
        found["v1"].append(("/", "/sys/fs/cgroup/memory"))
        found["v2"] += [("/", "/sys/fs/cgroup"), ("/", "/sys/fs/cgroup/unified")]
        return found
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            found["v2"].append((fields[3], fields[4]))
        elif tail[0] == "cgroup" and "memory" in tail[2].split(","):
            found["v1"].append((fields[3], fields[4]))
    return found


def _own_paths(root: str) -> dict[str, str]:
    """This process's cgroup path in the v1 memory hierarchy and in the v2 one (from /proc/self/cgroup)."""
    paths = {}
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths["v2"] = parts[2]
        elif "memory" in parts[1].split(","):
            paths["v1"] = parts[2]
    return paths


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None


def _stat(directory: str, key: str) -> int:
    for line in (_read(os.path.join(directory, "memory.stat")) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _int(value) or 0
    return 0


def _chain(root: str, mount_root: str, mount_point: str, own: str) -> list[str]:
    """The cgroup directories from this process's own up to the mount's top."""
    top = os.path.normpath(os.path.join(root, mount_point.lstrip("/")))
    rel = os.path.relpath(own, mount_root) if own.startswith(mount_root) else "."
    leaf = os.path.normpath(os.path.join(top, rel)) if not rel.startswith("..") else top
    if not os.path.isdir(leaf):        # a container seeing only its own cgroup at the mount point
        leaf = top
    chain = [leaf]
    while chain[-1] != top and chain[-1].startswith(top):
        chain.append(os.path.dirname(chain[-1]))
    return chain


@functools.lru_cache(maxsize=16)
def _directories(root: str, pid: int) -> tuple[tuple[str, tuple[str, str, str]], ...]:
    """(cgroup directory, its v1 or v2 file names) of this process's memory cgroups, own first. Cached per
    process: finding them parses mountinfo, while a check only reads the few limit files."""
    own = _own_paths(root)
    mounts = _mounts(root)
    found: dict[str, tuple[str, str, str]] = {}
    for version, names in (("v2", _V2), ("v1", _V1)):
        for mount_root, mount_point in mounts[version] if version in own else ():
            for directory in _chain(root, mount_root, mount_point, own[version]):
                found.setdefault(directory, names)
    return tuple(found.items())


def cgroup_limits(root: str = "/") -> list[CgroupLimit]:
    """Every memory cgroup limiting this process (its own and its ancestors', v1 and v2); ``root`` is where
    /proc and /sys are found (tests pass a directory of fake files)."""
    limits = []
    for directory, (limit_file, usage_file, inactive_key) in _directories(root, os.getpid()):
        limit = _int(_read(os.path.join(directory, limit_file)))
        if limit is None or limit >= UNLIMITED:
            continue        # "max", no such file (the root cgroup, a v2 dir seen by v1) or no limit
        usage = _int(_read(os.path.join(directory, usage_file))) or 0
        usage = max(0, usage - _stat(directory, inactive_key))
        limits.append(CgroupLimit(directory, limit, usage))
    return limits


def budget(root: str = "/") -> MemoryBudget:
    """The memory this process may back now: the host's, or the tightest cgroup's if that is lower."""
    import psutil
    vm = psutil.virtual_memory()
    total, available, binding = vm.total, vm.available, None
    for c in cgroup_limits(root):
        total = min(total, c.limit)
        if c.available < available:
            available, binding = c.available, c
    return MemoryBudget(total, available, binding)
