"""npu-smi — what the simulated cards on this machine hold right now, read live from the cards.

Usage::

    npu-smi info                    every NPU of every running npusim session, then the processes on each card
    npu-smi info -i 3               only NPU 3 (of every session)
    npu-smi info -t usages -i 0     usage of NPU 0: HBM capacity, usage and usage rate, ...
    npu-smi info --json             the same data for scripts (with ``-i`` / ``--session`` too)

The table is the one of CANN's ``npu-smi info``: NPU id, name (the soc name without "Ascend", e.g. 910B1),
health, HBM-Usage(MB) used / total — where used is total minus the free memory ``rt.get_mem_info`` reports on
that card — and per card the processes holding a connection to it (pid, process name, the device memory their
live allocations hold). Power, temperature, AI Core use and the bus id are not simulated: they read N/A.

Where the cards are: every card serves a Unix socket ``npu<node>_<index>.sock`` in a directory of the per-user
npusim directory (``/tmp/npusim-<uid>/``, ``rt.ray.session.socket_root``): one directory per card set of an
embedded Ray session (a ``launch`` or ``rt.init()`` process, a pytest session), of the local cluster
(``launch --up``) or of a cluster joined with ``rt.init(address=...)``. ``owner.json`` beside the sockets names the
process that created them (``rt.ray.session.write_owner``); a set whose owner is gone is stale: ignored, and
removed once none of its sockets answers (the directory would otherwise wait for its owner's reaper). Each card is
asked over a connection of its own labelled ``npu-smi`` (rt's ``CardClient``, presenting the set's key, ``card.key``
beside the sockets, as every client must; then ``hello`` and ``usage``: ``Card.c_usage``) that is closed at once; the card
leaves monitoring connections out of what it reports and they own nothing, so looking
changes nothing. Cards inside a process (``rt.init(backend="local")``) have no socket and are not shown.

Exit status: 0; 1 when no session is running (or no NPU matches ``-i`` / ``--session``), with one line on stderr;
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import socket
import sys
import time

from rt.card.card import MONITOR_LABEL
from rt.constants import AclErrorCode
from rt.errors import AclError
from rt.files import user_root_path
from rt.ray.session import OWNER_FILE
from rt.wire.channel import SocketTransport, card_key
from rt.wire.client import CardClient

from ..cluster.client import pid_alive, state_file
from .smi_table import MiB, mb, render_info, render_usages

QUERY_TIMEOUT = 5.0                              # seconds one card has to answer
SOCKET_RE = re.compile(r"npu(\d+)_(\d+)\.sock")   # rt.wire.channel.socket_path
PEER_LABEL = "peer card"                          # connections of other cards (rt/card/peers.py): not processes


def default_root() -> str:
    """The per-user npusim directory (as ``rt.ray.session.socket_root``, without creating it)."""
    return user_root_path()


def version() -> str:
    try:
        from importlib.metadata import version as dist_version
        return dist_version("npusim")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


# =========================================================================== asking one card
class CardError(Exception):
    """The card answered with an error (or refused the connection)."""


def query_card(path: str, timeout: float = QUERY_TIMEOUT) -> dict:
    """Open a monitoring connection to the card serving ``path``, ask ``usage``, close it. A card too old to know
    ``usage`` is asked ``mem_info`` instead (no process list). Raises OSError (nothing there, no answer in time)
    or CardError."""
    deadline = time.monotonic() + timeout
    try:
        key = card_key(os.path.dirname(path))     # the set's key, beside its sockets (only we can read it)
        client = _connect(path, key, deadline)
        try:
            try:
                return client.call("usage", timeout=_left(deadline))
            except AclError as e:
                if "unknown card command" not in e.message:
                    raise
            free, total = client.call("mem_info", timeout=_left(deadline))
        finally:
            client.close()
    except AclError as e:
        if e.code == AclErrorCode.ACL_ERROR_RT_TIMEOUT:
            raise TimeoutError("timed out") from None
        raise CardError(e.message) from None
    info = client.info
    return {"node": info.get("node"), "card": info.get("card"), "soc_name": info.get("soc_name"),
            "free": free, "total": total, "connections": None}


def _connect(path: str, key: bytes, deadline: float) -> CardClient:
    """A ``CardClient`` labelled ``npu-smi``; a socket that is missing or refuses is tried again until the deadline
    (a warm card between jobs serves its socket again in a moment)."""
    while True:
        try:
            return CardClient(lambda on_message, on_close: SocketTransport(path, on_message, on_close,
                                                                           timeout=_left(deadline, 0.05), key=key),
                              name=f"the card at {path}", label=MONITOR_LABEL, timeout=_left(deadline))
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() + 0.1 >= deadline:
                raise
            time.sleep(0.1)


def _left(deadline: float, least: float = 0.01) -> float:
    return max(least, deadline - time.monotonic())


# =========================================================================== finding the sessions
def _owner(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, OWNER_FILE)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def _answers(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _cluster_pid(root: str) -> int | None:
    """The pid of the local cluster's daemon (``launch --up``, ``launcher/cluster/``), read from its state file."""
    try:
        with open(state_file(root)) as f:
            pid = json.load(f).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None


def _command(pid: int) -> str:
    try:
        import psutil
        argv = psutil.Process(pid).cmdline()
    except Exception:  # noqa: BLE001 - gone, or not ours to read
        return ""
    if not argv:
        return ""
    return " ".join([os.path.basename(argv[0])] + argv[1:])


def _process_name(pid: int, fallback: str) -> str:
    try:
        import psutil
        return psutil.Process(pid).name() or fallback
    except Exception:  # noqa: BLE001 - another machine's pid (a joined cluster), or gone
        return fallback


def card_sets(root: str) -> list[dict]:
    """The card sets under ``root`` whose owner runs (or is unknown): ``{"dir", "owner", "sockets"}``. Stale sets
    (owner gone) are left out, and removed if none of their sockets answers."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        directory = os.path.join(root, name)
        try:
            entries = os.listdir(directory)
        except OSError:                           # a file, or not ours
            continue
        sockets = sorted((int(m[1]), int(m[2]), os.path.join(directory, e))
                         for e in entries if (m := SOCKET_RE.fullmatch(e)))
        if not sockets:
            continue                              # Ray's temp dirs, the cluster's own directory, ...
        owner = _owner(directory)
        if owner is not None and not pid_alive(owner["pid"], owner.get("start_time")):
            if not any(_answers(p) for _, _, p in sockets):
                shutil.rmtree(directory, ignore_errors=True)
            continue
        out.append({"dir": directory, "owner": owner, "sockets": sockets})
    return out


def collect(root: str | None = None, timeout: float = QUERY_TIMEOUT) -> dict:
    """Everything ``npu-smi`` shows, as the JSON document ``--json`` prints."""
    root = root or default_root()
    sets = card_sets(root)
    jobs = [(i, node, index, path) for i, cs in enumerate(sets) for node, index, path in cs["sockets"]]
    answers = {}
    if jobs:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(jobs))) as pool:
            futures = {pool.submit(query_card, path, timeout): path for _, _, _, path in jobs}
            for fut, path in futures.items():
                try:
                    answers[path] = fut.result()
                except (OSError, CardError, ValueError) as e:
                    answers[path] = e
    cluster = _cluster_pid(root)
    sessions = []
    for i, cs in enumerate(sets):
        cards = [_card_record(node, index, path, answers[path]) for j, node, index, path in jobs if j == i]
        if all(c["health"] != "OK" for c in cards):
            continue                              # nothing there answers: a set being torn down, or stale
        owner = cs["owner"] or {}
        pid = owner.get("pid")
        sessions.append({"name": os.path.basename(cs["dir"]), "socket_dir": cs["dir"],
                         "kind": "cluster" if pid is not None and pid == cluster else "process" if pid else "unknown",
                         "owner_pid": pid, "owner_command": _command(pid) if pid else "", "job": owner.get("job"),
                         "cards": cards})
    return {"version": version(), "root": root, "sessions": sessions}


def _card_record(node: int, index: int, path: str, answer) -> dict:
    rec = {"npu": index, "chip": 0, "node": node, "socket": path}
    if not isinstance(answer, dict):
        return {**rec, "name": "N/A", "soc_name": None, "health": "Critical", "error": f"no answer: {answer}",
                "processes": []}
    soc = answer.get("soc_name") or ""
    free, total = int(answer["free"]), int(answer["total"])
    used = total - free
    rec.update({"name": soc.removeprefix("Ascend"), "soc_name": soc, "health": "OK",
                "card_pid": answer.get("pid"), "hbm_total_bytes": total, "hbm_used_bytes": used,
                "hbm_free_bytes": free, "hbm_total_mb": total // MiB, "hbm_used_mb": mb(used),
                "hbm_usage_percent": round(100 * used / total) if total else 0})
    for key, name in (("allocated", "allocated_bytes"), ("reserved", "reserved_bytes"),
                      ("peak_reserved", "peak_reserved_bytes"), ("streams", "streams"), ("events", "events")):
        if key in answer:
            rec[name] = answer[key]
    conns = answer.get("connections")
    rec["processes"] = None if conns is None else _processes(conns)
    return rec


def _processes(conns: list[dict]) -> list[dict]:
    """The card's connections by process (a process with several contexts on the card has several)."""
    by_pid: dict[int, dict] = {}
    for c in conns:
        if c.get("label") in (PEER_LABEL, MONITOR_LABEL):
            continue
        p = by_pid.setdefault(c["pid"], {"pid": c["pid"], "name": None, "labels": [], "contexts": 0,
                                         "allocations": 0, "memory_bytes": 0})
        p["contexts"] += 1
        p["allocations"] += c.get("allocations", 0)
        p["memory_bytes"] += c.get("bytes", 0)
        if c.get("label") not in p["labels"]:
            p["labels"].append(c.get("label"))
    for p in by_pid.values():
        p["name"] = _process_name(p["pid"], p["labels"][0] if p["labels"] else "?")
        p["memory_mb"] = mb(p["memory_bytes"])
    return sorted(by_pid.values(), key=lambda p: p["pid"])


def select(doc: dict, npu: int | None = None, session: str | None = None) -> dict:
    """``doc`` with only NPU ``npu`` and the sessions ``session`` names (directory name, job or owner pid)."""
    sessions = []
    for s in doc["sessions"]:
        if session is not None and session not in (s["name"], s.get("job"), str(s.get("owner_pid"))):
            continue
        cards = [c for c in s["cards"] if npu is None or c["npu"] == npu]
        if cards:
            sessions.append({**s, "cards": cards})
    return {**doc, "sessions": sessions}


# =========================================================================== the command
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npu-smi", description="Show the simulated NPUs of the running npusim "
                                     "sessions on this machine, read live from the cards (CANN's npu-smi).")
    sub = parser.add_subparsers(dest="command", metavar="info", required=True)
    info = sub.add_parser("info", help="the NPUs, their HBM use and their processes")
    info.add_argument("-t", "--type", choices=("usages",), help="usages: the usage of one NPU (needs -i)")
    info.add_argument("-i", "--id", type=int, dest="npu", metavar="N", help="only NPU N (of every session)")
    info.add_argument("-c", "--chip", type=int, default=0, metavar="C", help="chip id (simulated NPUs have chip 0)")
    info.add_argument("--json", action="store_true", help="print JSON for scripts")
    info.add_argument("--session", metavar="S", help="only the session S: its directory name, job or owner pid")
    info.add_argument("--root", metavar="DIR", help=f"where to look for card sockets (default {default_root()})")
    info.add_argument("--timeout", type=float, default=QUERY_TIMEOUT, metavar="SEC",
                      help=f"seconds each card has to answer (default {QUERY_TIMEOUT:g})")
    return parser


def _fail(message: str) -> int:
    print(f"npu-smi: {message}", file=sys.stderr)
    return 1


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.type == "usages" and args.npu is None:
        parser.error("info -t usages needs -i N (the NPU id)")
    if args.chip != 0:
        return _fail(f"chip {args.chip} does not exist: simulated NPUs have one chip (0)")
    doc = collect(args.root, timeout=args.timeout)
    if not doc["sessions"]:
        return _fail(f"no running npusim session on this machine (no card answers under {doc['root']}); "
                     "`launch`, `rt.init()` or `launch --up` start one")
    picked = select(doc, args.npu, args.session)
    if not picked["sessions"]:
        have = sorted({c["npu"] for s in select(doc, None, args.session)["sessions"] for c in s["cards"]})
        if args.session is not None and not have:
            names = ", ".join(f"{s['name']} (pid {s['owner_pid']})" for s in doc["sessions"])
            return _fail(f"no running session matches {args.session!r} (running: {names})")
        return _fail(f"NPU {args.npu} does not exist (running NPUs: {', '.join(map(str, have))})")
    if args.json:
        print(json.dumps(picked, indent=2))
    elif args.type == "usages":
        print(render_usages(picked))
    else:
        print(render_info(picked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
