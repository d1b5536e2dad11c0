"""What each ``"hccl"`` collective does on the card, in the group's executor thread (``work.Executor``): copy the
tensors into card memory, run npusim's HCCL there, copy the result back — with torch_npu's additions around
HCCL's four reductions, and its uneven forms built from the even ones.

- bool and uint8 reductions run on int32 copies (as torch_npu casts them), so SUM/PRODUCT of bools are or/and;
- ``ReduceOp.AVG`` is SUM then a division by the group size (truncating for integers, as torch_npu on Ascend950);
  ``PREMUL_SUM(f)`` scales a copy of the input by ``f``, then SUM;
- uneven ``all_gather`` (outputs of different sizes, torch_npu's AllGatherV) and uneven ``reduce_scatter``
  (inputs of different sizes, its ReduceScatterV) pad every block to the largest and run the even collective;
- a send to the group's own rank waits in the group's ``SelfChannel`` for the matching recv from itself.
"""

from __future__ import annotations

import queue

import torch
import torch.distributed as dist

import hccl
import rt
from hccl.errors import HcclError
from hccl.types import HcclReduceOp, HcclResult

from .tensors import download, hccl_dtype, upload

_OPS = {dist.ReduceOp.SUM: HcclReduceOp.SUM, dist.ReduceOp.PRODUCT: HcclReduceOp.PROD,
        dist.ReduceOp.MIN: HcclReduceOp.MIN, dist.ReduceOp.MAX: HcclReduceOp.MAX}


def _hccl_op(rop) -> HcclReduceOp:
    for op, code in _OPS.items():
        if rop == op:
            return code
    return HcclReduceOp.SUM                                   # AVG and PREMUL_SUM reduce with SUM


def _factor(rop) -> float:
    f = rop.factor
    return float(f.item() if isinstance(f, torch.Tensor) else f)


def prepare(t: torch.Tensor, rop) -> torch.Tensor:
    """What HCCL reduces for ``t`` under ``rop``: ``t`` itself, an int32 copy (bool, uint8) or a scaled copy."""
    if t.dtype in (torch.bool, torch.uint8):
        return t.to(torch.int32)
    if rop == dist.ReduceOp.PREMUL_SUM:
        return t.mul(_factor(rop))
    return t


def finish(result: torch.Tensor, out: torch.Tensor, rop, size: int) -> None:
    """AVG's division, then the result into ``out`` (when HCCL reduced a copy)."""
    if rop == dist.ReduceOp.AVG:
        if result.dtype.is_floating_point or result.dtype.is_complex:
            result.div_(size)
        else:
            result.copy_(torch.div(result, size, rounding_mode="trunc"))
    if result is not out:
        out.copy_(result)


def reduce(pg, ex, t: torch.Tensor, rop, root=None) -> None:
    """all_reduce (``root`` None) or reduce into ``t`` in place."""
    work = prepare(t, rop)
    ptr = upload(ex, "in", [work])
    if root is None:
        hccl.all_reduce(ptr, ptr, work.numel(), hccl_dtype(work), _hccl_op(rop), pg.comm, ex.stream)
    else:
        hccl.reduce(ptr, ptr, work.numel(), hccl_dtype(work), _hccl_op(rop), root, pg.comm, ex.stream)
    if root is None or root == pg.rank():
        download(ex, ptr, [work])
        finish(work, t, rop, pg.size())
    else:
        rt.synchronize_stream(ex.stream)


def broadcast(pg, ex, t: torch.Tensor, root: int) -> None:
    nbytes = t.numel() * t.element_size()
    ptr = upload(ex, "in", [t]) if pg.rank() == root else ex.buffer("in", nbytes)
    hccl.broadcast(ptr, t.numel(), hccl_dtype(t), root, pg.comm, ex.stream)
    if pg.rank() != root:
        download(ex, ptr, [t])
    else:
        rt.synchronize_stream(ex.stream)


def _padded(blocks, count: int, like: torch.Tensor) -> torch.Tensor:
    """``blocks`` one after another, each padded with zeros to ``count`` elements."""
    flat = torch.zeros(len(blocks), count, dtype=like.dtype)
    for i, b in enumerate(blocks):
        flat[i, :b.numel()] = b.detach().reshape(-1).cpu()
    return flat


def all_gather(pg, ex, inp: torch.Tensor, outs) -> None:
    """Every rank's ``inp`` into ``outs`` (``outs`` None: a rank of ``gather`` that keeps nothing). Outputs of
    different sizes: every block padded to the largest."""
    count = max([inp.numel()] + [o.numel() for o in outs or []])
    send = upload(ex, "in", [inp if inp.numel() == count else _padded([inp], count, inp)])
    recv = ex.buffer("out", count * inp.element_size() * pg.size())
    hccl.all_gather(send, recv, count, hccl_dtype(inp), pg.comm, ex.stream)
    if outs is None:
        rt.synchronize_stream(ex.stream)
    elif all(o.numel() == count for o in outs):
        download(ex, recv, outs)
    else:
        flat = torch.empty(pg.size(), count, dtype=inp.dtype)
        download(ex, recv, [flat])
        for o, row in zip(outs, flat):
            o.copy_(row[:o.numel()].view(o.shape))


def reduce_scatter(pg, ex, ins, out: torch.Tensor, rop) -> None:
    """Reduce every rank's ``ins[r]`` into rank r's ``out``. Inputs of different sizes: padded to the largest."""
    ins = [prepare(t, rop) for t in ins] if rop == dist.ReduceOp.PREMUL_SUM else ins
    count = max(t.numel() for t in ins)
    even = all(t.numel() == count for t in ins)
    send = upload(ex, "in", ins if even else [_padded(ins, count, ins[0])])
    recv = ex.buffer("out", count * out.element_size())
    hccl.reduce_scatter(send, recv, count, hccl_dtype(out), _hccl_op(rop), pg.comm, ex.stream)
    result = out if count == out.numel() else torch.empty(count, dtype=out.dtype)
    download(ex, recv, [result])
    if result is not out:
        result = result[:out.numel()].view(out.shape)
    finish(result, out, rop, pg.size())


def scatter(pg, ex, ins, out: torch.Tensor, root: int) -> None:
    send = upload(ex, "in", ins) if ins else 0
    recv = ex.buffer("out", out.numel() * out.element_size())
    hccl.scatter(send, recv, out.numel(), hccl_dtype(out), root, pg.comm, ex.stream)
    download(ex, recv, [out])


def all_to_all(pg, ex, ins, outs, send_counts, recv_counts) -> None:
    """``all_to_all_v`` with element counts per peer (``ins``/``outs`` back to back in rank order)."""
    n = pg.size()
    sdispls = [sum(send_counts[:i]) for i in range(n)]
    rdispls = [sum(recv_counts[:i]) for i in range(n)]
    code = hccl_dtype(ins[0])
    send = upload(ex, "in", ins)
    recv = ex.buffer("out", max(sum(t.numel() * t.element_size() for t in outs), 1))
    hccl.all_to_all_v(send, send_counts, sdispls, code, recv, recv_counts, rdispls, code, pg.comm, ex.stream)
    download(ex, recv, outs)


def send(pg, ex, t: torch.Tensor, dst: int) -> None:
    if dst == pg.rank():
        pg.self_channel.put(t.detach().cpu().clone())
        return
    ptr = upload(ex, "in", [t])
    hccl.send(ptr, t.numel(), hccl_dtype(t), dst, pg.comm, ex.stream)
    rt.synchronize_stream(ex.stream)


def recv(pg, ex, t: torch.Tensor, src: int) -> None:
    if src == pg.rank():
        pg.self_channel.take(t, pg.timeout)
        return
    ptr = ex.buffer("in", t.numel() * t.element_size())
    hccl.recv(ptr, t.numel(), hccl_dtype(t), src, pg.comm, ex.stream)
    download(ex, ptr, [t])


class SelfChannel:
    """Sends of a rank to itself, in order, until its recvs from itself take them (ProcessGroupHCCL runs these
    over a one-rank communicator; HCCL itself refuses a send to the own rank)."""

    def __init__(self):
        self._sent: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, data: torch.Tensor) -> None:
        self._sent.put(data)

    def take(self, t: torch.Tensor, timeout: float) -> None:
        try:
            data = self._sent.get(timeout=timeout)
        except queue.Empty:
            raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"EI0002 recv from the own rank: no send to the own rank "
                                                       f"arrived within {timeout:g} s") from None
        if data.dtype != t.dtype or data.numel() != t.numel():
            raise HcclError(HcclResult.HCCL_E_PARA, f"recv from the own rank: the send was {data.dtype}"
                                                    f"[{data.numel()}], the recv is {t.dtype}[{t.numel()}]")
        t.copy_(data.view(t.shape))
