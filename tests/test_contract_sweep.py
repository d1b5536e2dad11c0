"""Every public function of ``rt``, ``rt.mdl``, ``rt.ops`` and ``hccl`` with hostile arguments: wrong types,
negative, huge (2**64, and a 5000-digit int whose repr() fails), None, NaN, and handles that are no longer or
not here valid (a freed pointer, a destroyed stream / event / context / communicator, a pointer, stream or
event of device 1 while device 0 is current); the pyACL facade has its own sweep (tests/contract/
test_acl_sweep.py). Whatever a call does with them, it must either work or raise ``rt.NpuError`` with a real
code (never TypeError, OverflowError, a hang or a crash), and the runtime must keep working after.

For each function every parameter in turn gets each bad value while the others hold a valid argument built
fresh for the call (a live pointer, stream, event, model, communicator ...), so the check reaches the code
that handles that one parameter.
"""

from __future__ import annotations

import inspect
import math
import os

import numpy as np
import pytest

BAD = {
    "None": None, "neg": -1, "huge": 2 ** 64, "big": 2 ** 63, "giant": 10 ** 5000,   # repr() of giant fails
    "float": 1.5, "nan": math.nan, "str": "x",
    "bytes": b"\x00" * 3, "list": [1, "a"], "dict": {"a": object()}, "object": object(), "bool": True,
    "objarray": np.array([None, 1], dtype=object), "np.float": np.float64(2.5), "ndarray2d": np.ones((2, 2)),
}

# Lifecycle calls change what every other call sees; they have their own tests (tests/rt/test_runtime.py).
SKIP = {"rt.finalize", "rt.init", "hccl.init"}


class Goods:
    """Valid arguments by parameter name, made fresh for each call (calls may free or destroy them)."""

    def __init__(self, rt, comm, tmp_dir, model: bytes):
        self.rt, self.comm, self.tmp_dir = rt, comm, tmp_dir
        self.model = model
        self._file = None

    def model_bytes(self):
        return self.model

    def value(self, func: str, name: str):
        rt, mdl = self.rt, self.rt.mdl
        ptr = lambda: rt.malloc(4096)                                          # noqa: E731
        table = {
            "size": lambda: 256, "policy": lambda: 0, "ptr": ptr, "dst": ptr, "src": lambda: np.zeros(4096, np.uint8),
            "dst_max": lambda: 4096, "count": lambda: 16, "kind": lambda: rt.ACL_MEMCPY_DEFAULT,
            "max_count": lambda: 4096, "value": lambda: 1, "device": lambda: 0, "peer": lambda: 1, "flags": lambda: 0,
            "attr": lambda: rt.HBM, "ctx": lambda: rt.create_context(0), "stream": rt.create_stream,
            "event": self.recorded_event, "start": self.recorded_event, "end": self.recorded_event,
            "timeout_ms": lambda: 100, "fn": lambda: (lambda data: None), "user_data": lambda: None,
            "block": lambda: True, "seconds": lambda: 0.0, "shape": lambda: (4, 4), "dtype": lambda: "float32",
            "buf": self.buf(func), "op": self.op(func), "inputs": self.inputs(func), "outputs": self.outputs(func),
            "attrs": lambda: {}, "arg": lambda: "user:sweep", "data": self.model_bytes, "path": self.model_file,
            "model_id": lambda: mdl.load_from_mem(self.model_bytes()),
            "desc": lambda: mdl.get_desc(mdl.load_from_mem(self.model_bytes())), "i": lambda: 0,
            "index": lambda: 0, "name": lambda: "x", "ds": mdl.create_dataset, "dataset": mdl.create_dataset,
            "batch": lambda: 2, "dims": lambda: [2, 4], "model": self.model_bytes, "world": lambda: 2,
            "rank": lambda: 0, "mode": lambda: "batch", "min_shard_bytes": lambda: 0,
            # hccl
            "comm": lambda: self.comm, "send": ptr, "recv": ptr, "send_count": lambda: 4, "recv_count": lambda: 4,
            "send_type": lambda: "fp32", "recv_type": lambda: "fp32", "root": lambda: 0, "dest": lambda: 0,
            "send_counts": lambda: [4], "recv_counts": lambda: [4], "sdispls": lambda: [0], "rdispls": lambda: [0],
            "items": lambda: [], "nranks": lambda: 1, "root_info": self.hccl.get_root_info,
            "devices": lambda: [3], "rank_ids": lambda: [0], "sub_comm_id": lambda: 1, "sub_rank": lambda: 0,
            "rank_table_path": self.model_file, "grads": lambda: [rt.empty((4,))], "params": lambda: [rt.empty((4,))],
            "average": lambda: True, "config": lambda: {"exec_timeout": 5},
        }
        return table[name]()

    @property
    def hccl(self):
        import hccl
        return hccl

    def recorded_event(self):
        ev = self.rt.create_event()
        self.rt.record_event(ev, None)
        return ev

    def model_file(self):
        if self._file is None:
            self._file = os.path.join(self.tmp_dir, "sweep.om")
            with open(self._file, "wb") as f:
                f.write(self.model_bytes())
        return self._file

    def buf(self, func):
        if func in ("rt.free_host",):
            return lambda: self.rt.malloc_host(64)
        if func.startswith("rt.mdl."):
            return lambda: self.rt.mdl.create_data_buffer(self.rt.malloc(64), 64)
        return lambda: self.rt.malloc(4096)

    def op(self, func):
        if func == "rt.launch_kernel":
            return lambda: "Relu"
        return lambda: "sum"

    def inputs(self, func):
        if func.startswith("rt.mdl."):
            return lambda: self.dataset(16)
        return lambda: [self.rt.Tensor.from_numpy(np.ones((2, 4), np.float32))]

    def outputs(self, func):
        if func.startswith("rt.mdl."):
            return lambda: self.dataset(16)
        return lambda: [self.rt.empty((2, 4))]

    def dataset(self, nbytes):
        mdl = self.rt.mdl
        ds = mdl.create_dataset()
        mdl.add_dataset_buffer(ds, mdl.create_data_buffer(self.rt.malloc(64), 64))
        return ds


class Hostile:
    """Handles that were valid once or belong to another card, by parameter name: ``(label, factory)``. The
    sweep passes them with device 0 current; a call must work or raise an NpuError, never crash or hang."""

    def __init__(self, rt):
        self.rt = rt

    def on_device1(self, make):
        rt = self.rt
        ctx = rt.get_context()
        rt.set_device(1)
        try:
            return make()
        finally:
            rt.set_context(ctx)

    @property
    def hccl(self):
        import hccl
        return hccl

    def gone(self, make, destroy):
        h = make()
        destroy(h)
        return h

    def recorded_event(self):
        ev = self.rt.create_event()
        self.rt.record_event(ev, None)
        return ev

    def values(self, func: str, name: str):
        rt = self.rt
        ptr = [("freed", lambda: self.gone(lambda: rt.malloc(4096), rt.free)),
               ("device1", lambda: self.on_device1(lambda: rt.malloc(4096)))]
        stream = [("destroyed", lambda: self.gone(rt.create_stream, rt.destroy_stream)),
                  ("device1", lambda: self.on_device1(rt.create_stream))]
        event = [("destroyed", lambda: self.gone(self.recorded_event, rt.destroy_event)),
                 ("device1", lambda: self.on_device1(self.recorded_event))]
        ctx = [("destroyed", lambda: self.gone(lambda: rt.create_context(0), rt.destroy_context))]
        comm = [("destroyed", lambda: self.gone(lambda: self.hccl.comm_init_all([0])[0], self.hccl.comm_destroy))]
        table = {"ptr": ptr, "dst": ptr, "src": ptr, "send": ptr, "recv": ptr, "stream": stream, "event": event,
                 "start": event, "end": event, "ctx": ctx, "comm": comm}
        if name == "buf" and not func.startswith("rt.mdl.") and func != "rt.free_host":
            return ptr
        return table.get(name, [])


def _public_functions():
    import hccl
    import rt
    import rt.mdl
    import rt.ops
    out = []
    for prefix, mod in (("rt", rt), ("rt.mdl", rt.mdl), ("rt.ops", rt.ops), ("hccl", hccl)):
        for name in sorted(getattr(mod, "__all__", dir(mod))):
            fn = getattr(mod, name)
            if name.startswith("_") or not inspect.isfunction(fn) or f"{prefix}.{name}" in SKIP:
                continue
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            if params:
                out.append((f"{prefix}.{name}", fn, params))
    return out


def _call(goods, qualname, fn, params, bad_param, bad_value):
    kwargs = {}
    for p in params:
        if p.name == bad_param:
            kwargs[p.name] = bad_value
        elif p.default is not inspect.Parameter.empty and p.name not in ("stream", "dtype"):
            continue
        elif qualname.startswith("rt.ops.") and p.name == "inputs":
            continue
        else:
            kwargs[p.name] = goods.value(qualname, p.name)
    if qualname.startswith("rt.ops."):
        inputs = [goods.rt.Tensor.from_numpy(np.ones((2, 4), np.float32))]
        if bad_param == "inputs":
            return fn(bad_value)
        return fn(*inputs, **kwargs)
    return fn(**kwargs)


def _cases(hostile, qualname, param):
    """(label, a factory of the bad value) for one parameter: the BAD values, then the hostile handles."""
    return [(label, (lambda v=bad: v)) for label, bad in BAD.items()] + hostile.values(qualname, param)


def sweep(rt, comm, tmp_dir, model, functions=None):
    """Run the sweep; returns the list of calls that escaped the contract."""
    goods, hostile = Goods(rt, comm, tmp_dir, model), Hostile(rt)
    problems = []
    for qualname, fn, params in functions or _public_functions():
        ctx = rt.create_context(0)            # everything this function's calls make goes with the context
        for p in params:
            for label, make in _cases(hostile, qualname, p.name):
                rt.set_context(ctx)
                try:
                    _call(goods, qualname, fn, params, p.name, make())
                except rt.NpuError as e:
                    if not isinstance(e.code, int) or e.code <= 0 or not e.message:
                        problems.append(f"{qualname}({p.name}={label}): NpuError without a real code: {e!r}")
                except Exception as e:  # noqa: BLE001 - the point of the test
                    problems.append(f"{qualname}({p.name}={label}): {type(e).__name__}: {e}"[:300])
                try:
                    rt.set_context(ctx)
                    rt.synchronize_device()
                except rt.NpuError:
                    pass                                  # an async failure of the bad call: fine
        try:                                              # after each function the card still works
            rt.set_context(ctx)
            ptr = rt.malloc(64)
            rt.memset(ptr, 64, 3, 64)
            rt.free(ptr)
            rt.destroy_context(ctx)
        except Exception as e:  # noqa: BLE001
            problems.append(f"after {qualname}: the runtime is broken: {type(e).__name__}: {e}")
            break
    return problems


@pytest.mark.slow
def test_every_public_function_raises_only_npu_errors(hccl_rt_for_sweep, tmp_path, monkeypatch, sweep_model):
    rt, comm = hccl_rt_for_sweep
    monkeypatch.chdir(tmp_path)          # functions that write files (rt.trace_dump) write them here
    problems = sweep(rt, comm, str(tmp_path), sweep_model)
    assert not problems, f"{len(problems)} calls escaped the contract:\n  " + "\n  ".join(problems)


@pytest.fixture
def hccl_rt_for_sweep(rt_local):
    import hccl
    import rt.mdl  # noqa: F401  (rt.mdl attribute)
    comm, = hccl.comm_init_all([0])
    yield rt_local, comm
