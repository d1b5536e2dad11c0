"""send / recv on a card: each ordered pair of ranks has a mailbox in the communicator's control block.

The sender publishes (segment, offset, size, count, dtype) and bumps the pair's send counter; the receiver
checks count and dtype, copies straight out of the sender's card memory and bumps the received counter,
which the sender waits for (HCCL send semantics). A mismatch fails both sides, each naming the other.
"""

from __future__ import annotations

import numpy as np


from ..errors import HcclError
from ..protocol.ctrlblock import (CARD, P_COUNT, P_DTYPE, P_OFF, P_RECV_DONE, P_SEG, P_SEND, P_SIZE, WaitAbort,
                                  wait_until)
from ..types import HcclDataType, HcclResult
from .endpoint import Endpoint



def _dtype(code: int) -> str:
    """An HcclDataType's name (FP32), as the collectives' mismatch messages print it; the number if unknown."""
    try:
        return HcclDataType(code).name
    except ValueError:
        return str(code)

def post_send(ep: Endpoint, peer: int, view, count: int, dtype: int) -> None:
    """Publish a send to ``peer`` in the pair's mailbox (after the previous one was received)."""
    key = (ep.rank, peer)
    seq = ep.p2p_seq[key] = ep.p2p_seq.get(key, 0) + 1
    box = ep.ctrl.pairs[ep.rank, peer]
    if seq > 1:
        _wait_received(ep, peer, seq - 1)
    box[P_SEG], box[P_OFF], box[P_SIZE] = view
    box[P_COUNT], box[P_DTYPE] = count, dtype
    box[P_SEND] = seq
    ep.ctrl.notify()


def wait_send(ep: Endpoint, peer: int) -> None:
    """Block until ``peer`` has received our latest send (HCCL send semantics)."""
    _wait_received(ep, peer, ep.p2p_seq[(ep.rank, peer)])


def _wait_received(ep: Endpoint, peer: int, seq: int) -> None:
    box = ep.ctrl.pairs[ep.rank, peer]
    what = f"send #{seq} from rank {ep.rank} to rank {peer} on comm '{ep.comm_id}'"
    try:
        wait_until(lambda: box[P_RECV_DONE] >= seq or box[P_RECV_DONE] < 0, timeout=ep.exec_timeout,
                   check=lambda: ep.check_peers([peer], what), sleeper=ep.sleeper)
    except WaitAbort:
        raise HcclError(HcclResult.HCCL_E_TIMEOUT,
                        f"{what}: EI0002 rank {peer} never posted the matching recv within {ep.exec_timeout:g} s "
                        f"(HCCL_EXEC_TIMEOUT)") from None
    if box[P_RECV_DONE] < 0:
        box[P_RECV_DONE] = seq
        raise HcclError(HcclResult.HCCL_E_PARA, f"{what}: the matching recv on rank {peer} expected a different "
                                                f"count or dtype (see that rank's error)")


def recv(ep: Endpoint, peer: int, view, count: int, dtype: int) -> None:
    """Receive ``peer``'s next send into ``view`` = (segment, offset, nbytes) of this card's memory."""
    key = (peer, ep.rank)
    seq = ep.p2p_seq[key] = ep.p2p_seq.get(key, 0) + 1
    box = ep.ctrl.pairs[peer, ep.rank]
    what = f"recv #{seq} on rank {ep.rank} from rank {peer} on comm '{ep.comm_id}'"
    try:
        wait_until(lambda: box[P_SEND] >= seq, timeout=ep.exec_timeout,
                   check=lambda: ep.check_peers([peer], what), sleeper=ep.sleeper)
    except WaitAbort:
        raise HcclError(HcclResult.HCCL_E_TIMEOUT, f"{what}: EI0002 rank {peer} never sent within "
                                                   f"{ep.exec_timeout:g} s (HCCL_EXEC_TIMEOUT)") from None
    if int(box[P_COUNT]) != count or int(box[P_DTYPE]) != dtype:
        got = (int(box[P_COUNT]), int(box[P_DTYPE]))
        box[P_RECV_DONE] = -1
        ep.ctrl.notify()
        raise HcclError(HcclResult.HCCL_E_PARA, f"{what}: rank {peer} sent count={got[0]} dtype={_dtype(got[1])}, "
                                                f"this rank expects count={count} dtype={_dtype(dtype)}")
    seg, off, nbytes = int(box[P_SEG]), int(box[P_OFF]), int(box[P_SIZE])
    src = ep.service.segment_array(int(ep.ctrl.slots[peer, CARD]), seg)[off: off + nbytes]
    dst = ep.service.segment_array(ep.card.index, view[0])[view[1]: view[1] + view[2]]
    np.copyto(dst, src)
    box[P_RECV_DONE] = seq
    ep.ctrl.notify()
