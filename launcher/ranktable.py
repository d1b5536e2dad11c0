"""The job's rank table in the real HCCL version "1.0" JSON format (what ``RANK_TABLE_FILE`` points at).

One server per node, listed in node order; ranks are contiguous per server (node n holds ranks
n*nproc .. n*nproc+nproc-1), as real HCCL requires. Every value is a string, as in the real format.
``device_ip`` is synthesised as 192.168.<node>.<card>: it is data only, nothing listens there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rt.constants import AclErrorCode
from rt.errors import AclError

VERSION = "1.0"
MAX_BYTES = 4 << 20  # a rank table of thousands of devices is well below this


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
    return {"status": "completed", "version": VERSION, "server_count": str(nnodes),
            "server_list": servers}


def write(path: str | os.PathLike, table: dict) -> str:
    """Write atomically (a rank never reads half a file) and return the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    os.replace(tmp, path)
    return str(path)


def _bad(path, why: str) -> AclError:
    return AclError(AclErrorCode.ACL_ERROR_PARSE_FILE, f"rank table {path}: {why}")


def load(path: str | os.PathLike) -> dict:
    """Read and check a v1.0 rank table; returns {rank: (server_index, server_id, device_id)} under 'ranks'.

    The file is data: size-bounded, parsed as JSON, every field type-checked.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE, f"rank table {path}: cannot read ({e})") from None
    if size > MAX_BYTES:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE_SIZE,
                       f"rank table {path}: {size} bytes exceeds the {MAX_BYTES}-byte limit")
    try:
        doc = json.loads(p.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(path, f"not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise _bad(path, f"expected an object with version {VERSION!r}")
    if doc.get("status") != "completed":
        raise _bad(path, f"status is {doc.get('status')!r}, expected 'completed'")
    servers = doc.get("server_list")
    if not isinstance(servers, list) or doc.get("server_count") != str(len(servers)):
        raise _bad(path, "server_count must be a string equal to the length of server_list")
    ranks = {}
    for s_index, server in enumerate(servers):
        if not isinstance(server, dict) or not isinstance(server.get("server_id"), str) \
                or not isinstance(server.get("device"), list):
            raise _bad(path, f"server_list[{s_index}] needs a string server_id and a device list")
        for dev in server["device"]:
            fields = [dev.get(k) if isinstance(dev, dict) else None for k in ("device_id", "rank_id")]
            if not all(isinstance(f, str) and f.isdigit() for f in fields):
                raise _bad(path, f"server {server['server_id']!r}: device {dev!r} needs decimal-string "
                                 "device_id and rank_id")
            rank = int(fields[1])
            if rank in ranks:
                raise _bad(path, f"rank_id {rank} appears twice")
            ranks[rank] = (s_index, server["server_id"], int(fields[0]))
    if sorted(ranks) != list(range(len(ranks))):
        raise _bad(path, f"rank_ids must be 0..{len(ranks) - 1} without gaps, got {sorted(ranks)}")
    return {"doc": doc, "ranks": ranks}
