"""Which host addresses this process has mapped, and with what permission (``/proc/self/maps``).

Read before npusim touches memory at an address a program passed as a plain int (a pyACL host pointer, a
data buffer's address): an unmapped or read-only range is refused with the caller's code instead of a
SIGSEGV/SIGABRT of the whole process.
"""

from __future__ import annotations


def unmapped(address: int, nbytes: int, write: bool) -> str | None:
    """Why ``[address, address + nbytes)`` cannot be accessed (read, or written if ``write``) according to
    /proc/self/maps, or None if every byte can. Without a readable map (not Linux) nothing is refused."""
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    need, end = address, address + nbytes
    for line in lines:                                 # sorted by address, possibly split into adjacent pieces
        bounds, perms = line.split(b" ", 2)[:2]
        lo, hi = (int(x, 16) for x in bounds.split(b"-"))
        if hi <= need:
            continue
        if lo > need:
            break
        if perms[:1] != b"r" or write and perms[1:2] != b"w":
            return f"the memory at 0x{need:x} is mapped {perms.decode()[:3]}, not {'writable' if write else 'readable'}"
        need = hi
        if need >= end:
            return None
    return f"0x{need:x} is not mapped in this process"
