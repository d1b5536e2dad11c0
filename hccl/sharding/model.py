"""Running a sharded model: each local rank loads its stage models and enqueues stage, collective, stage, ...
on its own stream; batch mode gives every rank a slice of the batch and all-gathers the outputs.
The plans come from ``hccl/sharding/plan.py`` (see its docstring for both modes)."""

from __future__ import annotations

import dataclasses

import numpy as np

import rt
from rt.args import shown
from rt.constants import AclErrorCode
from rt.errors import AclError
from rt.host.runtime import RUNTIME
from rt.mdl import api
from rt.mdl import format as fmt
from rt.mdl.shapes import infer_shapes

from .. import api as hccl_api
from ..comm import Communicator
from ..types import hccl_dtype
from .plan import DEFAULT_MIN_SHARD_BYTES, INVALID, Collective, RankPlan, as_model, plan_tensor


def _on(ctx):
    return RUNTIME.using(ctx)


def _fits(shape, declared) -> bool:
    return len(shape) == len(declared) and all(w in (-1, d) for d, w in zip(shape, declared))


class _Rank:
    """One rank driven by this process: its communicator, stream and loaded stage models."""

    def __init__(self, comm, steps: list):
        self.comm = comm
        self.steps = steps
        self.ids: dict[int, int] = {}
        with _on(comm.ctx):
            self.stream = rt.create_stream()
            try:
                for i, step in enumerate(steps):
                    if isinstance(step, fmt.ModelDef):
                        self.ids[i] = api.load_from_mem(fmt.serialize(step))
            except BaseException:
                self.unload()
                raise

    def unload(self) -> None:
        with _on(self.comm.ctx):
            for model_id in self.ids.values():
                api.unload(model_id)
            self.ids.clear()
            if self.stream is not None:
                rt.destroy_stream(self.stream)
                self.stream = None

    def run(self, feeds: dict, batch_gear: int | None = None) -> dict:
        """Enqueue every step on this rank's stream; returns the device tensor of every value made."""
        bufs: dict = {}
        with _on(self.comm.ctx):
            for name, arr in feeds.items():
                t = bufs[name] = rt.empty(arr.shape, arr.dtype)
                if arr.nbytes:
                    rt.memcpy_async(t.ptr, t.nbytes, arr, arr.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE, self.stream)
            for i, step in enumerate(self.steps):
                if isinstance(step, Collective):
                    src = bufs[step.src]
                    code = hccl_dtype(src.dtype)
                    if step.kind == "all_reduce":
                        dst = bufs[step.dst] = rt.empty(src.shape, src.dtype)
                        hccl_api.all_reduce(src.ptr, dst.ptr, src.size, code, "sum", self.comm, self.stream)
                    else:
                        dst = bufs[step.dst] = rt.empty((self.comm.size, *src.shape), src.dtype)
                        hccl_api.all_gather(src.ptr, dst.ptr, src.size, code, self.comm, self.stream)
                    continue
                shapes = [bufs[v.name].shape for v in step.inputs]
                specs = infer_shapes(dataclasses.replace(step, batch_sizes=()), shapes)
                ds_in, ds_out = api.create_dataset(), api.create_dataset()
                for v in step.inputs:
                    t = bufs[v.name]
                    api.add_dataset_buffer(ds_in, api.create_data_buffer(t.ptr, t.nbytes))
                for v in step.outputs:
                    t = bufs[v.name] = rt.empty(specs[v.name].shape, specs[v.name].dtype)
                    api.add_dataset_buffer(ds_out, api.create_data_buffer(t.ptr, t.nbytes))
                if batch_gear is not None:
                    api.set_dynamic_batch_size(self.ids[i], ds_in, 0, batch_gear)
                else:
                    for k, v in enumerate(step.inputs):
                        if -1 in v.shape:
                            api.set_input_dynamic_dims(self.ids[i], ds_in, k, list(shapes[k]))
                api.execute_async(self.ids[i], ds_in, ds_out, self.stream)
        return bufs

    def free(self, bufs: dict) -> None:
        with _on(self.comm.ctx):
            rt.synchronize_stream(self.stream)
            for t in bufs.values():
                t.free()


class ShardedModel:
    """A model loaded across the ranks of a communicator; see the module docstring."""

    def __init__(self, model: fmt.ModelDef, comms: list, mode: str, min_shard_bytes: int):
        self.model, self.mode = model, mode
        self.world = comms[0].size
        self.plans: dict[int, RankPlan] = {}
        self.ranks: list[_Rank] = []
        try:
            for comm in comms:
                if mode == "tensor":
                    plan = plan_tensor(model, self.world, comm.rank, min_shard_bytes=min_shard_bytes)
                else:
                    plan = RankPlan(comm.rank, [model], model.weight_bytes, [], [v.name for v in model.inputs],
                                    [v.name for v in model.outputs])
                self.plans[comm.rank] = plan
                self.ranks.append(_Rank(comm, plan.steps))
        except BaseException:
            self.unload()
            raise

    @property
    def weight_bytes(self) -> dict[int, int]:
        """Bytes of weights each local rank holds."""
        return {rank: plan.weight_bytes for rank, plan in self.plans.items()}

    def _check_inputs(self, inputs) -> list[np.ndarray]:
        model = self.model
        if isinstance(inputs, dict):
            missing = [v.name for v in model.inputs if v.name not in inputs]
            if missing:
                raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                               f"ShardedModel.execute: inputs {missing} of model {model.name!r} not given")
            inputs = [inputs[v.name] for v in model.inputs]
        inputs = [np.ascontiguousarray(a) for a in inputs]
        if len(inputs) != len(model.inputs):
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                           f"ShardedModel.execute: got {len(inputs)} inputs, model {model.name!r} has "
                           f"{len(model.inputs)} ({[v.name for v in model.inputs]})")
        for a, v in zip(inputs, model.inputs):
            # batch mode slices dim 0 over the ranks (``_local_batch`` checks the global batch against it)
            declared = (-1, *v.shape[1:]) if self.mode == "batch" and v.shape else v.shape
            if a.dtype != v.dtype or not _fits(a.shape, declared):
                raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                               f"ShardedModel.execute: input {v.name!r} is {a.dtype}{list(a.shape)}, "
                               f"expected {v.dtype}{list(v.shape)}")
        return inputs

    def execute(self, inputs) -> list[np.ndarray]:
        """Run on every local rank (blocking) with the same host ``inputs`` (list or name → array);
        returns the model outputs, which every rank holds in full."""
        inputs = self._check_inputs(inputs)
        if self.mode == "batch":
            return self._execute_batch(inputs)
        runs = [(rank, rank.run(dict(zip(self.plans[rank.comm.rank].inputs, inputs)))) for rank in self.ranks]
        try:
            first, bufs = runs[0]
            with _on(first.comm.ctx):
                rt.synchronize_stream(first.stream)
            return [bufs[name].numpy(sync=False) for name in self.plans[first.comm.rank].outputs]
        finally:
            for rank, bufs in runs:
                rank.free(bufs)

    def _local_batch(self, batch: int) -> tuple[int, int | None]:
        """(rows per rank, batch gear or None) for a global batch."""
        model, n = self.model, self.world
        want = -(-batch // n)
        if model.batch_sizes:
            fit = [g for g in model.batch_sizes if g >= want]
            if not fit:
                raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                               f"ShardedModel.execute: batch {batch} over {n} ranks needs {want} rows per rank, "
                               f"more than the largest gear {max(model.batch_sizes)} of model {model.name!r}")
            return min(fit), min(fit)
        dim0 = model.inputs[0].shape[0]
        if dim0 == -1:
            return want, None
        if batch > dim0 * n:
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                           f"ShardedModel.execute: batch {batch} exceeds {n} ranks x the static batch {dim0} "
                           f"of model {model.name!r}")
        return dim0, None

    def _execute_batch(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        model, n = self.model, self.world
        if any(not a.ndim for a in inputs) or len({a.shape[0] for a in inputs}) != 1:
            raise AclError(AclErrorCode.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                           f"ShardedModel.execute (batch mode): every input needs the same dim 0, got "
                           f"{[list(a.shape) for a in inputs]}")
        batch = inputs[0].shape[0]
        local, gear = self._local_batch(batch)
        padded = []
        for a in inputs:
            p = np.zeros((local * n, *a.shape[1:]), a.dtype)
            p[:batch] = a
            padded.append(p)
        runs = []
        for rank in self.ranks:
            r = rank.comm.rank
            feeds = {v.name: p[r * local:(r + 1) * local] for v, p in zip(model.inputs, padded)}
            bufs = rank.run(feeds, batch_gear=gear)
            with _on(rank.comm.ctx):
                for v in model.outputs:
                    out = bufs[v.name]
                    if not out.shape or out.shape[0] != local:
                        raise AclError(INVALID, f"ShardedModel (batch mode): output {v.name!r} has shape "
                                                f"{list(out.shape)}, not {local} rows of the batch slice")
                    dst = bufs[f"{v.name}::gathered"] = rt.empty((n, *out.shape), out.dtype)
                    hccl_api.all_gather(out.ptr, dst.ptr, out.size, hccl_dtype(out.dtype), rank.comm,
                                    rank.stream)
            runs.append((rank, bufs))
        try:
            first, bufs = runs[0]
            with _on(first.comm.ctx):
                rt.synchronize_stream(first.stream)
            results = []
            for v in model.outputs:
                g = bufs[f"{v.name}::gathered"].numpy(sync=False)
                results.append(g.reshape((n * local, *g.shape[2:]))[:batch])
            return results
        finally:
            for rank, bufs in runs:
                rank.free(bufs)

    def unload(self) -> None:
        """Unload every stage model and release the streams."""
        for rank in self.ranks:
            rank.unload()
        self.ranks = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unload()

    def __repr__(self) -> str:
        return (f"ShardedModel({self.model.name!r}, mode={self.mode!r}, world {self.world}, local ranks "
                f"{sorted(self.plans)}, weight bytes per rank {self.weight_bytes})")


def load_sharded(model, comm, mode: str = "tensor", *, min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES) -> ShardedModel:
    """Load ``model`` (a path, the file's bytes or a ModelDef) across the ranks of ``comm``.

    ``comm`` is this process's Communicator (one rank per process, as under ``launch``) or a list
    of Communicators of one communicator (one process driving several cards, ``comm_init_all``).
    ``mode`` is ``"tensor"`` (weights split Megatron-style) or ``"batch"`` (a full copy per card).
    Every rank of the communicator must call it (collectively, like the collectives it issues).
    """
    comms = list(comm) if isinstance(comm, (list, tuple)) else [comm]
    if not comms or not all(isinstance(c, Communicator) and not c.destroyed for c in comms):
        raise AclError(INVALID, f"load_sharded: comm must be a live hccl Communicator or a list of them, got {shown(comm)}")
    if len({c.id for c in comms}) != 1 or len({c.rank for c in comms}) != len(comms):
        raise AclError(INVALID, "load_sharded: the communicators must be distinct ranks of one communicator")
    if not isinstance(mode, str) or mode not in ("tensor", "batch"):
        raise AclError(INVALID, f"load_sharded: mode {shown(mode)}, expected 'tensor' or 'batch'")
    if isinstance(min_shard_bytes, bool) or not isinstance(min_shard_bytes, int) or min_shard_bytes < 0:
        raise AclError(INVALID, f"load_sharded: min_shard_bytes={shown(min_shard_bytes)}, expected an int >= 0")
    return ShardedModel(as_model(model), sorted(comms, key=lambda c: c.rank), mode, min_shard_bytes)
