"""The pyACL facade's contract, function by function: each parameter in turn gets each hostile value (wrong
type, None, negative, huge, NaN, a freed pointer, a destroyed stream / event / context / buffer / dataset /
desc, an unloaded model, a pointer or stream of device 1 while device 0 is current) while the others hold
valid arguments. pyACL returns codes: a call must return (never raise — only ``util.*_to_ptr`` raise
ValueError, as pyACL's binding does), a failure must be a real code (not 500000, npusim's "internal
error"), and a wrong-typed or out-of-range value must be a failure, not silently accepted.
"""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest

import acl
import rt

pytestmark = pytest.mark.timeout(300)
INTERNAL = 500000
GIANT = 10 ** 5000
BAD = {
    "None": None, "neg": -1, "huge": 2 ** 64, "giant": GIANT, "float": 1.5, "nan": math.nan, "str": "x",
    "list": [1, "a"], "dict": {"a": object()}, "object": object(), "objarray": np.array([None, 1], dtype=object),
}
# Parameters for which some "bad" value is valid in pyACL (C ints and flags that take any value, objects
# passed through to the program's callback, sizes the call ignores).
VALID = {
    ("rt.launch_callback", "user_data"): set(BAD), ("util.start_thread", "args_list"): set(BAD),
    ("rt.synchronize_stream_with_timeout", "timeout"): {"neg"},          # -1: wait without a limit
    ("rt.process_report", "timeout"): {"neg"},
    ("rt.memset", "value"): {"neg"}, ("rt.memset_async", "value"): {"neg"},   # an int32: -1 fills 0xff bytes
    ("float_to_float16", "value"): {"neg", "float", "nan"},                # any float has an fp16 pattern
    ("mdl.get_input_index_by_name", "name"): {"str"},                     # "x" is the model's input
    ("create_tensor_desc", "data_type"): {"neg"}, ("create_tensor_desc", "format"): {"neg"},  # -1: undefined
    ("app_log", "message"): {"str"}, ("set_tensor_desc_name", "name"): {"str"}, ("mdl.get_dynamic_hw", "index"): {"neg"},
    ("mdl.get_op_attr", "op_name"): {"str"}, ("mdl.get_input_dynamic_gear_count", "index"): {"neg"},
    ("mdl.get_input_dynamic_dims", "index"): {"neg"}, ("mdl.get_op_attr", "attr"): {"str"},    # index: -1 reserved
    ("set_tensor_format", "format"): {"neg"}, ("set_tensor_storage_format", "format"): {"neg"},
    **{(f"op.set_attr_{t}", "attr_name"): {"str"} for t in ("bool", "int", "float", "string", "data_type", "list_bool",
                                                           "list_int", "list_float", "list_string", "list_data_type",
                                                           "list_list_int")},
    ("op.set_attr_int", "attr_value"): {"neg"}, ("op.set_attr_float", "attr_value"): {"neg", "float", "nan"},
    ("op.set_attr_string", "attr_value"): {"str"}, ("op.set_attr_list_string", "attr_value"): set(),
    **{(f, "attr"): {"None"} for f in ("op.execute", "op.execute_v2", "op.compile", "op.compile_and_execute",
                                       "op.compile_and_execute_v2")},          # no attributes
    ("op.create_handle", "op_attr"): {"None"},
    **{(f, "op_path"): {"None", "str"} for f in ("op.compile", "op.compile_and_execute",
                                                  "op.compile_and_execute_v2")},   # unused for built-in ops
}
# Valid values that wait for something the sweep never provides (pyACL's -1: no time limit).
BLOCKS = {("rt.process_report", "timeout", "neg")}
SKIP = {"init", "finalize", "rt.reset_device", "rt.reset_device_force", "get_recent_err_msg",
        "util.bytes_to_ptr", "util.numpy_to_ptr", "util.numpy_contiguous_to_ptr"}   # lifecycle; raise by design


class Goods:
    """Valid facade arguments by parameter name (ints, as pyACL's handles are), made fresh for each call."""

    def __init__(self, tmp_path, model: bytes):
        self.tmp_path = tmp_path
        self.hosts: list[int] = []                   # pinned buffers made for calls, freed after the sweep
        self.model = model
        (tmp_path / "sweep.om").write_bytes(model)
        self.keep = []                                 # host objects whose addresses are in use

    def model_bytes(self):
        return self.model

    def model_id(self):
        return acl.mdl.load_from_mem(self.model_bytes(), len(self.model_bytes()))[0]

    def desc(self):
        d = acl.mdl.create_desc()
        acl.mdl.get_desc(d, self.model_id())
        return d

    def dev(self, n=4096):
        return acl.rt.malloc(n, 0)[0]

    def op_handle(self):
        """A handle to Add over two fp32 [2, 4] descs (the op model loaded first, as create_handle needs)."""
        from rt.mdl import GraphBuilder
        g = GraphBuilder("sweep_add")
        g.output("y", g.op("Add", [g.input("a", "float32", [2, 4]), g.input("b", "float32", [2, 4])]))
        data = g.serialize()
        acl.op.load(acl.util.bytes_to_ptr(data), len(data))
        return acl.op.create_handle("Add", [self.tensor_desc(), self.tensor_desc()], [self.tensor_desc()], 0)[0]

    def buffer(self):
        return acl.create_data_buffer(self.dev(64), 64)

    def dataset(self):
        ds = acl.mdl.create_dataset()
        acl.mdl.add_dataset_buffer(ds, self.buffer())
        return ds

    def host(self, n=4096):
        ptr = acl.rt.malloc_host(n)[0]
        self.hosts.append(ptr)
        return ptr

    def free_hosts(self):
        """Pinned memory counts against the process's limit for as long as it lives: give it back (the
        calls under test free some of it already; freeing those again is a harmless error code)."""
        while self.hosts:
            acl.rt.free_host(self.hosts.pop())

    def value(self, func, name):
        table = {
            "data": self.dev, "size": lambda: 64, "data_type": lambda: 0, "data_buffer": self.buffer,
            "value": lambda: 1, "config_path": lambda: None, "device_id": lambda: 0, "flag": lambda: 0,
            "priority": lambda: 0, "context": lambda: acl.rt.create_context(0)[0], "event": self.recorded_event,
            "stream": lambda: acl.rt.create_stream()[0], "peer_device_id": lambda: 1, "flags": lambda: 0,
            "start": self.recorded_event, "end": self.recorded_event, "dev_ptr": self.dev, "host_ptr": self.host,
            "attr": lambda: 0, "fn": lambda: (lambda data: None), "user_data": lambda: None, "block_type": lambda: 1,
            "policy": lambda: 0, "dst": self.dev, "dest_max": lambda: 64, "src": self.dev, "count": lambda: 64,
            "kind": lambda: 3, "max_count": lambda: 64, "timeout": lambda: 10, "thread_id": self.thread,
            "dataset": self.dataset, "model_desc": self.desc, "model_id": self.model_id, "input": self.dataset,
            "output": self.dataset, "index": lambda: 0, "name": lambda: "x",
            "model_path": lambda: str(self.tmp_path / "sweep.om"), "model": self.model_bytes,
            "model_size": lambda: len(self.model_bytes()), "batch_size": lambda: 2, "dims": lambda: [2, 4],
            "ptr": self.host, "shape": lambda: (4,), "npy_type": lambda: 2, "func": lambda: (lambda a: None),
            "args_list": lambda: None, "log_level": lambda: 1, "message": lambda: "x", "format": lambda: 2,
            "desc": self.tensor_desc, "tensor_desc": self.tensor_desc, "mem_type": lambda: 0, "work_ptr": lambda: 0, "work_size": lambda: 0,
            "weight_ptr": lambda: 0, "weight_size": lambda: 0, "height": lambda: 4, "width": lambda: 4,
            "aipp_set": lambda: acl.mdl.create_aipp(1), "attr_name": lambda: "k", "attr_value": lambda: 1,
            "op_type": lambda: "Add", "input_desc": lambda: [self.tensor_desc(), self.tensor_desc()],
            "inputs": lambda: [self.buffer(), self.buffer()], "output_desc": lambda: [self.tensor_desc()],
            "outputs": lambda: [self.buffer()], "engine_type": lambda: 0, "compile_flag": lambda: 0,
            "op_path": lambda: "", "model_dir": lambda: str(self.tmp_path), "op_name": lambda: "x",
            "gear_count": lambda: 0, "op_attr": lambda: 0, "handle": self.op_handle,
        }
        if func == "mdl.get_op_attr" and name == "attr":
            return "_datadump_original_op_names"
        if func.startswith("op.") and name == "attr":
            return acl.op.create_attr()
        if func.startswith("op.set_attr_list"):
            return {"attr_value": ["x"] if "string" in func else [[1]] if "list_list" in func else [1]}.get(
                name, table[name]())
        if func == "mdl.set_input_dynamic_dims" and name == "dims":
            return {"dimCount": 2, "name": "", "dims": [2, 4]}
        return table[name]()

    def tensor_desc(self):
        return acl.create_tensor_desc(0, [2, 4], 2)

    def recorded_event(self):
        ev = acl.rt.create_event()[0]
        acl.rt.record_event(ev, 0)
        return ev

    def thread(self):
        tid = acl.util.start_thread(lambda a: None, None)[0]
        return tid


class Hostile:
    """Handles that were valid once or belong elsewhere, by parameter name: (label, factory)."""

    def __init__(self, goods: Goods):
        self.g = goods

    def freed_dev(self):
        p = self.g.dev()
        acl.rt.free(p)
        return p

    def foreign(self, make):
        acl.rt.set_device(1)
        try:
            return make()
        finally:
            acl.rt.set_device(0)

    def destroyed(self, make, destroy):
        h = make()
        destroy(h)
        return h

    def values(self, name):
        g = self.g
        ptr = [("freed", self.freed_dev), ("device1", lambda: self.foreign(g.dev))]
        stream = [("destroyed", lambda: self.destroyed(lambda: acl.rt.create_stream()[0], acl.rt.destroy_stream)),
                  ("device1", lambda: self.foreign(lambda: acl.rt.create_stream()[0]))]
        event = [("destroyed", lambda: self.destroyed(g.recorded_event, acl.rt.destroy_event))]
        table = {
            "dev_ptr": ptr, "dst": ptr, "src": ptr, "data": ptr, "stream": stream, "event": event, "start": event,
            "end": event,
            "context": [("destroyed", lambda: self.destroyed(lambda: acl.rt.create_context(0)[0],
                                                             acl.rt.destroy_context))],
            "data_buffer": [("destroyed", lambda: self.destroyed(g.buffer, acl.destroy_data_buffer))],
            "dataset": [("destroyed", lambda: self.destroyed(g.dataset, acl.mdl.destroy_dataset))],
            "input": [("destroyed", lambda: self.destroyed(g.dataset, acl.mdl.destroy_dataset))],
            "model_desc": [("destroyed", lambda: self.destroyed(g.desc, acl.mdl.destroy_desc))],
            "model_id": [("unloaded", lambda: self.destroyed(g.model_id, acl.mdl.unload))],
            "host_ptr": [("freed", lambda: self.destroyed(g.host, acl.rt.free_host))],
            "desc": [("destroyed", lambda: self.destroyed(g.tensor_desc, acl.destroy_tensor_desc))],
            "tensor_desc": [("destroyed", lambda: self.destroyed(g.tensor_desc, acl.destroy_tensor_desc))],
            "attr": [("destroyed", lambda: self.destroyed(acl.op.create_attr, acl.op.destroy_attr))],
            "handle": [("destroyed", lambda: self.destroyed(g.op_handle, acl.op.destroy_handle))],
        }
        return table.get(name, [])


def facade_functions():
    out = []
    for prefix, mod in (("", acl), ("rt", acl.rt), ("mdl", acl.mdl), ("op", acl.op), ("util", acl.util),
                        ("media", acl.media)):
        for name in sorted(getattr(mod, "__all__", dir(mod))):
            fn = getattr(mod, name, None)
            qual = f"{prefix}.{name}" if prefix else name
            if name.startswith("_") or not callable(fn) or inspect.isclass(fn) or qual in SKIP:
                continue
            params = [p.name for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]
            if params:
                out.append((qual, fn, params))
    return out


def _failed(fn, result):
    """(failed, code) of a facade result, by the convention its wrapper follows (acl/_core.py): ``code``
    returns ret, ``values`` returns (*values, ret), ``plain`` returns a value, its default on failure."""
    form = getattr(fn, "acl_form", "code")                          # undecorated: returns ret itself
    if form == "plain":
        default = fn.acl_default
        same = result is default or (type(result) is type(default) and result == default)
        return same, None
    code = result[-1] if form == "values" and isinstance(result, tuple) else result
    return code != 0, code


def _check(qual, fn, param, label, call, must_fail, problems):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = call()
    except BaseException as e:  # noqa: BLE001 - the point of the test
        problems.append(f"{qual}({param}={label}) raised {type(e).__name__}: {str(e)[:150]}")
        return
    failed, code = _failed(fn, result)
    if code == INTERNAL:
        problems.append(f"{qual}({param}={label}) -> 500000 internal error: {acl.get_recent_err_msg()}"[:300])
    elif must_fail and not failed and label not in VALID.get((qual, param), ()):
        problems.append(f"{qual}({param}={label}) was accepted (returned {result!r})"[:300])


def sweep(tmp_path, model):
    goods, hostile_goods = Goods(tmp_path, model), Goods(tmp_path, model)
    hostile = Hostile(hostile_goods)
    problems = []
    try:
        for qual, fn, params in facade_functions():
            ctx = acl.rt.create_context(0)[0]
            for param in params:
                cases = [(label, (lambda v=v: v), not (param == "stream" and v is None)) for label, v in BAD.items()]
                cases += [(label, make, False) for label, make in hostile.values(param)]
                for label, make, must_fail in cases:
                    if (qual, param, label) in BLOCKS:
                        continue
                    acl.rt.set_context(ctx)
                    try:
                        kwargs = {p: (make() if p == param else goods.value(qual, p)) for p in params}
                    except Exception as e:  # noqa: BLE001
                        problems.append(f"sweep setup for {qual}({param}={label}) failed: {e!r}"[:300])
                        continue
                    _check(qual, fn, param, label, lambda: fn(**kwargs), must_fail, problems)
                    acl.rt.set_context(ctx)
                    acl.rt.synchronize_device()
            acl.rt.set_context(ctx)
            p, ret = acl.rt.malloc(64, 0)                        # after each function the card still works
            if ret or acl.rt.memset(p, 64, 3, 64) or acl.rt.free(p) or acl.rt.destroy_context(ctx):
                problems.append(f"after {qual}: the runtime is broken: {acl.get_recent_err_msg()}")
                break
    finally:
        goods.free_hosts()
        hostile_goods.free_hosts()
    return problems


def test_every_facade_function_returns_a_real_code(monkeypatch, tmp_path, sweep_model):
    monkeypatch.setenv("NPUSIM_BACKEND", "local")
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NPUSIM_ACL_STRICT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert acl.init() == 0
    try:
        assert acl.rt.set_device(0) == 0
        problems = sweep(tmp_path, sweep_model)
    finally:
        rt.finalize()
    assert not problems, f"{len(problems)} calls escaped the contract:\n  " + "\n  ".join(problems)
