"""Executing models: the executor against numpy forward passes, the card-side ModelStore over a
small fake device memory, and the host pyACL API over a fake runtime (no Ray)."""

import math

import numpy as np
import pytest

from rt.constants import AclErrorCode
from rt.errors import AclError
from rt.mdl import api, format as fmt
from rt.mdl.builder import GraphBuilder
from rt.card.executor import Executor
from rt.card.models import ModelStore

rng = np.random.default_rng(1)


def softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class MLP:
    """64 -> 32 -> 10 classifier with Gemm/Relu/Softmax, and its numpy oracle."""

    def __init__(self, batch_sizes=(1, 2, 4, 8)):
        self.w1 = rng.standard_normal((64, 32)).astype(np.float32) * 0.2
        self.b1 = rng.standard_normal(32).astype(np.float32)
        self.w2 = rng.standard_normal((32, 10)).astype(np.float32) * 0.2
        self.b2 = rng.standard_normal(10).astype(np.float32)
        g = GraphBuilder("mlp")
        x = g.input("x", "float32", [-1 if batch_sizes else 4, 64])
        h = g.op("Relu", [g.op("Gemm", [x, g.constant("w1", self.w1), g.constant("b1", self.b1)])])
        logits = g.op("Gemm", [h, g.constant("w2", self.w2), g.constant("b2", self.b2)])
        g.output("probs", g.op("Softmax", [logits], axis=-1))
        if batch_sizes:
            g.set_dynamic_batch(batch_sizes)
        self.data = g.serialize()
        self.model = fmt.parse(self.data)

    def forward(self, x):
        h = np.maximum(x @ self.w1 + self.b1, 0)
        return softmax(h @ self.w2 + self.b2)


def rejected(code, fn, *args):
    with pytest.raises(AclError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# executor over numpy arrays


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_mlp_matches_numpy_at_every_batch_gear(batch):
    mlp = MLP()
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    (probs,) = Executor(mlp.model).run([x])
    assert probs.shape == (batch, 10)
    np.testing.assert_allclose(probs, mlp.forward(x), rtol=1e-5, atol=1e-6)


def test_layernorm_softmax_graph_matches_numpy():
    scale = rng.standard_normal(16).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    g = GraphBuilder("ln")
    x = g.input("x", "float32", [2, -1, 16])  # dynamic sequence length
    y, mean, inv_std = g.op("LayerNormalization", [x, g.constant("s", scale), g.constant("b", bias)], epsilon=1e-5)
    t = g.op("Transpose", [y], perm=[0, 2, 1])
    g.output("attn", g.op("Softmax", [t], axis=1))
    g.output("mean", mean)
    model = fmt.parse(g.serialize())
    for seq in (1, 3, 7):
        xa = rng.standard_normal((2, seq, 16)).astype(np.float32)
        attn, got_mean = Executor(model).run([xa])
        mu = xa.mean(-1, keepdims=True)
        ln = (xa - mu) / np.sqrt(xa.var(-1, keepdims=True) + 1e-5) * scale + bias
        np.testing.assert_allclose(attn, softmax(ln.transpose(0, 2, 1), axis=1), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got_mean, mu, rtol=1e-5, atol=1e-6)


def test_outputs_fill_caller_buffers_and_copies_for_aliases():
    g = GraphBuilder("alias")
    x = g.input("x", "float32", [3])
    r = g.op("Relu", [x])
    g.output("r", r)
    g.output("r2", r)  # the same value exported twice -> an Identity copy
    g.output("x", x)  # an input exported under its own name
    model = fmt.parse(g.serialize())
    bufs = [np.zeros(16, np.uint8) for _ in range(3)]
    xa = np.array([-1, 0, 2], np.float32)
    outs = Executor(model).run([xa], bufs)
    for out, buf in zip(outs, bufs):
        assert np.shares_memory(out, buf)
    np.testing.assert_array_equal(bufs[0][:12].view(np.float32), [0, 0, 2])
    np.testing.assert_array_equal(bufs[1][:12].view(np.float32), [0, 0, 2])
    np.testing.assert_array_equal(bufs[2][:12].view(np.float32), xa)


def test_executor_input_and_output_mismatches():
    mlp = MLP()
    ex = Executor(mlp.model)
    ok = np.zeros((2, 64), np.float32)
    assert "expected float32" in rejected(100017, ex.run, [ok.astype(np.float64)])
    assert "expected float32[-1, 64]" in rejected(100017, ex.run, [np.zeros((2, 63), np.float32)])
    assert "gears [1, 2, 4, 8]" in rejected(100017, ex.run, [np.zeros((3, 64), np.float32)])
    assert "expected 1" in rejected(100017, ex.run, [ok, ok])
    assert "needs 80" in rejected(100018, ex.run, [ok], [np.zeros(79, np.uint8)])
    assert "expected 1" in rejected(100018, ex.run, [ok], [])


# ---------------------------------------------------------------------------------------------
# ModelStore over a fake card memory


class FakeMemory:
    """The 4 DeviceMemory methods the store uses: one numpy array per allocation, a capacity."""

    def __init__(self, capacity=1 << 20):
        self.capacity, self.next_ptr = capacity, 1 << 40  # device addresses are not host offsets
        self.live: dict[int, tuple[np.ndarray, object]] = {}  # ptr -> (bytes, owner)

    @property
    def allocated(self):
        return sum(a.nbytes for a, _ in self.live.values())

    def malloc(self, nbytes, owner=None):
        if self.allocated + nbytes > self.capacity:
            raise AclError(207001, f"malloc: {nbytes} bytes do not fit")
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + nbytes + 4096  # never reused
        self.live[ptr] = (np.zeros(nbytes, np.uint8), owner)
        return ptr

    def free(self, ptr, owner=None):
        _, own = self.live.pop(ptr)
        assert own == owner

    def view(self, ptr, nbytes, what=""):
        for start, (array, _) in self.live.items():
            if start <= ptr and ptr + nbytes <= start + array.nbytes:
                return array[ptr - start:ptr - start + nbytes]
        raise AclError(107000, f"{what}: bad access {ptr:#x}+{nbytes}")

    def typed_view(self, ptr, shape, dtype, what=""):
        dtype = np.dtype(dtype)
        return self.view(ptr, math.prod(shape) * dtype.itemsize, what).view(dtype).reshape(shape)


def put(mem, array):
    ptr = mem.malloc(array.nbytes, owner="host")
    mem.view(ptr, array.nbytes)[...] = array.reshape(-1).view(np.uint8)
    return ptr


def test_store_load_describe_execute_unload():
    mem, mlp = FakeMemory(), MLP()
    store = ModelStore(mem)
    model_id, desc = store.load(mlp.data, owner="p1")
    assert mem.allocated == mlp.model.weight_bytes
    assert desc["inputs"] == [{"name": "x", "dtype": "float32", "acl_dtype": 0, "dims": [-1, 64], "size": 8 * 64 * 4}]
    assert desc["outputs"][0]["size"] == 8 * 10 * 4 and desc["batch_sizes"] == [1, 2, 4, 8]

    x = rng.standard_normal((8, 64)).astype(np.float32)
    in_ptr = put(mem, x)
    out_ptr = mem.malloc(desc["outputs"][0]["size"], owner="host")
    for batch in (1, 4, 8):
        dims = store.execute(model_id, [(in_ptr, x.nbytes)], [(out_ptr, 320)], {"batch": batch})
        assert dims == [[batch, 10]]
        got = mem.typed_view(out_ptr, (batch, 10), np.float32)
        np.testing.assert_allclose(got, mlp.forward(x[:batch]), rtol=1e-5, atol=1e-6)

    assert "gears" in rejected(100000, store.execute, model_id, [(in_ptr, x.nbytes)], [(out_ptr, 320)], {"batch": 3})
    assert "choose a batch" in rejected(100017, store.execute, model_id, [(in_ptr, x.nbytes)], [(out_ptr, 320)], None)
    assert "needs 1024" in rejected(100017, store.execute, model_id, [(in_ptr, 1000)], [(out_ptr, 320)], {"batch": 4})
    assert "needs 160" in rejected(100018, store.execute, model_id, [(in_ptr, x.nbytes)], [(out_ptr, 100)], {"batch": 4})
    rejected(100017, store.execute, model_id, [], [(out_ptr, 320)], {"batch": 4})

    store.unload(model_id, owner="p1")
    assert mem.allocated == x.nbytes + 320  # only the host's buffers remain
    rejected(100011, store.unload, model_id, "p1")
    rejected(100011, store.execute, model_id, [(in_ptr, x.nbytes)], [(out_ptr, 320)], {"batch": 1})


def test_store_dynamic_dims_with_string_keys():
    g = GraphBuilder("dyn")
    x = g.input("x", "float32", [-1, -1])
    g.output("y", g.op("Transpose", [x], perm=[1, 0]))
    mem = FakeMemory()
    store = ModelStore(mem)
    model_id, desc = store.load(g.serialize(), owner=1)
    assert desc["inputs"][0]["size"] == 0 and desc["outputs"][0]["dims"] == [-1, -1]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ptr, out = put(mem, x), mem.malloc(24, owner="host")
    assert store.execute(model_id, [(ptr, 24)], [(out, 24)], {"dims": {"0": [2, 3]}}) == [[3, 2]]
    np.testing.assert_array_equal(mem.typed_view(out, (3, 2), np.float32), x.T)
    assert store.execute(model_id, [(ptr, 24)], [(out, 24)], {"dims": [[0, [3, 2]]]}) == [[2, 3]]
    rejected(100017, store.execute, model_id, [(ptr, 24)], [(out, 24)], {"dims": {"0": [2]}})
    rejected(100000, store.execute, model_id, [(ptr, 24)], [(out, 24)], {"dims": {"5": [2, 3]}})
    rejected(100000, store.execute, model_id, [(ptr, 24)], [(out, 24)], {"speed": 11})


def test_store_capacity_owners_and_ids():
    mlp = MLP()
    mem = FakeMemory(capacity=mlp.model.weight_bytes * 2 + 1024)
    store = ModelStore(mem)
    a, _ = store.load(mlp.data, owner="p1")
    b, _ = store.load(mlp.data, owner="p2")
    before = mem.allocated
    assert "do not fit" in rejected(207001, store.load, mlp.data, "p1")
    assert mem.allocated == before  # the failed load gave back what it had taken
    rejected(100011, store.unload, a, "p2")  # another process's model
    store.release_owner("p1")
    assert store.model_ids() == [b]
    c, _ = store.load(mlp.data, owner="p1")
    assert c not in (a, b)  # ids are never reused
    rejected(100012, store.load, mlp.data[:-3], "p1")


# ---------------------------------------------------------------------------------------------
# host API over a fake runtime


class FakeCard:
    """Stands in for the runtime's card handle: call() and submit() go straight to a ModelStore."""

    def __init__(self, memory):
        self.memory, self.store, self.owner = memory, ModelStore(memory), "proc"
        self.submitted = []

    def call(self, name, *args):
        if name == "model_load":
            return list(self.store.load(args[0], self.owner))
        if name == "model_unload":
            return self.store.unload(args[0], self.owner)
        raise AssertionError(name)

    def submit(self, stream_id, name, *args):
        assert name == "model_execute"
        self.submitted.append(stream_id)
        self.store.execute(*args)


class FakeStream:
    def __init__(self, ctx, stream_id):
        self.ctx, self.id = ctx, stream_id


class FakeRuntime:
    """current_card / stream_handle / synchronize_stream, as the host runtime provides them."""

    def __init__(self, card):
        self.card, self.synced = card, []
        self.client = card  # the context's channel

    def current_card(self):
        return self.card

    def stream_handle(self, stream, call):
        return FakeStream(self, 0) if stream is None else stream

    def synchronize_stream(self, stream):
        self.synced.append(stream.id)


@pytest.fixture
def runtime(monkeypatch):
    rt_fake = FakeRuntime(FakeCard(FakeMemory()))
    monkeypatch.setattr(api, "_runtime", lambda: rt_fake)
    return rt_fake


def test_api_scenario(runtime, tmp_path):
    mlp = MLP()
    path = tmp_path / "mlp.om"
    path.write_bytes(mlp.data)
    mem = runtime.card.memory
    model_id = api.load_from_file(str(path))
    desc = api.get_desc(model_id)
    assert (api.get_num_inputs(desc), api.get_num_outputs(desc)) == (1, 1)
    assert api.get_input_size_by_index(desc, 0) == 8 * 64 * 4
    assert api.get_output_size_by_index(desc, 0) == 8 * 10 * 4
    assert api.get_input_dims(desc, 0) == {"name": "x", "dimCount": 2, "dims": [-1, 64]}
    # a gear model's output dims are its largest gear's (CANN's aclmdlGetOutputDims), and so are the current
    # ones before any execution (aclmdlGetCurOutputDims)
    assert api.get_output_dims(desc, 0) == {"name": "probs", "dimCount": 2, "dims": [8, 10]}
    assert api.get_cur_output_dims(desc, 0)["dims"] == [8, 10]
    assert api.get_input_data_type(desc, 0) == 0 and api.get_output_data_type(desc, 0) == 0
    assert api.get_input_name_by_index(desc, 0) == "x" and api.get_output_name_by_index(desc, 0) == "probs"
    assert api.get_input_index_by_name(desc, "x") == 0
    assert "index 1 out of range" in rejected(100000, api.get_input_dims, desc, 1)
    assert "has 1 outputs" in rejected(100000, api.get_output_size_by_index, desc, -1)

    x = rng.standard_normal((4, 64)).astype(np.float32)
    in_ptr, out_ptr = put(mem, np.resize(x, (8, 64))), mem.malloc(320, owner="host")
    ins, outs = api.create_dataset(), api.create_dataset()
    in_buf = api.create_data_buffer(in_ptr, 8 * 64 * 4)
    assert api.add_dataset_buffer(ins, in_buf) is ins
    api.add_dataset_buffer(outs, api.create_data_buffer(out_ptr, 320))
    assert api.get_dataset_num_buffers(ins) == 1 and api.get_dataset_buffer(ins, 0) is in_buf
    assert api.get_data_buffer_addr(in_buf) == in_ptr and api.get_data_buffer_size_v2(in_buf) == 2048
    rejected(100000, api.get_dataset_buffer, ins, 1)

    assert "set_dynamic_batch_size" in rejected(100017, api.execute, model_id, ins, outs)
    rejected(100000, api.set_dynamic_batch_size, model_id, ins, 0, 3)
    rejected(100000, api.set_dynamic_batch_size, model_id, ins, 2, 4)
    api.set_dynamic_batch_size(model_id, ins, 0, 4)
    api.execute(model_id, ins, outs)
    assert runtime.synced == [0] and runtime.card.submitted == [0]
    assert api.get_cur_output_dims(desc, 0)["dims"] == [4, 10]
    np.testing.assert_allclose(mem.typed_view(out_ptr, (4, 10), np.float32), mlp.forward(x), rtol=1e-5, atol=1e-6)

    api.set_dynamic_batch_size(model_id, ins, 0, 2)
    api.execute_async(model_id, ins, outs, FakeStream(runtime, 7))
    assert runtime.card.submitted[-1] == 7 and api.get_cur_output_dims(desc, 0)["dims"] == [2, 10]

    other = FakeRuntime(FakeCard(FakeMemory()))
    assert "stream belongs to" in rejected(107003, api.execute_async, model_id, ins, outs, FakeStream(other, 1))

    short = api.create_dataset()
    api.add_dataset_buffer(short, api.create_data_buffer(out_ptr, 10))
    rejected(100018, api.execute, model_id, ins, short)
    api.destroy_data_buffer(in_buf)
    rejected(100000, api.execute, model_id, ins, outs)
    api.destroy_dataset(ins)
    rejected(100000, api.get_dataset_num_buffers, ins)

    api.unload(model_id)
    rejected(100011, api.get_desc, model_id)
    rejected(100011, api.unload, model_id)
    assert mem.allocated == 2048 + 320
    rejected(100014, api.load_from_file, str(tmp_path / "nope.om"))
    rejected(100012, api.load_from_mem, mlp.data[:-1])


def test_api_dynamic_dims(runtime):
    g = GraphBuilder("dyn")
    g.output("y", g.op("Relu", [g.input("x", "float32", [2, -1])]))
    model_id = api.load_from_mem(g.serialize())
    mem = runtime.card.memory
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    ins, outs = api.create_dataset(), api.create_dataset()
    api.add_dataset_buffer(ins, api.create_data_buffer(put(mem, x), 24))
    out = mem.malloc(24, owner="host")
    api.add_dataset_buffer(outs, api.create_data_buffer(out, 24))
    rejected(100000, api.set_input_dynamic_dims, model_id, ins, 0, [3, 3])
    for bad in ([2, 2.5], [2, float("inf")], [2, float("nan")], [2, "3"], None, 3, [2, 1 << 40]):  # never truncated
        assert "dims" in rejected(100000, api.set_input_dynamic_dims, model_id, ins, 0, bad)
    rejected(AclErrorCode.ACL_ERROR_MODEL_NOT_DYNAMIC, api.set_dynamic_batch_size, model_id, ins, 0, 1)
    api.set_input_dynamic_dims(model_id, ins, 0, {"name": "x", "dimCount": 2, "dims": [2, 3]})
    api.execute(model_id, ins, outs)
    np.testing.assert_array_equal(mem.typed_view(out, (2, 3), np.float32), np.maximum(x, 0))
    assert api.get_cur_output_dims(api.get_desc(model_id), 0)["dims"] == [2, 3]


def test_an_unbounded_models_outputs_that_do_not_depend_on_the_dynamic_dim_have_a_size():
    """A dynamic-shape model (a -1 dim, no gears): an output whose shape is fixed whatever the input ([1, 8]
    here) reports its size, one that follows the input reports 0 (the program allocates per execution)."""
    from rt.card.models import describe
    from rt.mdl import GraphBuilder
    from rt.mdl import format as fmt
    g = GraphBuilder("dyn")
    x = g.input("x", "float32", (-1, 8))
    g.output("s", g.op("ReduceSum", [x], axes=[0], keepdims=1))
    g.output("r", g.op("Relu", [x]))
    outputs = describe(fmt.parse(g.serialize()))["outputs"]
    assert [(o["dims"], o["size"], o["max_dims"]) for o in outputs] == [([1, 8], 32, [1, 8]), ([-1, 8], 0, [-1, 8])]
