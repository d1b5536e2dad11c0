"""Reading a rank table (JSON, version 1.0): data only, every field checked, errors name the field."""

from __future__ import annotations

import dataclasses
import json
import os

from rt.errors import HcclError

from .types import HcclResult

MAX_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class RankTable:
    text: str
    size: int
    devices: dict[int, tuple[int, int]]      # rank_id -> (server index, device_id)
    servers: list[str]


def _bad(path, why) -> HcclError:
    return HcclError(HcclResult.HCCL_E_PARA, f"rank table {path}: {why}")


def load_rank_table(path: str) -> RankTable:
    if not isinstance(path, (str, os.PathLike)) or len(str(path)) >= 4096:
        raise HcclError(HcclResult.HCCL_E_PARA, f"rank table path {path!r} is not a path shorter than 4096 bytes")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise HcclError(HcclResult.HCCL_E_OPEN_FILE_FAILURE, f"rank table {path}: cannot read: {e}") from None
    if len(raw) > MAX_BYTES:
        raise _bad(path, f"larger than {MAX_BYTES} bytes")
    try:
        text = raw.decode()
        doc = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"not valid JSON: {e}") from None
    return parse_rank_table(doc, text, str(path))


def parse_rank_table(doc, text: str = "", path: str = "<memory>") -> RankTable:
    if not isinstance(doc, dict):
        raise _bad(path, "the top level must be an object")
    if doc.get("version") != "1.0":
        raise _bad(path, f"version {doc.get('version')!r} is not supported (expected \"1.0\")")
    if doc.get("status", "completed") != "completed":
        raise _bad(path, f"status is {doc.get('status')!r}, not \"completed\"")
    servers = doc.get("server_list")
    if not isinstance(servers, list) or not servers:
        raise _bad(path, "server_list must be a non-empty list")
    if "server_count" in doc and str(doc["server_count"]) != str(len(servers)):
        raise _bad(path, f"server_count {doc['server_count']!r} but server_list has {len(servers)} entries")
    devices: dict[int, tuple[int, int]] = {}
    names = []
    for si, server in enumerate(servers):
        if not isinstance(server, dict) or not isinstance(server.get("device"), list):
            raise _bad(path, f"server_list[{si}] needs a 'device' list")
        names.append(str(server.get("server_id", si)))
        seen_dev = set()
        for di, dev in enumerate(server["device"]):
            where = f"server_list[{si}].device[{di}]"
            if not isinstance(dev, dict):
                raise _bad(path, f"{where} must be an object")
            for key in ("device_id", "rank_id"):
                v = dev.get(key)
                if not isinstance(v, str) or not v.isdigit():
                    raise _bad(path, f"{where}.{key} = {v!r} must be a string of digits")
            rank, device_id = int(dev["rank_id"]), int(dev["device_id"])
            if rank in devices:
                raise _bad(path, f"{where}: rank_id {rank} appears twice")
            if device_id in seen_dev:
                raise _bad(path, f"{where}: device_id {device_id} appears twice on server {names[-1]}")
            seen_dev.add(device_id)
            devices[rank] = (si, device_id)
    ranks = sorted(devices)
    if ranks != list(range(len(ranks))):
        raise _bad(path, f"rank_ids must be 0..{len(ranks) - 1}, got {ranks}")
    order = [devices[r][0] for r in ranks]
    if order != sorted(order):
        raise _bad(path, "rank_ids must be contiguous per server (server 0 holds the lowest ranks, and so on)")
    return RankTable(text or json.dumps(doc, sort_keys=True), len(ranks), devices, names)
