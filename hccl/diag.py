"""HCCL's part of the diagnostics (``rt/diag/``): how its calls look to the observers of the host's seam, and the
codes a ``fail`` fault may give.

``CALLS`` goes with every collective event ``hccl/api.py`` emits (``rt/host/seam.py``): what a call reads and
writes (the race detector) and what a flight-recorder dump shows of it (``python -m hccl.trace`` reads those
fields). The codes of ``fail:...:code=X`` are ``HcclResult``'s, registered with the fault-spec parser on import.
"""

from __future__ import annotations

from rt.diag import faultspec

from .types import HcclResult


class Calls:
    """HCCL's collectives (kind "collective": buffers ``{"send": [ptr, n], "recv": [ptr, n]}``) and send/recv
    (kind "p2p": buffers the wire items ``[kind, peer, ptr, count, dtype, nbytes]``)."""

    @staticmethod
    def accesses(kind: str, label: str, buffers) -> tuple[list, list]:
        """A collective reads send and writes recv (broadcast's buffer both); send/recv read what they send and
        write what they receive."""
        if kind == "p2p":
            return ([("dev", ptr, n) for k, _, ptr, _, _, n in buffers if k == "send"],
                    [("dev", ptr, n) for k, _, ptr, _, _, n in buffers if k == "recv"])
        send, recv = buffers.get("send"), buffers.get("recv")
        reads = [("dev", send[0], send[1])] if send else []
        writes = [("dev", recv[0], recv[1])] if recv else []
        if label == "broadcast" and recv:
            reads.append(("dev", recv[0], recv[1]))
        return reads, writes

    @staticmethod
    def fields(kind: str, comm, params: dict, buffers) -> dict:
        """A call's entry in a dump: its communicator, and the call's values (a p2p call: its items)."""
        out = {"comm": comm.id, "rank": comm.rank, "size": comm.size}
        if kind == "p2p":
            out["items"] = [[k, peer, count, dtype] for k, peer, _, count, dtype, _ in buffers]
        else:
            out.update(dtype=params.get("dtype"), count=params.get("count"), root=params.get("root"),
                       reduce=params.get("op"), algo=params.get("algo") or "", fingerprint=params.get("fingerprint"))
        return out


CALLS = Calls()

_FAILURES = [m for m in HcclResult if m is not HcclResult.HCCL_SUCCESS]
faultspec.register_codes({m.name: int(m) for m in _FAILURES},
                         f"an HcclResult failure code (a name such as HCCL_E_REMOTE, or its number: "
                         f"{', '.join(f'{m.name} {int(m)}' for m in _FAILURES[:4])}, ... HCCL_E_OOM 24)")
