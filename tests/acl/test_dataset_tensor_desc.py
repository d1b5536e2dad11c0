"""A dynamic-shape model (-1 dims, no gears) driven as CANN's samples drive one: the input size reported is 0,
the program allocates for its data, gives the real dims with acl.mdl.set_dataset_tensor_desc, executes, and
reads the output's dims with get_dataset_tensor_desc."""

import numpy as np

from rt.mdl import GraphBuilder

ACL_FLOAT, ACL_FORMAT_ND = 0, 2
INVALID, INPUT_NOT_MATCH = 100000, 100017


def _relu_model(path):
    g = GraphBuilder("dyn_relu")
    g.output("y", g.op("Relu", [g.input("x", "float32", [-1, 4])]))
    g.save(str(path))


def _dataset(acl, nbytes):
    ds = acl.mdl.create_dataset()
    ptr, ret = acl.rt.malloc(nbytes, 0)
    assert ret == 0
    buf = acl.create_data_buffer(ptr, nbytes)
    assert acl.mdl.add_dataset_buffer(ds, buf)[1] == 0
    return ds, ptr, buf


def test_dynamic_shape_model_through_dataset_tensor_descs(acl0, tmp_path):
    acl = acl0
    _relu_model(tmp_path / "dyn.om")
    model_id, ret = acl.mdl.load_from_file(str(tmp_path / "dyn.om"))
    assert ret == 0
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    assert acl.mdl.get_input_size_by_index(desc, 0) == 0             # -1 dims: CANN reports 0
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    ins, in_ptr, _ = _dataset(acl, x.nbytes)
    outs, out_ptr, _ = _dataset(acl, x.nbytes)
    assert acl.rt.memcpy(in_ptr, x.nbytes, x.ctypes.data, x.nbytes, 1) == 0

    real = acl.create_tensor_desc(ACL_FLOAT, [3, 4], ACL_FORMAT_ND)
    assert acl.mdl.set_dataset_tensor_desc(ins, real, 0) == (ins, 0)
    assert acl.mdl.execute(model_id, ins, outs) == 0
    out_desc = acl.mdl.get_dataset_tensor_desc(outs, 0)
    assert out_desc != 0 and acl.get_tensor_desc_num_dims(out_desc) == 2
    assert [acl.get_tensor_desc_dim(out_desc, i) for i in range(2)] == [3, 4]
    assert acl.get_tensor_desc_size(out_desc) == x.nbytes
    got = np.zeros_like(x)
    assert acl.rt.memcpy(got.ctypes.data, got.nbytes, out_ptr, got.nbytes, 2) == 0
    np.testing.assert_array_equal(got, np.maximum(x, 0))      # Relu computes nothing inexact: exact anywhere
    assert acl.mdl.get_dataset_tensor_desc(ins, 0) != 0                # the input's, as set

    # dims that do not fit the buffer or the model, or are not real dims, and bad indices
    too_big = acl.create_tensor_desc(ACL_FLOAT, [5, 4], ACL_FORMAT_ND)
    assert acl.mdl.set_dataset_tensor_desc(ins, too_big, 0)[1] == 0
    assert acl.mdl.execute(model_id, ins, outs) == INPUT_NOT_MATCH
    wrong = acl.create_tensor_desc(ACL_FLOAT, [2, 6], ACL_FORMAT_ND)
    assert acl.mdl.set_dataset_tensor_desc(ins, wrong, 0)[1] == 0
    assert acl.mdl.execute(model_id, ins, outs) == INPUT_NOT_MATCH
    unknown = acl.create_tensor_desc(ACL_FLOAT, [-1, 4], ACL_FORMAT_ND)
    assert acl.mdl.set_dataset_tensor_desc(ins, unknown, 0) == (0, INVALID)
    assert acl.mdl.set_dataset_tensor_desc(ins, real, 1) == (0, INVALID)
    assert acl.mdl.set_dataset_tensor_desc(ins, 12345, 0) == (0, INVALID)
    assert acl.mdl.get_dataset_tensor_desc(outs, 1) == 0 and acl.mdl.get_dataset_tensor_desc(None, 0) == 0

    # the dataset owns its descs: they go with it; the program's own descs stay the program's
    assert acl.mdl.destroy_dataset(outs) == 0
    assert acl.get_tensor_desc_num_dims(out_desc) == 0 and "not a tensor desc" in acl.get_recent_err_msg()
    for d in (real, too_big, wrong, unknown):
        assert acl.get_tensor_desc_num_dims(d) == 2
        acl.destroy_tensor_desc(d)
    assert acl.mdl.destroy_dataset(ins) == 0
    assert acl.rt.free(in_ptr) == 0 and acl.rt.free(out_ptr) == 0
    assert acl.mdl.destroy_desc(desc) == 0 and acl.mdl.unload(model_id) == 0


def test_dynamic_shape_output_allocated_by_the_system(acl0, tmp_path):
    """CANN's first way for an output whose size the desc gives as 0: ``create_data_buffer(0, 0)``; the execution
    allocates what it writes, the program reads it through the buffer and frees it with acl.rt.free."""
    acl = acl0
    _relu_model(tmp_path / "dyn.om")
    model_id, ret = acl.mdl.load_from_file(str(tmp_path / "dyn.om"))
    desc = acl.mdl.create_desc()
    assert ret == 0 and acl.mdl.get_desc(desc, model_id) == 0
    assert acl.mdl.get_output_size_by_index(desc, 0) == 0
    for rows in (3, 5):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        ins, in_ptr, _ = _dataset(acl, x.nbytes)
        assert acl.rt.memcpy(in_ptr, x.nbytes, x.ctypes.data, x.nbytes, 1) == 0
        real = acl.create_tensor_desc(ACL_FLOAT, [rows, 4], ACL_FORMAT_ND)
        assert acl.mdl.set_dataset_tensor_desc(ins, real, 0)[1] == 0
        outs = acl.mdl.create_dataset()
        buf = acl.create_data_buffer(0, 0)
        assert acl.mdl.add_dataset_buffer(outs, buf)[1] == 0
        assert acl.mdl.execute(model_id, ins, outs) == 0
        addr, size = acl.get_data_buffer_addr(buf), acl.get_data_buffer_size_v2(buf)
        assert addr != 0 and size == x.nbytes
        got = np.zeros_like(x)
        assert acl.rt.memcpy(got.ctypes.data, size, addr, size, 2) == 0
        np.testing.assert_array_equal(got, np.maximum(x, 0))
        assert acl.rt.free(addr) == 0 and acl.update_data_buffer(buf, 0, 0) == 0
        assert acl.rt.free(in_ptr) == 0
        for ds in (ins, outs):
            for i in range(acl.mdl.get_dataset_num_buffers(ds)):
                assert acl.destroy_data_buffer(acl.mdl.get_dataset_buffer(ds, i)) == 0
            assert acl.mdl.destroy_dataset(ds) == 0
        acl.destroy_tensor_desc(real)
    assert acl.mdl.unload(model_id) == 0
