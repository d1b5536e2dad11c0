"""The collectives, with HCCL's argument order: asynchronous, ordered on ``stream`` like any task.

What can be checked on the host (dtype, op, counts, root/peer range, buffers on the communicator's
card, the stream's card) raises ``HcclError(HCCL_E_PARA/HCCL_E_PTR)`` at the call; everything found
while running (mismatched calls across ranks, timeouts, dead peers) surfaces at the covering
stream synchronize.

One call's path: checked and numbered here (the checks once per call signature and communicator: a call
whose arguments, of the same types, the communicator has seen is only checked for what can change — the
communicator, its card and the stream still alive) → the observers see it (``rt/host/seam.py``: race detector, flight
recorder, fault injection; ``diag.py`` tells them what HCCL's calls are) → run in this process
(``hostpath.py``) or sent to the card as a stream task → the card's HCCL extension (``card/``).
"""

from __future__ import annotations

import functools

import numpy as np

from rt import args
from rt.addresses import decode_addr
from rt.errors import AclError
from rt.host.runtime import RUNTIME
from rt.host.seam import SEAM
from rt.host.streams import stream_handle

from .diag import CALLS
from .errors import HcclError, hccl_para
from .handle import Call, CommHandle, _check_comm
from .types import HcclDataType, HcclResult, hccl_dtype, hccl_np_dtype, reduce_op

HCCL_SEND, HCCL_RECV = 0, 1


def _stream(comm: CommHandle, stream, call):
    if stream is None or (isinstance(stream, int) and stream == 0):
        with RUNTIME.using(comm.ctx):
            return stream_handle(None, call)
    try:
        st = stream_handle(stream, call)
    except AclError as e:
        raise HcclError(HcclResult.HCCL_E_PARA, e.message) from None
    if (st.ctx.node, st.ctx.physical) != (comm.ctx.node, comm.ctx.physical):
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: {st!r} is not on the communicator's card {comm.ctx.physical}")
    return st


MAX_COUNT = 1 << 56          # elements: far beyond any card, small enough that counts × sizes stay 64-bit


def _count(count, call, name="count") -> int:
    return args.integer(count, call, name, hi=MAX_COUNT, error=hccl_para)


def _buf(comm: CommHandle, ptr, nbytes: int, itemsize: int, call: str, name: str):
    null = ptr is None or (args.is_int(ptr) and ptr == 0)
    if nbytes == 0 and null:
        return None
    if null:
        raise HcclError(HcclResult.HCCL_E_PTR, f"{call}: {name} buffer is null")
    where = decode_addr(ptr) if args.is_int(ptr) else None
    if where is None:
        raise HcclError(HcclResult.HCCL_E_PTR, f"{call}: {name} buffer {args.shown(ptr)} is not a device address")
    ptr = int(ptr)
    if where != (comm.ctx.node, comm.ctx.physical):
        raise HcclError(HcclResult.HCCL_E_PTR, f"{call}: {name} buffer {ptr:#x} is on card {where[1]} (node "
                                               f"{where[0]}), not the communicator's card {comm.ctx.physical}")
    if ptr % itemsize:
        raise HcclError(HcclResult.HCCL_E_PTR, f"{call}: {name} buffer {ptr:#x} is not aligned to the element size "
                                               f"{itemsize}")
    return [ptr, nbytes]


def _root(comm, root, call, name="root"):
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < comm.size:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: {name} {args.shown(root)} is outside [0, {comm.size})")
    return int(root)


MAX_CALLS = 256              # call signatures remembered per communicator


def _known(comm, key) -> Call | None:
    """The checked call for this signature, if this communicator has seen it and it is still valid (the
    communicator, its card and the stream alive); None: check the arguments. Keys carry the arguments'
    types, so ``1.0`` or ``True`` never passes for ``1``; unhashable arguments are never remembered."""
    if not isinstance(comm, CommHandle):
        return None
    try:
        known = comm.calls.get(key)
    except TypeError:
        return None
    if known is None or comm.destroyed or comm.ctx.destroyed or known.stream.destroyed or known.stream.ctx.destroyed:
        return None
    return known


def _signature(*args) -> tuple:
    """A call's arguments and their types: the key its checked form is remembered under (``_known``)."""
    return (*args, *map(type, args))


def _launch(comm, stream, op, params, buffers, call, key=None):
    """Check the rest (the stream), number the call and run it; ``key``: remember the checked call under it."""
    st = _stream(comm, stream, call)
    params = dict(params, fingerprint=_fingerprint(op, params.get("count", 0), params.get("dtype"), params.get("op"),
                                                   params.get("root")), algo=comm.options.get("algo", ""))
    known = Call(op, st, params, buffers)
    if key is not None:
        try:
            if len(comm.calls) >= MAX_CALLS:
                comm.calls.clear()
            comm.calls[key] = known
        except TypeError:
            pass
    _go(comm, known)


def _go(comm, known: Call) -> None:
    """One call of a checked signature: numbered, seen by the observers, run here or sent to the card."""
    st, op, buffers = known.stream, known.op, known.buffers
    seq = next(comm.seqs)
    params = known.params               # the signature's own, unchanged by anyone unless copied here
    if comm.lead is not None:           # this rank's process leads its node's round of it
        comm.lead.expect(seq, op, params)
    seen = None
    if SEAM.on:
        # Seen before it runs (a rank stopped inside it is seen in it); an injected fault's card part comes back
        # in params["fault"], and only the card can carry it out.
        if SEAM.copy_params:
            params = dict(params)
        seen = SEAM.collective(st, "collective", op, seq, comm, params, buffers, CALLS)
    host = None if "fault" in params else comm._host    # read inline (the hot path); False: not built yet
    if host is False:
        host = comm.host_path()
    if host is not None and host.run(st, seq, known, params):
        if seen is not None:
            task = host.handed_task
            SEAM.placed(seen, task, task is None)
        return
    task = st.ctx.client.submit(st.id, "hccl_collective", comm.id, comm.rank, seq, op, params, known.wire)
    if seen is not None:
        SEAM.placed(seen, task)


@functools.lru_cache(maxsize=4096)
def _fingerprint(op: str, count: int, dtype, rop, root) -> str:
    """What every rank's call must agree on, as text (``all_reduce(count=1024, dtype=FP32, op=SUM)``); one per
    call signature, computed once."""
    desc = f"count={count}, dtype={HcclDataType(dtype).name if dtype is not None else '-'}"
    if rop is not None:
        desc += f", op={reduce_op(rop).name}"
    if root is not None:
        desc += f", root={root}"
    return f"{op}({desc})"


def _prep(comm, count, dtype, call):
    _check_comm(comm, call)
    count = _count(count, call)
    code = hccl_dtype(dtype)
    return count, int(code), hccl_np_dtype(code).itemsize


def all_reduce(send, recv, count, dtype, op, comm, stream=None) -> None:
    """recv = op over ranks of send (count elements); send may equal recv."""
    key = ("all_reduce", send, recv, count, dtype, op, stream, type(send), type(recv), type(count), type(dtype),
           type(op), type(stream))
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    call = "all_reduce"
    count, code, isz = _prep(comm, count, dtype, call)
    rop = int(reduce_op(op))
    n = count * isz
    _launch(comm, stream, call, {"count": count, "dtype": code, "op": rop},
            {"send": _buf(comm, send, n, isz, call, "send"), "recv": _buf(comm, recv, n, isz, call, "recv")}, call,
            key)


def broadcast(buf, count, dtype, root, comm, stream=None) -> None:
    """Root's buf to every rank's buf."""
    key = ("broadcast", buf, count, dtype, root, stream, type(buf), type(count), type(dtype), type(root), type(stream))
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    call = "broadcast"
    count, code, isz = _prep(comm, count, dtype, call)
    root = _root(comm, root, call)
    _launch(comm, stream, call, {"count": count, "dtype": code, "root": root},
            {"recv": _buf(comm, buf, count * isz, isz, call, "buf")}, call, key)


def reduce(send, recv, count, dtype, op, root, comm, stream=None) -> None:
    """Root's recv = op over ranks of send; other ranks' recv is untouched."""
    key = _signature("reduce", send, recv, count, dtype, op, root, stream)
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    call = "reduce"
    count, code, isz = _prep(comm, count, dtype, call)
    root = _root(comm, root, call)
    rop = int(reduce_op(op))
    n = count * isz
    recv_buf = _buf(comm, recv, n, isz, call, "recv") if comm.rank == root else None
    _launch(comm, stream, call, {"count": count, "dtype": code, "op": rop, "root": root},
            {"send": _buf(comm, send, n, isz, call, "send"), "recv": recv_buf}, call, key)


def all_gather(send, recv, send_count, dtype, comm, stream=None) -> None:
    """recv (send_count × ranks) = every rank's send, in rank order."""
    key = ("all_gather", send, recv, send_count, dtype, stream, type(send), type(recv), type(send_count), type(dtype),
           type(stream))
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    call = "all_gather"
    count, code, isz = _prep(comm, send_count, dtype, call)
    _launch(comm, stream, call, {"count": count, "dtype": code},
            {"send": _buf(comm, send, count * isz, isz, call, "send"),
             "recv": _buf(comm, recv, count * isz * comm.size, isz, call, "recv")}, call, key)


def reduce_scatter(send, recv, recv_count, dtype, op, comm, stream=None) -> None:
    """recv (recv_count) = block ``rank`` of op over ranks of send (recv_count × ranks)."""
    key = ("reduce_scatter", send, recv, recv_count, dtype, op, stream, type(send), type(recv), type(recv_count),
           type(dtype), type(op), type(stream))
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    call = "reduce_scatter"
    count, code, isz = _prep(comm, recv_count, dtype, call)
    rop = int(reduce_op(op))
    _launch(comm, stream, call, {"count": count, "dtype": code, "op": rop},
            {"send": _buf(comm, send, count * isz * comm.size, isz, call, "send"),
             "recv": _buf(comm, recv, count * isz, isz, call, "recv")}, call, key)


def scatter(send, recv, recv_count, dtype, root, comm, stream=None) -> None:
    """recv (recv_count) = block ``rank`` of root's send (recv_count × ranks)."""
    key = _signature("scatter", send, recv, recv_count, dtype, root, stream)
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    call = "scatter"
    count, code, isz = _prep(comm, recv_count, dtype, call)
    root = _root(comm, root, call)
    send_buf = _buf(comm, send, count * isz * comm.size, isz, call, "send") if comm.rank == root else None
    _launch(comm, stream, call, {"count": count, "dtype": code, "root": root},
            {"send": send_buf, "recv": _buf(comm, recv, count * isz, isz, call, "recv")}, call, key)


def all_to_all(send, send_count, send_type, recv, recv_count, recv_type, comm, stream=None) -> None:
    """Block j of rank i's send goes to block i of rank j's recv (HcclAlltoAll argument order)."""
    key = _signature("all_to_all", send, send_count, send_type, recv, recv_count, recv_type, stream)
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    call = "all_to_all"
    count, code, isz = _prep(comm, send_count, send_type, call)
    rcount = _count(recv_count, call, "recv_count")
    if rcount != count or int(hccl_dtype(recv_type)) != code:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: send ({count} × {HcclDataType(code).name}) and recv "
                                                f"({rcount} × {hccl_dtype(recv_type).name}) blocks must match")
    n = count * isz * comm.size
    _no_overlap(send, n, recv, n, call)
    _launch(comm, stream, call, {"count": count, "dtype": code},
            {"send": _buf(comm, send, n, isz, call, "send"), "recv": _buf(comm, recv, n, isz, call, "recv")}, call,
            key)


def all_to_all_v(send, send_counts, sdispls, send_type, recv, recv_counts, rdispls, recv_type, comm,
                 stream=None) -> None:
    """Like all_to_all with per-peer counts and displacements (in elements)."""
    call = "all_to_all_v"
    _check_comm(comm, call)
    code = int(hccl_dtype(send_type))
    if int(hccl_dtype(recv_type)) != code:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: send_type and recv_type differ")
    isz = hccl_np_dtype(code).itemsize
    tables = {}
    for name, v in (("send_counts", send_counts), ("sdispls", sdispls), ("recv_counts", recv_counts),
                    ("rdispls", rdispls)):
        tables[name] = args.int_list(v, call, name, length=comm.size, hi=MAX_COUNT, error=hccl_para)
    send_n = max([d + c for d, c in zip(tables["sdispls"], tables["send_counts"])] + [0])
    recv_n = max([d + c for d, c in zip(tables["rdispls"], tables["recv_counts"])] + [0])
    _no_overlap(send, send_n * isz, recv, recv_n * isz, call)
    _launch(comm, stream, call, {"count": 0, "dtype": code, **tables},
            {"send": _buf(comm, send, send_n * isz, isz, call, "send"),
             "recv": _buf(comm, recv, recv_n * isz, isz, call, "recv")}, call)


def _no_overlap(send, send_bytes, recv, recv_bytes, call) -> None:
    """all_to_all reads peers' send blocks while writing recv: the two ranges must not share memory."""
    if args.is_int(send) and args.is_int(recv) and send_bytes and recv_bytes and \
            send < recv + recv_bytes and recv < send + send_bytes:
        raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: send {send:#x} and recv {recv:#x} overlap; in-place "
                                                f"{call} is not supported (use separate buffers)")


def barrier(comm, stream=None) -> None:
    """Every rank's stream waits here until all ranks reached it."""
    key = _signature("barrier", stream)
    known = _known(comm, key)
    if known is not None:
        return _go(comm, known)
    _check_comm(comm, "barrier")
    _launch(comm, stream, "barrier", {"count": 0, "dtype": int(HcclDataType.INT8)}, {}, "barrier", key)


def _p2p(comm, items, stream, call):
    _check_comm(comm, call)
    wire = []
    for kind, buf, count, dtype, peer in items:
        count = _count(count, call)
        code = int(hccl_dtype(dtype))
        isz = hccl_np_dtype(code).itemsize
        peer = _root(comm, peer, call, "dest" if kind == "send" else "src")
        if peer == comm.rank:
            raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: rank {comm.rank} cannot {kind} to itself")
        b = _buf(comm, buf, count * isz, isz, call, "buf") or [0, 0]
        if b[1] == 0:
            raise HcclError(HcclResult.HCCL_E_PARA, f"{call}: count must be > 0 for send/recv")
        wire.append([kind, peer, b[0], count, code, b[1]])
    st = _stream(comm, stream, call)
    if not SEAM.on:
        st.ctx.client.submit(st.id, "hccl_p2p", comm.id, comm.rank, wire)
        return
    params: dict = {}                    # an injected fault's card part comes back in params["fault"]
    seen = SEAM.collective(st, "p2p", call, None, comm, params, wire, CALLS)
    extra = (params["fault"],) if "fault" in params else ()
    task = st.ctx.client.submit(st.id, "hccl_p2p", comm.id, comm.rank, wire, *extra)
    if seen is not None:
        SEAM.placed(seen, task)


def send(buf, count, dtype, dest, comm, stream=None) -> None:
    """Send to ``dest``; completes (on the stream) once the matching recv has the data."""
    _p2p(comm, [("send", buf, count, dtype, dest)], stream, "send")


def recv(buf, count, dtype, src, comm, stream=None) -> None:
    _p2p(comm, [("recv", buf, count, dtype, src)], stream, "recv")


def batch_send_recv(items, comm, stream=None) -> None:
    """Items are (HCCL_SEND|HCCL_RECV, buf, count, dtype, remote_rank) tuples or dicts with those keys."""
    conv = []
    keys = ("type", "buf", "count", "dtype", "remote_rank")
    for i, it in enumerate(args.sequence(items, "batch_send_recv", "items", error=hccl_para)):
        if isinstance(it, dict) and all(k in it for k in keys):
            it = tuple(it[k] for k in keys)
        if not isinstance(it, (list, tuple)) or len(it) != 5:
            raise HcclError(HcclResult.HCCL_E_PARA, f"batch_send_recv: item {i} {args.shown(it)} is not a "
                                                    f"(type, buf, count, dtype, remote_rank) tuple or dict")
        kind, buf, count, dtype, remote = it
        if not args.is_int(kind) or kind not in (HCCL_SEND, HCCL_RECV):
            raise HcclError(HcclResult.HCCL_E_PARA, f"batch_send_recv: item type {args.shown(kind)} is not "
                                                    f"HCCL_SEND/HCCL_RECV")
        conv.append(("send" if kind == HCCL_SEND else "recv", buf, count, dtype, remote))
    _p2p(comm, conv, stream, "batch_send_recv")
