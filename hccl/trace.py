"""The cross-rank analyzer of flight-recorder dumps: ``python -m hccl.trace DIR`` says what went wrong.

Each rank's dump (``trace_rank<N>.json``, written by ``rt/diag/recorder.py``) holds that rank's recent calls with
their states. Read together they answer the questions a hung or failed job leaves: which collective did not
complete and who never entered it (and what that rank did last, where), which rank called something
different (another collective, another count or dtype), whether the ranks called collectives in different
orders, who is stuck in a stream synchronize and behind which card task, which rank died without a dump.

    python -m hccl.trace /tmp/logs            # the diagnosis in plain words
    python -m hccl.trace /tmp/logs --json     # the same as data
    python -m hccl.trace /tmp/logs --ranks    # plus each rank's last entries

``diagnose(directory)`` returns the diagnosis lines; ``launch`` prints them in its failure box.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys

from .types import HcclDataType, reduce_op

LAST_ENTRIES = 5
STUCK_AFTER = 1.0       # seconds in one wait before the analyzer calls a rank stuck there


# ---- reading -----------------------------------------------------------------------------------------------

def load(directory: str) -> dict[str, dict]:
    """``{rank label: dump}`` of every readable ``trace_rank*.json`` in ``directory``."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "trace_rank*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        data["path"] = path
        out[str(data.get("rank"))] = data
    return out


def ranges(ranks) -> str:
    """[0, 1, 2, 4, 6, 7] -> "0–2, 4, 6–7"."""
    ranks = sorted(set(ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}–{ranks[j]}" if j > i + 1 else f"{ranks[i]}, {ranks[j]}")
        i = j + 1
    return ", ".join(parts)


def _rank_word(ranks) -> str:
    return ("rank " if len(set(ranks)) == 1 else "ranks ") + ranges(ranks)


def _short(s: str) -> str:
    path, _, line = s.rpartition(":")
    return f"{os.path.basename(path) or path}:{line}" if path else s


def site(e: dict) -> str:
    """"common.py:17 (called from train.py:40)"."""
    here, _, up = (e.get("site") or "?").partition(" < ")
    return f"{_short(here)} (called from {_short(up)})" if up else _short(here)


def call_text(e: dict) -> str:
    """all_reduce(count=1024, dtype=FP32, op=SUM)."""
    if e.get("kind") == "p2p":
        items = ", ".join(f"{k} {c} to/from rank {p}" for k, p, c, _ in e.get("items", []))
        return f"{e['op']}({items})"
    if e.get("kind") != "collective":
        return e["op"]
    args = [f"count={e.get('count')}"]
    try:
        args.append(f"dtype={HcclDataType(e['dtype']).name}")
    except (KeyError, ValueError, TypeError):
        pass
    if e.get("reduce") is not None:
        try:
            args.append(f"op={reduce_op(e['reduce']).name}")
        except Exception:  # noqa: BLE001 - a dump from another version: show the number
            args.append(f"op={e['reduce']}")
    if e.get("root") is not None:
        args.append(f"root={e['root']}")
    return f"{e['op']}({', '.join(args)})"


def entry_text(e: dict, now_ns: int | None = None) -> str:
    what = call_text(e) if e.get("kind") in ("collective", "p2p") else e["op"]
    seq = f" #{e['seq']}" if e.get("seq") is not None else ""
    state = e.get("state") or ("returned" if e.get("t_end") else "waiting")
    if e.get("kind") == "wait" and not e.get("t_end") and now_ns:
        state = f"waiting for {(now_ns - e['t_enq']) / 1e9:.1f} s"
    return f"{what.split('(')[0]}{seq} ({state}) at {site(e)}" if e.get("kind") == "collective" else \
        f"{what}{seq} ({state}) at {site(e)}"


# ---- diagnosing ----------------------------------------------------------------------------------------------

def task_name(t) -> str:
    """A card task-log entry's name: "kernel axpy", "all_reduce #3", "memcpy"."""
    note = t[5] or {}
    if "kernel" in note:
        return f"kernel {note['kernel']}"
    if "op" in note:
        return f"{note['op']} #{note.get('seq')}"
    if "model" in note:
        return f"model {note['model']} execution"
    return t[0].split("#")[0]


class Rank:
    """One rank's dump, indexed."""

    def __init__(self, label: str, data: dict):
        self.label, self.data = label, data
        self.entries = data.get("entries", [])
        self.now = data.get("now_ns")
        self.by_comm: dict[str, dict[int, dict]] = collections.defaultdict(dict)
        for e in self.entries:
            if e.get("kind") == "collective" and e.get("seq") is not None:
                self.by_comm[e["comm"]][e["seq"]] = e

    @property
    def number(self):
        try:
            return int(self.label)
        except ValueError:
            return self.label

    def last_in(self, comm: str) -> dict | None:
        seqs = self.by_comm.get(comm)
        return seqs[max(seqs)] if seqs else None

    def running_task(self, card: str, stream: int):
        """The task running on (card, stream) at the dump, with how long it had run, or None."""
        cards = self.data.get("cards", {})
        if card not in cards:
            return None
        now, per_stream = cards[card]
        for t in per_stream.get(str(stream), []):
            if not t[3]:
                return task_name(t), (now - t[2]) / 1e9
        return None


def diagnose(directory: str, expected_world: int | None = None, ended: dict | None = None) -> list[str]:
    """Plain-language findings, most important first (empty: nothing wrong found). ``ended`` (from ``launch``):
    how ranks ended — exit code, or "stopped" by launch — said for the ranks that left no dump."""
    dumps = load(directory)
    if not dumps:
        return [f"no flight-recorder dumps in {directory}"]
    ranks = {label: Rank(label, d) for label, d in dumps.items()}
    lines: list[str] = []
    world = expected_world or max([e.get("size") or 0 for r in ranks.values() for e in r.entries] + [0])
    present = {r.number for r in ranks.values()}
    if world:
        lines += _missing(world, present, ended or {})
    comms = sorted({c for r in ranks.values() for c in r.by_comm})
    for comm in comms:
        lines += _diagnose_comm(comm, ranks, world)
    lines += _stuck_waits(ranks)
    lines += _exceptions(ranks)
    if not lines:
        lines.append(f"{len(ranks)} dumps read; every recorded collective completed on every rank")
    return lines


def _missing(world: int, present: set, ended: dict) -> list[str]:
    """The ranks that left no dump, by how they ended when launch knows it."""
    missing = [i for i in range(world) if i not in present]
    normal = [i for i in missing if ended.get(i) == 0]
    stopped = [i for i in missing if ended.get(i) == "stopped"]
    died = [i for i in missing if i not in normal and i not in stopped]
    lines = []
    if normal:
        lines.append(f"{_rank_word(normal)} exited normally (code 0) while the others still ran, and left no "
                     f"flight-recorder dump: a rank that leaves early leaves its peers' collectives unanswered")
    if stopped:
        lines.append(f"{_rank_word(stopped)}: stopped by launch after the failure, before writing a flight-recorder "
                     f"dump")
    if died:
        lines.append(f"{_rank_word(died)} left no flight-recorder dump (the process died before it could write one: "
                     f"killed, or crashed outside Python)")
    return lines


def _diagnose_comm(comm: str, ranks: dict, world: int) -> list[str]:
    members = {r.number: r for r in ranks.values() if comm in r.by_comm}
    size = max(e.get("size") or 0 for r in members.values() for e in r.by_comm[comm].values())
    all_ranks = list(range(size)) if size else sorted(members)
    seqs = sorted({s for r in members.values() for s in r.by_comm[comm]})
    lines = []
    # Different calls under one sequence number: a mismatch, or the same calls in different orders.
    for s in seqs:
        fps = {n: r.by_comm[comm][s] for n, r in members.items() if s in r.by_comm[comm]}
        groups = collections.defaultdict(list)
        for n, e in fps.items():
            groups[e.get("fingerprint") or call_text(e)].append(n)
        if len(groups) < 2:
            continue
        major = max(groups, key=lambda fp: len(groups[fp]))
        ref = fps[groups[major][0]]
        for fp, who in groups.items():
            if fp == major:
                continue
            e = fps[who[0]]
            swapped = _order_swap(comm, s, who, groups[major], members)
            if swapped:
                lines.append(swapped)
            else:
                lines.append(f"{call_text(ref).split('(')[0]} #{s} on comm '{comm}': {_rank_word(who)} called "
                             f"{call_text(e)} at {site(e)} where {_rank_word(groups[major])} called {call_text(ref)} "
                             f"at {site(ref)}")
        return lines           # later sequence numbers follow from the first disagreement
    # The first collective that did not complete everywhere.
    for s in seqs:
        entered = {n: r.by_comm[comm][s] for n, r in members.items() if s in r.by_comm[comm]}
        done = [n for n, e in entered.items() if e.get("state") == "completed"]
        if len(done) == len(members):        # every rank that left a dump completed it (dead ones: below)
            continue
        some = next(iter(entered.values()))
        head = f"{some['op']} #{s} on comm '{comm}'"
        parts = []
        if done:
            parts.append(f"{_rank_word(done)} completed")
        by_state = collections.defaultdict(list)
        for n, e in entered.items():
            if e.get("state") != "completed":
                by_state[e.get("state") or "unknown"].append(n)
        for state, who in sorted(by_state.items()):
            e = entered[who[0]]
            text = f"{_rank_word(who)} {state}"
            if state in ("enqueued", "not completed"):
                busy = ranks_busy(members[who[0]], e)
                if busy:
                    text += f" (its stream was still running {busy})"
            if state == "failed" and e.get("t_end"):
                text += f" at {site(e)}"
            parts.append(text)
        never = [n for n in all_ranks if n not in entered]
        msg = f"{head}: " + "; ".join(parts)
        lines.append(msg)
        for n in never:
            r = members.get(n) or next((x for x in ranks.values() if x.number == n), None)
            if r is None:
                lines.append(f"  rank {n} is not in it: it left no dump (see above); its peers were waiting for it")
                continue
            last = r.last_in(comm)
            tail = r.entries[-1] if r.entries else None
            text = f"  rank {n} never entered it; its last entry on this comm is " + \
                (entry_text(last) if last else "none")
            if tail is not None and tail is not last:
                text += f", its last call of all {entry_text(tail, r.now)}"
            lines.append(text + _where_now(r))
        return lines
    return lines


def _exception_line(text: str) -> str:
    """The line of a traceback that names the exception (its message's first line, for a message of several)."""
    lines = text.strip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    for line in lines[(frames[-1] + 1 if frames else 0):]:
        if line and not line[0].isspace():
            return line
    return lines[-1] if lines else ""


def _exceptions(ranks: dict) -> list[str]:
    """Uncaught exceptions, one line per distinct error (ranks raising the same kind of error grouped)."""
    groups: dict[str, list] = collections.defaultdict(list)
    texts = {}
    for r in sorted(ranks.values(), key=lambda r: str(r.number)):
        exc = r.data.get("exception")
        if not exc:
            continue
        last = _exception_line(exc)
        where = re.findall(r'File "([^"]+)", line (\d+)', exc)
        user = [w for w in where if not re.search(r"/(rt|hccl|acl|torch_npu|torch|launcher)/", w[0])]
        at = f" at {os.path.basename(user[-1][0])}:{user[-1][1]}" if user else ""
        m = re.match(r"([\w.]+): (\[\d+\])?", last)
        key = (m.group(1) + (m.group(2) or "")) if m else last[:80]
        groups[key].append(r.number)
        texts.setdefault(key, (last, at))
    out = []
    for key, who in groups.items():
        last, at = texts[key]
        text = last if len(last) <= 400 else last[:400] + " ..."
        out.append(f"{_rank_word(who)} raised {text}{at}" if len(who) == 1 else
                   f"{_rank_word(who)} raised {key.split('.')[-1]}; rank {who[0]}'s: {text}{at}")
    return out


def _where_now(r: Rank) -> str:
    stack = r.data.get("main_stack") or []
    return f"; when dumped it was at {_short(stack[-1].split(' in ')[0])} (in {stack[-1].split(' in ')[-1]})" \
        if stack else ""


def ranks_busy(r: Rank, e: dict) -> str | None:
    t = r.running_task(e.get("card"), e.get("stream"))
    if t is None:
        return None
    return f"{t[0]} for {t[1]:.1f} s"


def _order_swap(comm, s, who, others, members) -> str | None:
    """Rank(s) ``who`` called at s and s+1 what the others called at s+1 and s."""
    a, b = members[who[0]].by_comm[comm], members[others[0]].by_comm[comm]
    if s + 1 not in a or s + 1 not in b:
        if s + 1 in a and s + 1 not in b:
            pass
        return None

    def fp(e):
        return e.get("fingerprint") or call_text(e)
    if fp(a[s]) == fp(b[s + 1]) and fp(a[s + 1]) == fp(b[s]):
        return (f"collective order differs on comm '{comm}' at #{s}: {_rank_word(who)} called {call_text(a[s])} at "
                f"{site(a[s])} then {call_text(a[s + 1])} at {site(a[s + 1])}; {_rank_word(others)} called "
                f"{call_text(b[s])} at {site(b[s])} then {call_text(b[s + 1])} at {site(b[s + 1])}")
    return None


def _stuck_waits(ranks: dict) -> list[str]:
    lines = []
    for r in sorted(ranks.values(), key=lambda r: str(r.number)):
        waits = [e for e in r.entries if e.get("kind") == "wait" and not e.get("t_end")]
        for e in waits[-1:]:
            held = (r.now - e["t_enq"]) / 1e9 if r.now else 0.0
            if held < STUCK_AFTER:           # the wait the dump interrupted (the failure it reports)
                continue
            busy = r.running_task(e.get("card"), e.get("stream"))
            behind = ""
            if busy is not None:
                behind = f"; the stream is running {busy[0]} (for {busy[1]:.1f} s)"
            pending = [x for x in r.entries if x.get("stream") == e.get("stream") and x.get("card") == e.get("card")
                       and x.get("kind") in ("collective", "p2p") and x.get("state") not in ("completed", None)]
            if pending:
                behind += f"; not completed on it: {', '.join(entry_text(x) for x in pending[-3:])}"
            lines.append(f"rank {r.number} is stuck in {e['op']}(stream {e['stream']}) at {site(e)} for {held:.1f} s"
                         f"{behind}")
    return lines


def rank_tails(directory: str) -> list[str]:
    out = []
    for label, d in sorted(load(directory).items()):
        r = Rank(label, d)
        out.append(f"rank {label} (pid {d.get('pid')}, dumped on: {'; '.join(d.get('reasons', []))[:200]}):")
        for e in r.entries[-LAST_ENTRIES:]:
            out.append(f"  {entry_text(e, r.now)}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hccl.trace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory")
    p.add_argument("--world-size", type=int, default=None, help="ranks expected (default: from the dumps)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--ranks", action="store_true", help="also each rank's last entries")
    ns = p.parse_args(argv)
    if not os.path.isdir(ns.directory):
        print(f"hccl.trace: {ns.directory} is not a directory", file=sys.stderr)
        return 2
    lines = diagnose(ns.directory, ns.world_size)
    if ns.json:
        print(json.dumps({"diagnosis": lines, "ranks": rank_tails(ns.directory) if ns.ranks else []}, indent=1))
        return 0
    for line in lines:
        print(line)
    if ns.ranks:
        print()
        for line in rank_tails(ns.directory):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
