"""One timeline of a whole job: the ranks' profile dumps merged into Chrome-trace / Perfetto JSON, in the launching
process once the job ended.

``launch --profile out.json`` (or ``spawn(..., profile="out.json")``) runs every rank with ``NPUSIM_PROFILE_DIR``
set; each writes ``profile_rank<N>.json`` at exit (``rt/diag/recorder.py``: its host calls and the task log of
every card stream it used). :func:`write` turns them into one trace:

- a process per rank ("rank N (host)"): its collectives and p2p calls (a short slice at the call; a host-path
  collective lasts as long as it ran in the call), event records and waits, and every blocking wait
  (synchronize_stream/device/event) as a slice from call to return;
- a process per card ("card C (node N)") with a thread per stream: every task the stream ran (copies,
  kernels, model executions, collectives named "all_reduce #3 [ring]" with one child slice per algorithm
  step), and a counter track "memory in use" (bytes reserved on the card after each task);
- flow arrows from each host call to the card task it enqueued, and between the ranks of one collective
  (rank 0 → 1 → ... → N-1, on the slices that ran it).

Open it in https://ui.perfetto.dev (drag the file in) or chrome://tracing. Times are microseconds from the
job's first recorded event.
"""

from __future__ import annotations

import glob
import json
import os

HOST_SLICE_US = 2.0          # width of a host call's slice when it did not wait


def load(directory: str) -> list[dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "profile_rank*.json"))):
        try:
            with open(path) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


def _rank_of(d: dict) -> int:
    try:
        return int(d.get("rank"))
    except (TypeError, ValueError):
        return 10_000 + int(d.get("pid", 0))


def build(dumps: list[dict]) -> dict:
    """The Chrome-trace object of these profile dumps."""
    starts = [e["t_enq"] for d in dumps for e in d.get("entries", [])]
    starts += [t[2] for d in dumps for _, (_, per) in d.get("cards", {}).items() for log in per.values() for t in log]
    t0 = min(starts) if starts else 0

    def us(ns):
        return (ns - t0) / 1000.0

    events: list[dict] = []
    cards = sorted({name for d in dumps for name in d.get("cards", {})})
    card_pid = {name: 1001 + i for i, name in enumerate(cards)}
    slices: dict[tuple, tuple] = {}          # (comm, seq, rank) -> (pid, tid, ts) of the slice that ran it
    task_slot: dict[tuple, tuple] = {}       # (card, stream, host task index) -> (pid, tid, ts)
    flow_id = 0

    for name, pid in card_pid.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
    done_streams = set()
    for d in sorted(dumps, key=_rank_of):
        rank = _rank_of(d)
        for card, (_, per_stream) in d.get("cards", {}).items():
            pid = card_pid[card]
            for sid, log in per_stream.items():
                sid = int(sid)
                if (pid, sid, rank) not in done_streams:
                    done_streams.add((pid, sid, rank))
                    label = "default stream" if sid == 0 else f"stream {sid}"
                    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": sid * 1000 + rank % 1000,
                                   "args": {"name": f"{label} (rank {rank})"}})
                tid = sid * 1000 + rank % 1000
                for label, host_index, start, end, ok, note, memory in log:
                    if not end:
                        continue
                    note = note or {}
                    base = label.split("#")[0]
                    title = f"{note['op']} #{note['seq']} [{note.get('algo', '?')}]" if "op" in note else \
                        f"kernel {note['kernel']}" if "kernel" in note else \
                        f"model {note['model']} execution" if "model" in note else base
                    ts = us(start)
                    events.append({"ph": "X", "name": title, "cat": "card", "pid": pid, "tid": tid, "ts": ts,
                                   "dur": max((end - start) / 1000.0, 0.001),
                                   "args": {"task": label, "ok": bool(ok), **{k: v for k, v in note.items()
                                                                             if k != "steps"}}})
                    prev = start
                    for i, step_end in enumerate(note.get("steps", [])):
                        events.append({"ph": "X", "name": f"step {i}", "cat": "step", "pid": pid, "tid": tid,
                                       "ts": us(prev), "dur": max((step_end - prev) / 1000.0, 0.001)})
                        prev = step_end
                    if memory:
                        events.append({"ph": "C", "name": "memory in use", "pid": pid, "ts": us(end),
                                       "args": {"bytes": memory}})
                    if host_index:
                        task_slot[(card, sid, host_index)] = (pid, tid, ts)
                    if "comm" in note:
                        slices[(note["comm"], note["seq"], rank)] = (pid, tid, ts)

    for d in sorted(dumps, key=_rank_of):
        rank = _rank_of(d)
        pid = 1 + rank
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {rank} (host)"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "host calls"}})
        for e in d.get("entries", []):
            ts = us(e["t_enq"])
            dur = (e["t_end"] - e["t_enq"]) / 1000.0 if e.get("t_end") and (e.get("kind") == "wait"
                                                                             or e.get("task") is None) else HOST_SLICE_US
            name = e["op"] + (f" #{e['seq']}" if e.get("seq") is not None else "")
            args = {k: e[k] for k in ("site", "count", "dtype", "root", "algo", "comm", "stream", "state", "error")
                    if e.get(k) not in (None, "")}
            events.append({"ph": "X", "name": name, "cat": "host", "pid": pid, "tid": 0, "ts": ts,
                           "dur": max(dur, 0.001), "args": args})
            target = task_slot.get((e.get("card"), e.get("stream"), e.get("task"))) if e.get("task") else None
            if target is not None:
                flow_id += 1
                events.append({"ph": "s", "name": "enqueue", "cat": "flow", "id": flow_id, "pid": pid, "tid": 0,
                               "ts": ts})
                events.append({"ph": "f", "bp": "e", "name": "enqueue", "cat": "flow", "id": flow_id,
                               "pid": target[0], "tid": target[1], "ts": target[2]})
            if e.get("kind") == "collective" and e.get("task") is None:
                slices.setdefault((e["comm"], e["seq"], rank), (pid, 0, ts))

    by_call: dict[tuple, list] = {}
    for (comm, seq, rank), where in slices.items():
        by_call.setdefault((comm, seq), []).append((rank, where))
    for (comm, seq), members in sorted(by_call.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        members.sort()
        for (_, a), (_, b) in zip(members, members[1:]):
            flow_id += 1
            events.append({"ph": "s", "name": "collective", "cat": "collective", "id": flow_id, "pid": a[0],
                           "tid": a[1], "ts": a[2], "args": {"comm": comm, "seq": seq}})
            events.append({"ph": "f", "bp": "e", "name": "collective", "cat": "collective", "id": flow_id,
                           "pid": b[0], "tid": b[1], "ts": b[2]})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "npusim launch --profile", "ranks": len(dumps), "cards": cards}}


def write(directory: str, path: str) -> int:
    """Merge the profile dumps in ``directory`` into the trace file ``path``; returns the ranks merged."""
    dumps = load(directory)
    trace = build(dumps)
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(trace, f)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temp file next to the user's path
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(dumps)
