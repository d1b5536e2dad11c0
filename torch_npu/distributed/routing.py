"""Which backend of a process group serves a call: the ``"hccl"`` backend serves ``npu`` tensors only.

torch_npu registers ProcessGroupHCCL for the ``npu`` device (``register_backend("hccl", ..., devices=["npu"])``),
so c10d routes a collective whose tensors are all CPU tensors to the group's ``cpu`` backend — and a group without
one refuses it: ``RuntimeError: No backend type associated with device type cpu`` (``ProcessGroup::getBackend``).
npusim's ProcessGroupHCCL is a Python ``ProcessGroup`` (torch offers no Python ``Backend`` to subclass), which c10d
calls for every tensor, so it routes the same way itself:

- a call with at least one ``npu`` tensor is the group's (a CPU tensor among them then fails its checks:
  ``Tensors must be NPU and dense``);
- a call whose tensors are all on another device goes to the group's backend for that device — a gloo backend
  for ``cpu`` when the group was made with ``backend="cpu:gloo,npu:hccl"`` — else fails with c10d's text;
- the group reports its device types (``_device_types``) as c10d would: ``[npu]`` for ``"hccl"``, so torch's
  object collectives and ``barrier`` move their tensors to the current npu device, as for torch_npu; ``cpu`` too
  for ``"cpu:gloo,npu:hccl"``, so they stay on the CPU and go to gloo.
"""

from __future__ import annotations

import datetime
import functools
import threading

import torch
import torch.distributed as dist


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def backend_map(pg) -> dict[str, str]:
    """``{device type: backend name}`` of ``pg`` as c10d recorded it; ``{"npu": "hccl"}`` while it is being made."""
    try:
        config = str(dist.get_backend_config(pg))
    except (ValueError, TypeError, RuntimeError):
        return {"npu": "hccl"}
    pairs = [item.split(":", 1) for item in config.split(",") if ":" in item]
    return {device.strip(): name.strip() for device, name in pairs} or {"npu": "hccl"}


def device_types(pg) -> list[torch.device]:
    return [torch.device(d) for d in backend_map(pg)]


class OtherBackends:
    """The group's backends for devices other than ``npu``, made on first use (gloo for ``cpu``)."""

    def __init__(self, store, rank: int, size: int, timeout: float):
        self._store, self._rank, self._size, self._timeout = store, rank, size, timeout
        self._made: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, pg, device_type: str):
        """The backend serving ``device_type`` tensors for ``pg``; c10d's RuntimeError when it has none."""
        name = backend_map(pg).get(device_type)
        if name is None:
            raise RuntimeError(f"No backend type associated with device type {device_type}")
        if name != "gloo":
            raise RuntimeError(f"npusim's hccl group serves {device_type} tensors through gloo only, not {name!r} "
                               f"(use backend=\"{device_type}:gloo,npu:hccl\")")
        with self._lock:
            backend = self._made.get(device_type)
            if backend is None:
                store = dist.PrefixStore(f"npusim-{device_type}-gloo/", self._store)
                backend = dist.ProcessGroupGloo(store, self._rank, self._size,
                                                datetime.timedelta(seconds=self._timeout))
                self._made[device_type] = backend
        return backend

    def shutdown(self) -> None:
        with self._lock:
            made, self._made = list(self._made.values()), {}
        for backend in made:
            try:
                backend.shutdown()
            except RuntimeError:
                pass                              # already torn down with its peers


def npu_only(method):
    """Serve ``method``'s call when one of its tensors is an ``npu`` tensor; else hand the same call to the group's
    backend for their device (``OtherBackends``), or refuse it with c10d's text."""
    @functools.wraps(method)
    def serve(pg, *args, **kwargs):
        tensors = list(_tensors(args)) + list(_tensors(kwargs.values()))
        if not tensors or any(t.device.type == "npu" for t in tensors):
            return method(pg, *args, **kwargs)
        other = pg.other_backends.get(pg, tensors[0].device.type)
        return getattr(other, method.__name__)(*args, **kwargs)
    return serve
