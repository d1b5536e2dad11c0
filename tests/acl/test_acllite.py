"""acllite-style programs (tests/acl/programs/acllite_style.py): the resource lifecycle released in every order a
program or its interpreter's exit produces — codes, never a crash or a hang — and CANN's handling of short and
long input buffers. Then the model functions acllite and the samples call beyond load/execute: query sizes,
loading into the program's memory, dynamic image sizes, AIPP."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rt.mdl import GraphBuilder, serialize

pytestmark = pytest.mark.timeout(120)
PROGRAMS = Path(__file__).resolve().parent / "programs"
INVALID, UNINITIALIZE, INVALID_MODEL_ID, GE_PARAM_INVALID = 100000, 100001, 100011, 145000


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    g = GraphBuilder("text")
    x = g.input("input_ids", "int32", [1, 16])
    w = np.linspace(0.5, 2.0, 16).astype(np.float32)
    g.output("scores", g.op("Mul", [g.op("Cast", [x], to=0), g.constant("w", w)]))
    g.save(str(d / "text.om"))
    np.savez(d / "text.npz", w=w)
    return d


def run(text_model, order):
    env = {k: v for k, v in os.environ.items() if k not in ("NPUSIM_BACKEND", "ASCEND_RT_VISIBLE_DEVICES")}
    env["NPUSIM_BACKEND"] = "local"
    done = subprocess.run([sys.executable, str(PROGRAMS / "acllite_style.py"), str(text_model / "text.om"),
                           str(text_model / "text.npz"), order], capture_output=True, text=True, env=env, timeout=100,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert "longer input: 145000" in done.stdout
    assert "Input[0] size: 40 not equal om size: 64" in done.stdout        # acllite's warning; CANN runs it
    return done


def released(done) -> dict:
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("released:"))
    out: dict = {}
    for item in line.split()[1:]:
        name, ret = item.split("=")
        out.setdefault(name, []).append(int(ret))
    return out


def test_explicit_release_in_acllites_order(text_model):
    r = released(run(text_model, "explicit"))
    assert all(ret == 0 for rets in r.values() for ret in rets), r


def test_finalize_before_the_models_own_release(text_model):
    r = released(run(text_model, "resource_first"))
    assert r["finalize"] == [0] and r["unload"] == [UNINITIALIZE] and r["free"][-1] == UNINITIALIZE
    assert r["destroy_desc"] == [0]                                        # host-side handles always release


def test_context_destroyed_before_the_stream_and_the_model(text_model):
    r = released(run(text_model, "context_first"))
    assert r["unload"] == [INVALID_MODEL_ID]                               # it went with the context's device
    assert r["destroy_stream"] != [0] and r["finalize"] == [0]


def test_release_left_to_the_interpreters_exit(text_model):
    done = run(text_model, "at_exit")
    assert "leaving them to the interpreter" in done.stdout


# ---------------------------------------------------------------- sizes, loading with memory, dynamic HW, AIPP
def test_query_size_and_load_with_the_programs_memory(acl0, text_model):
    acl = acl0
    path = str(text_model / "text.om")
    work, weight, ret = acl.mdl.query_size(path)
    assert ret == 0 and weight == 16 * 4 and work >= 16 * 4                # the Cast output is an intermediate
    data = Path(path).read_bytes()
    assert acl.mdl.query_size_from_mem(acl.util.bytes_to_ptr(data), len(data)) == (work, weight, 0)
    work_ptr, ret = acl.rt.malloc(work, 0)                                 # the sample's malloc succeeds
    weight_ptr, _ = acl.rt.malloc(weight, 0)
    model_id, ret = acl.mdl.load_from_file_with_mem(path, work_ptr, work, weight_ptr, weight)
    assert ret == 0 and acl.mdl.unload(model_id) == 0
    model_id, ret = acl.mdl.load_from_mem_with_mem(acl.util.bytes_to_ptr(data), len(data), 0, 0, 0, 0)
    assert ret == 0 and acl.mdl.unload(model_id) == 0                      # 0: CANN manages the memory itself
    assert acl.mdl.load_from_file_with_mem(path, work_ptr, work - 1, weight_ptr, weight)[1] == INVALID
    assert "less than the" in acl.get_recent_err_msg()
    host = np.zeros(work, np.uint8)
    assert acl.mdl.load_from_file_with_mem(path, host.ctypes.data, work, weight_ptr, weight)[1] == INVALID
    assert acl.rt.free(work_ptr) == 0 and acl.rt.free(weight_ptr) == 0


def _dyn_hw_model(path, image_sizes=()):
    g = GraphBuilder("dyn_hw")
    x = g.input("image", "float32", [1, 3, -1, -1])
    g.output("mean", g.op("ReduceMean", [x], axes=[2, 3], keepdims=0))
    model = g.build()
    if image_sizes:                                        # what atc --dynamic_image_size="6,10;8,8" writes
        model = dataclasses.replace(model, image_sizes=image_sizes)
    Path(path).write_bytes(serialize(model))


def test_dynamic_image_size_model_the_way_the_samples_drive_it(acl0, tmp_path):
    """Gears from the model, the virtual input found by name, buffers sized by the desc (the largest gear), a
    gear chosen with set_dynamic_hw_size on the virtual input's index; the result checked with numpy."""
    acl = acl0
    _dyn_hw_model(tmp_path / "dyn.om", image_sizes=((6, 10), (8, 8)))
    model_id, ret = acl.mdl.load_from_file(str(tmp_path / "dyn.om"))
    assert ret == 0
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    assert acl.mdl.get_dynamic_hw(desc, -1) == ({"hwCount": 2, "hw": [[6, 10], [8, 8]]}, 0)
    assert acl.mdl.get_num_inputs(desc) == 2
    index, ret = acl.mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data")
    assert (index, ret) == (1, 0)
    assert acl.mdl.get_input_size_by_index(desc, 0) == 3 * 8 * 8 * 4           # the largest gear's bytes
    assert acl.mdl.get_output_size_by_index(desc, 0) == 3 * 4
    ins, outs, ptrs = acl.mdl.create_dataset(), acl.mdl.create_dataset(), []
    for size in (acl.mdl.get_input_size_by_index(desc, 0), acl.mdl.get_input_size_by_index(desc, index)):
        ptr, ret = acl.rt.malloc(size, 0)                                     # the malloc of the reported size
        assert ret == 0
        ptrs.append(ptr)
        acl.mdl.add_dataset_buffer(ins, acl.create_data_buffer(ptr, size))
    out_ptr, _ = acl.rt.malloc(12, 0)
    acl.mdl.add_dataset_buffer(outs, acl.create_data_buffer(out_ptr, 12))
    img = np.random.default_rng(0).standard_normal((1, 3, 6, 10)).astype(np.float32)
    assert acl.rt.memcpy(ptrs[0], img.nbytes, img.ctypes.data, img.nbytes, 1) == 0
    assert acl.mdl.set_dynamic_hw_size(model_id, ins, index, 6, 10) == 0
    assert acl.mdl.execute(model_id, ins, outs) == 0
    out = np.zeros(3, np.float32)
    assert acl.rt.memcpy(out.ctypes.data, 12, out_ptr, 12, 2) == 0
    np.testing.assert_allclose(out, img.mean(axis=(2, 3))[0], rtol=1e-5)
    assert acl.mdl.set_dynamic_hw_size(model_id, ins, index, 7, 7) == 145013    # not a gear
    assert acl.mdl.set_dynamic_hw_size(model_id, ins, index, 0, 10) == INVALID
    assert acl.mdl.set_input_dynamic_dims(model_id, ins, 0, [1, 3, 7, 7]) == INVALID      # the real input's dims
    assert "image size gears [[6, 10], [8, 8]]" in acl.get_recent_err_msg()
    assert acl.mdl.destroy_desc(desc) == 0 and acl.mdl.unload(model_id) == 0
    for p in ptrs + [out_ptr]:
        assert acl.rt.free(p) == 0


def test_free_image_size_and_static_models(acl0, tmp_path):
    acl = acl0
    _dyn_hw_model(tmp_path / "free.om")                                       # -1 H/W without gears: any size
    model_id, _ = acl.mdl.load_from_file(str(tmp_path / "free.om"))
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    assert acl.mdl.get_dynamic_hw(desc, -1) == ({"hwCount": 0, "hw": []}, 0)
    assert acl.mdl.get_op_attr(desc, "mean", "_datadump_original_op_names") == ""     # npusim fuses nothing
    assert acl.mdl.get_op_attr(desc, 3, "_datadump_original_op_names") is None
    assert acl.mdl.get_input_dims_v2(desc, 0) == ({"name": "image", "dimCount": 4, "dims": [1, 3, -1, -1]}, 0)
    img = np.random.default_rng(1).standard_normal((1, 3, 5, 7)).astype(np.float32)
    dev, _ = acl.rt.malloc(img.nbytes, 0)
    assert acl.rt.memcpy(dev, img.nbytes, img.ctypes.data, img.nbytes, 1) == 0
    out_dev, _ = acl.rt.malloc(12, 0)
    ins, outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    acl.mdl.add_dataset_buffer(ins, acl.create_data_buffer(dev, img.nbytes))
    acl.mdl.add_dataset_buffer(outs, acl.create_data_buffer(out_dev, 12))
    assert acl.mdl.set_dynamic_hw_size(model_id, ins, 0, 5, 7) == 0
    assert acl.mdl.execute(model_id, ins, outs) == 0
    out = np.zeros(3, np.float32)
    assert acl.rt.memcpy(out.ctypes.data, 12, out_dev, 12, 2) == 0
    np.testing.assert_allclose(out, img.mean(axis=(2, 3))[0], rtol=1e-5)
    # a static model has no dynamic height and width, and no virtual input for the acllite probe
    g = GraphBuilder("static")
    g.output("y", g.op("Relu", [g.input("x", "float32", [1, 3, 4, 4])]))
    g.save(str(tmp_path / "static.om"))
    static_id, _ = acl.mdl.load_from_file(str(tmp_path / "static.om"))
    assert acl.mdl.set_dynamic_hw_size(static_id, ins, 0, 6, 10) == 145013
    sdesc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(sdesc, static_id) == 0
    assert acl.mdl.get_input_index_by_name(sdesc, "ascend_mbatch_shape_data")[1] == INVALID
    assert "cannot find tensor name[ascend_mbatch_shape_data]" in acl.get_recent_err_msg()
    assert acl.mdl.get_input_dynamic_gear_count(sdesc, -1) == (0, 0)
    for h in (desc, sdesc):
        assert acl.mdl.destroy_desc(h) == 0
    assert acl.mdl.unload(model_id) == 0 and acl.mdl.unload(static_id) == 0


def test_dynamic_dims_gears(acl0, tmp_path):
    """atc --dynamic_dims: the gears, and set_input_dynamic_dims on the virtual input with every input's shape."""
    acl = acl0
    g = GraphBuilder("dims")
    a, b = g.input("a", "float32", [-1, 4]), g.input("b", "float32", [-1, 4])
    g.output("y", g.op("Add", [a, b]))
    model = dataclasses.replace(g.build(), dims=((1, 1), (2, 2)))
    (tmp_path / "dims.om").write_bytes(serialize(model))
    model_id, _ = acl.mdl.load_from_file(str(tmp_path / "dims.om"))
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    assert acl.mdl.get_input_dynamic_gear_count(desc, -1) == (2, 0)
    gears, ret = acl.mdl.get_input_dynamic_dims(desc, -1, 2)
    assert ret == 0 and [g["dims"] for g in gears] == [[1, 4, 1, 4], [2, 4, 2, 4]]
    assert acl.mdl.get_input_dynamic_dims(desc, -1, 5)[1] == INVALID
    index, _ = acl.mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data")
    assert index == 2 and acl.mdl.get_input_size_by_index(desc, 0) == 2 * 4 * 4
    x, y = np.ones((2, 4), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
    ins, outs, ptrs = acl.mdl.create_dataset(), acl.mdl.create_dataset(), []
    for arr in (x, y, np.zeros(2, np.int64)):
        p, _ = acl.rt.malloc(arr.nbytes, 0)
        assert acl.rt.memcpy(p, arr.nbytes, arr.ctypes.data, arr.nbytes, 1) == 0
        ptrs.append(p)
        acl.mdl.add_dataset_buffer(ins, acl.create_data_buffer(p, arr.nbytes))
    out_p, _ = acl.rt.malloc(32, 0)
    acl.mdl.add_dataset_buffer(outs, acl.create_data_buffer(out_p, 32))
    dims = {"name": "", "dimCount": 4, "dims": [2, 4, 2, 4]}
    assert acl.mdl.set_input_dynamic_dims(model_id, ins, index, dims) == 0
    assert acl.mdl.execute(model_id, ins, outs) == 0
    out = np.zeros((2, 4), np.float32)
    assert acl.rt.memcpy(out.ctypes.data, 32, out_p, 32, 2) == 0
    np.testing.assert_array_equal(out, x + y)      # one correctly rounded fp32 add: the same bits on every CPU
    assert acl.mdl.set_input_dynamic_dims(model_id, ins, index, [3, 4, 3, 4]) == INVALID     # not a gear
    assert acl.mdl.set_input_dynamic_dims(model_id, ins, 1, [3, 4]) == INVALID                # a real input too
    assert "dims gears [[1, 1], [2, 2]]" in acl.get_recent_err_msg()
    assert acl.mdl.destroy_desc(desc) == 0 and acl.mdl.unload(model_id) == 0


def test_aipp_sets_work_and_models_without_aipp_refuse_them(acl0, tmp_path):
    acl = acl0
    g = GraphBuilder("plain")
    g.output("y", g.op("Relu", [g.input("x", "float32", [1, 3, 8, 8])]))
    g.save(str(tmp_path / "plain.om"))
    model_id, _ = acl.mdl.load_from_file(str(tmp_path / "plain.om"))
    aipp = acl.mdl.create_aipp(1)
    assert aipp != 0
    assert acl.mdl.set_aipp_input_format(aipp, 1) == 0                     # ACL_YUV420SP_U8
    assert acl.mdl.set_aipp_src_image_size(aipp, 8, 8) == 0
    assert acl.mdl.set_aipp_crop_params(aipp, 1, 0, 0, 8, 8, 0) == 0
    assert acl.mdl.set_aipp_csc_params(aipp, 1, *range(9), 0, 0, 0, 0, 0, 0) == 0
    assert acl.mdl.set_aipp_crop_params(aipp, "on", 0, 0, 8, 8, 0) == INVALID
    assert acl.mdl.get_aipp_type(model_id, 0) == (0, 0xFFFFFFFF, 0)        # ACL_DATA_WITHOUT_AIPP
    assert acl.mdl.get_aipp_type(model_id, 5)[2] == INVALID
    ds = acl.mdl.create_dataset()
    assert acl.mdl.set_input_aipp(model_id, ds, 0, aipp) == INVALID
    assert "not a dynamic aipp model" in acl.get_recent_err_msg()
    assert acl.mdl.set_aipp_by_input_index(model_id, ds, 0, aipp) == 500001
    assert acl.mdl.get_first_aipp_info(model_id, 0) == ({}, 145015)
    assert acl.mdl.destroy_aipp(aipp) == 0 and acl.mdl.destroy_aipp(aipp) == INVALID
    assert acl.mdl.create_aipp(0) == 0
    assert acl.mdl.destroy_dataset(ds) == 0 and acl.mdl.unload(model_id) == 0
