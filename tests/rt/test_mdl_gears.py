"""Image-size and dims gears (``atc --dynamic_image_size`` / ``--dynamic_dims``): a model with gears runs only
at one of them, as CANN refuses a size the model was not compiled for (100000) — on the host when the dims are
set, and on the card whatever the host sends."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from rt.card.models import ModelStore
from rt.errors import AclError
from rt.mdl import api
from rt.mdl import format as fmt
from rt.mdl.builder import GraphBuilder
from rt.mdl.shapes import gear_shapes, resolve_input_shapes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_mdl_exec import FakeCard, FakeMemory, FakeRuntime, put, rejected


@pytest.fixture
def host_api(monkeypatch):
    """rt.mdl's host API over one fake card (no Ray)."""
    fake = FakeRuntime(FakeCard(FakeMemory()))
    monkeypatch.setattr(api, "_runtime", lambda: fake)
    return api


def hw_model(sizes=((6, 10), (8, 8))):
    g = GraphBuilder("dyn_hw")
    x = g.input("image", "float32", [1, 3, -1, -1])
    g.output("mean", g.op("ReduceMean", [x], axes=[2, 3], keepdims=0))
    return dataclasses.replace(g.build(), image_sizes=sizes)


def dims_model():
    g = GraphBuilder("dims")
    a, b = g.input("a", "float32", [-1, 4]), g.input("b", "float32", [-1, 4])
    g.output("y", g.op("Add", [a, b]))
    return dataclasses.replace(g.build(), dims=((1, 1), (2, 2)))


def test_gear_shapes_fill_the_free_dims_in_input_order():
    assert gear_shapes(hw_model(), (8, 8)) == [(1, 3, 8, 8)]
    assert gear_shapes(dims_model(), (2, 2)) == [(2, 4), (2, 4)]


def test_resolve_accepts_the_gears_and_refuses_other_sizes():
    model = hw_model()
    assert resolve_input_shapes(model, dims={0: (1, 3, 6, 10)}) == [(1, 3, 6, 10)]
    with pytest.raises(AclError, match=r"\[1, 3, 7, 7\].*image size gears \[\[6, 10\], \[8, 8\]\]") as e:
        resolve_input_shapes(model, dims={0: (1, 3, 7, 7)})
    assert e.value.code == 100000
    dims = dims_model()
    assert resolve_input_shapes(dims, dims={0: (2, 4), 1: (2, 4)}) == [(2, 4), (2, 4)]
    # each input is at some gear, the pair at none
    assert "dims gears [[1, 1], [2, 2]]" in rejected(100000, resolve_input_shapes, dims, None, {0: (1, 4), 1: (2, 4)})


def test_the_card_refuses_a_size_that_is_not_a_gear():
    mem = FakeMemory()
    store = ModelStore(mem)
    model_id, desc = store.load(fmt.serialize(hw_model()), owner=1)
    assert desc["inputs"][0]["size"] == 3 * 8 * 8 * 4          # the largest gear's bytes, as CANN reports
    img = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ptr, out = put(mem, img), mem.malloc(12, owner="host")
    assert store.execute(model_id, [(ptr, img.nbytes)], [(out, 12)], {"dims": {"0": [1, 3, 8, 8]}}) == [[1, 3]]
    np.testing.assert_allclose(mem.typed_view(out, (1, 3), np.float32), img.mean(axis=(2, 3)), rtol=1e-5)
    msg = rejected(100000, store.execute, model_id, [(ptr, img.nbytes)], [(out, 12)], {"dims": {"0": [1, 3, 4, 16]}})
    assert "[1, 3, 4, 16]" in msg and "gears" in msg


def test_host_api_refuses_non_gear_dims_when_they_are_set(host_api):
    model_id = api.load_from_mem(fmt.serialize(dims_model()))
    ins = api.create_dataset()
    api.set_input_dynamic_dims(model_id, ins, 0, [2, 4])
    msg = rejected(100000, api.set_input_dynamic_dims, model_id, ins, 1, [3, 4])
    assert msg.startswith("[100000] set_input_dynamic_dims:") and "[3, 4]" in msg
    api.unload(model_id)


def test_every_gear_must_fit_the_card():
    """The card checks each gear at load, not only the declared shapes (a -1 dim counts as 1 there)."""
    store = ModelStore(FakeMemory(capacity=1 << 20))
    store.load(fmt.serialize(hw_model(((8, 8), (64, 64)))), owner=1)
    msg = rejected(100013, store.load, fmt.serialize(hw_model(((8, 8), (600, 600)))), 1)
    assert "[1, 3, 600, 600]" in msg
