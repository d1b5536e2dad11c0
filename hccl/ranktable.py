"""The rank table (HCCL JSON, version "1.0"): the one reader and writer — ``launch`` writes the job's table
with :func:`build` / :func:`write`, ``comm_init_cluster_info`` reads it with :func:`load_rank_table`.

One server per node in node order; ranks contiguous per server (server 0 holds the lowest ranks, and so
on), as real HCCL requires; every value a string, as in the real format. ``device_id`` is the physical
card; ``device_ip`` is synthesised as 192.168.<node>.<card> — data only, nothing listens there. Reading
treats the file as data: only a regular file, size-bounded, parsed as JSON, every field checked, errors
naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from rt.args import shown
from rt.files import FileRefused, read_regular_file

from .errors import HcclError
from .types import HcclResult

VERSION = "1.0"
MAX_BYTES = 4 << 20  # a rank table of thousands of devices is well below this
MAX_ID_DIGITS = 9    # rank_id / device_id: ids of any real cluster, far below int() limits and int32


@dataclasses.dataclass(frozen=True)
class RankTable:
    text: str
    size: int
    devices: dict[int, tuple[int, int]]      # rank_id -> (server index, device_id)
    servers: list[str]                       # server_id of each server


# ---------------------------------------------------------------------------------------------- writing
def build(nnodes: int, nproc: int, server_ids: list[str] | None = None, device_ids=None) -> dict:
    """The rank-table document for nnodes servers of nproc devices each; ``device_ids`` are the physical cards
    of each server (default 0..nproc-1; ASCEND_RT_VISIBLE_DEVICES may pick others)."""
    if server_ids is None:
        server_ids = [f"node_{n}" for n in range(nnodes)]
    device_ids = list(range(nproc)) if device_ids is None else list(device_ids)
    assert len(server_ids) == nnodes and len(set(server_ids)) == nnodes, server_ids
    assert len(device_ids) == nproc, device_ids
    servers = []
    for node in range(nnodes):
        devices = [{"device_id": str(card), "device_ip": f"192.168.{node}.{card}",
                    "rank_id": str(node * nproc + local)} for local, card in enumerate(device_ids)]
        servers.append({"server_id": server_ids[node], "device": devices, "host_nic_ip": "reserve"})
    return {"status": "completed", "version": VERSION, "server_count": str(nnodes), "server_list": servers}


def write(path: str | os.PathLike, table: dict) -> str:
    """Write atomically (a rank never reads half a file) and return the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(table, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:  # a full disk, or path is a directory: leave no half-written temp file behind
        tmp.unlink(missing_ok=True)
        raise
    return str(path)


# ---------------------------------------------------------------------------------------------- reading
def _bad(path, why) -> HcclError:
    return HcclError(HcclResult.HCCL_E_PARA, f"rank table {path}: {why}")


def load_rank_table(path) -> RankTable:
    """Read and check a rank table file (HcclError: HCCL_E_OPEN_FILE_FAILURE if it cannot be read,
    HCCL_E_PARA naming the field if it is malformed)."""
    try:
        raw = read_regular_file(path, MAX_BYTES, "rank table")
    except FileRefused as e:
        code = HcclResult.HCCL_E_PARA if e.reason in ("type", "too_large", "not_regular") \
            else HcclResult.HCCL_E_OPEN_FILE_FAILURE
        raise HcclError(code, e.message) from None
    try:
        text = raw.decode()
        doc = json.loads(text)
    # ValueError covers bad UTF-8, bad JSON and integers past Python's digit limit; RecursionError a hostile
    # nesting depth: both are a malformed table, not an npusim failure
    except (ValueError, RecursionError) as e:
        raise _bad(path, f"not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None
    return parse_rank_table(doc, text, str(path))


def _decimal(v) -> bool:
    """A short string of ASCII digits (str.isdigit() alone also takes '²' and other digits int() refuses)."""
    return isinstance(v, str) and 0 < len(v) <= MAX_ID_DIGITS and v.isascii() and v.isdigit()


def parse_rank_table(doc, text: str = "", path: str = "<memory>") -> RankTable:
    if not isinstance(doc, dict):
        raise _bad(path, "the top level must be an object")
    if doc.get("version") != VERSION:
        raise _bad(path, f"version {shown(doc.get('version'))} is not supported (expected \"{VERSION}\")")
    if doc.get("status", "completed") != "completed":
        raise _bad(path, f"status is {shown(doc.get('status'))}, not \"completed\"")
    servers = doc.get("server_list")
    if not isinstance(servers, list) or not servers:
        raise _bad(path, "server_list must be a non-empty list")
    if "server_count" in doc and doc["server_count"] != str(len(servers)):
        raise _bad(path, f"server_count {shown(doc['server_count'])} must be a string equal to the length of "
                         f"server_list ({len(servers)})")
    devices: dict[int, tuple[int, int]] = {}
    names = []
    for si, server in enumerate(servers):
        if not isinstance(server, dict) or not isinstance(server.get("device"), list):
            raise _bad(path, f"server_list[{si}] needs a 'device' list")
        sid = server.get("server_id", si)
        names.append(sid if isinstance(sid, str) else shown(sid))
        seen_dev = set()
        for di, dev in enumerate(server["device"]):
            where = f"server_list[{si}].device[{di}]"
            if not isinstance(dev, dict):
                raise _bad(path, f"{where} must be an object")
            for key in ("device_id", "rank_id"):
                v = dev.get(key)
                if not _decimal(v):
                    raise _bad(path, f"{where}.{key} = {shown(v)} must be a decimal-string of 1 to "
                                     f"{MAX_ID_DIGITS} ASCII digits")
            rank, device_id = int(dev["rank_id"]), int(dev["device_id"])
            if rank in devices:
                raise _bad(path, f"{where}: rank_id {rank} appears twice")
            if device_id in seen_dev:
                raise _bad(path, f"{where}: device_id {device_id} appears twice on server {names[-1]}")
            seen_dev.add(device_id)
            devices[rank] = (si, device_id)
    ranks = sorted(devices)
    if ranks != list(range(len(ranks))):
        raise _bad(path, f"rank_ids must be 0..{len(ranks) - 1} without gaps, got {ranks}")
    order = [devices[r][0] for r in ranks]
    if order != sorted(order):
        raise _bad(path, "rank_ids must be contiguous per server (server 0 holds the lowest ranks, and so on)")
    return RankTable(text or json.dumps(doc, sort_keys=True), len(ranks), devices, names)
