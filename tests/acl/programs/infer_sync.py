"""Synchronous classification with a dynamic-batch model, as acllite's model wrapper drives one: load the
model from host memory, probe the virtual ``ascend_mbatch_shape_data`` input, pick a batch gear, execute,
read the current output dims and the probabilities back through malloc_host memory.

    python infer_sync.py resnet50_dyn.om resnet50_dyn.npz static.om
"""
import sys

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 0, 1, 2
ACL_FLOAT, ACL_INT64 = 0, 9
NPY_FLOAT32 = 11


def check(ret, what):
    if ret != ACL_SUCCESS:
        raise RuntimeError(f"{what} failed, ret={ret}: {acl.get_recent_err_msg()}")


def reference(x, w):
    z = x.astype(np.float64).mean(axis=(2, 3)) @ w["w"] + w["b"]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# acllite builds tables of functions at import time, before acl.init
DESC_FUNCS = {"in": acl.mdl.get_input_size_by_index, "out": acl.mdl.get_output_size_by_index}


def load_from_memory(path):
    with open(path, "rb") as f:
        data = f.read()
    size = len(data)
    host, ret = acl.rt.malloc_host(size)
    check(ret, "malloc_host")
    check(acl.rt.memcpy(host, size, acl.util.bytes_to_ptr(data), size, ACL_MEMCPY_HOST_TO_HOST), "memcpy H2H")
    model_id, ret = acl.mdl.load_from_mem(host, size)
    check(ret, "load_from_mem")
    check(acl.rt.free_host(host), "free_host")
    return model_id


def main(model_path, weights_path, static_path):
    weights = np.load(weights_path)
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "set_device")
    context, ret = acl.rt.create_context(0)
    check(ret, "create_context")
    mode, ret = acl.rt.get_run_mode()
    assert (mode, ret) == (1, 0), (mode, ret)      # ACL_HOST: copy inputs host -> device

    work, weight, ret = acl.mdl.query_size(model_path)
    check(ret, "query_size")
    assert weight == weights["w"].nbytes + weights["b"].nbytes, weight
    model_id = load_from_memory(model_path)
    desc = acl.mdl.create_desc()
    check(acl.mdl.get_desc(desc, model_id), "get_desc")

    # the dynamic-batch probe: the virtual input is there, after the real one
    n_inputs = acl.mdl.get_num_inputs(desc)
    index, ret = acl.mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data")
    assert (n_inputs, index, ret) == (2, 1, 0), (n_inputs, index, ret)
    assert acl.mdl.get_input_data_type(desc, index) == ACL_INT64
    gears, ret = acl.mdl.get_dynamic_batch(desc)
    check(ret, "get_dynamic_batch")
    assert gears == {"batchCount": 3, "batch": [1, 2, 4]}, gears
    name_index, ret = acl.mdl.get_input_index_by_name(desc, "actual_input_1")
    assert (name_index, ret) == (0, 0)
    assert acl.mdl.get_input_name_by_index(desc, 0) == "actual_input_1"
    dims, ret = acl.mdl.get_input_dims(desc, 0)
    assert ret == 0 and dims["name"] == "actual_input_1" and dims["dimCount"] == 4 and dims["dims"][0] == -1, dims
    hw = dims["dims"][2]
    assert acl.mdl.get_input_data_type(desc, 0) == ACL_FLOAT

    inputs, outputs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    device = []
    for i in range(n_inputs):                     # every input gets a buffer, the virtual one too
        size = DESC_FUNCS["in"](desc, i)
        ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "malloc")
        device.append(ptr)
        _, ret = acl.mdl.add_dataset_buffer(inputs, acl.create_data_buffer(ptr, size))
        check(ret, "add_dataset_buffer")
    out_size = DESC_FUNCS["out"](desc, 0)
    assert out_size == 4 * 1000 * 4, out_size      # the largest gear
    out_ptr, ret = acl.rt.malloc(out_size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")
    _, ret = acl.mdl.add_dataset_buffer(outputs, acl.create_data_buffer(out_ptr, out_size))
    check(ret, "add_dataset_buffer")
    assert acl.mdl.get_dataset_num_buffers(inputs) == 2

    rng = np.random.default_rng(7)
    host_out, ret = acl.rt.malloc_host(out_size)
    check(ret, "malloc_host")
    for batch in (4, 2, 1):
        x = rng.standard_normal((batch, 3, hw, hw)).astype(np.float32)
        check(acl.rt.memcpy(device[0], DESC_FUNCS["in"](desc, 0), acl.util.numpy_to_ptr(x), x.nbytes,
                            ACL_MEMCPY_HOST_TO_DEVICE), "memcpy input")
        check(acl.mdl.set_dynamic_batch_size(model_id, inputs, index, batch), "set_dynamic_batch_size")
        check(acl.mdl.execute(model_id, inputs, outputs), "execute")
        cur, ret = acl.mdl.get_cur_output_dims(desc, 0)
        check(ret, "get_cur_output_dims")
        assert cur["dims"] == [batch, 1000], cur
        n = batch * 1000 * 4
        check(acl.rt.memcpy(host_out, out_size, out_ptr, n, ACL_MEMCPY_DEVICE_TO_HOST), "memcpy output")
        probs = acl.util.ptr_to_numpy(host_out, (batch, 1000), NPY_FLOAT32)
        np.testing.assert_allclose(probs, reference(x, weights), rtol=1e-4, atol=1e-6)
        print(f"batch {batch}: output dims {cur['dims']}, top-1 {probs.argmax(axis=1).tolist()}")
    bad = acl.mdl.set_dynamic_batch_size(model_id, inputs, index, 3)
    assert bad == 100000, bad                       # 3 is not a gear

    # a static model has no virtual input: acllite's probe must see a non-zero ret
    static_id, ret = acl.mdl.load_from_file(static_path)
    check(ret, "load_from_file")
    static_desc = acl.mdl.create_desc()
    check(acl.mdl.get_desc(static_desc, static_id), "get_desc")
    _, ret = acl.mdl.get_input_index_by_name(static_desc, "ascend_mbatch_shape_data")
    assert ret != 0 and acl.mdl.get_num_inputs(static_desc) == 1, ret
    _, ret = acl.mdl.get_dynamic_batch(static_desc)
    check(acl.mdl.destroy_desc(static_desc), "destroy_desc")
    check(acl.mdl.unload(static_id), "unload")

    for ds in (inputs, outputs):
        for k in range(acl.mdl.get_dataset_num_buffers(ds)):
            check(acl.destroy_data_buffer(acl.mdl.get_dataset_buffer(ds, k)), "destroy_data_buffer")
        check(acl.mdl.destroy_dataset(ds), "destroy_dataset")
    for ptr in device + [out_ptr]:
        check(acl.rt.free(ptr), "free")
    check(acl.rt.free_host(host_out), "free_host")
    check(acl.mdl.destroy_desc(desc), "destroy_desc")
    check(acl.mdl.unload(model_id), "unload")
    check(acl.rt.destroy_context(context), "destroy_context")
    check(acl.rt.reset_device(0), "reset_device")
    check(acl.finalize(), "finalize")
    print("OK")


if __name__ == "__main__":
    main(*sys.argv[1:4])
