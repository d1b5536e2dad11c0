"""Offline-model inference, CANN style (scenario 4: load a model, execute it sync and async).

    python examples/mdl_infer.py

Builds a 64 -> 128 -> 10 MLP classifier with GraphBuilder (Gemm, Relu, Softmax), saves it as an
.om file with dynamic batch gears, then runs it on card 0 through the pyACL-named API and checks
the result against a numpy forward pass.
"""

import os
import tempfile

import numpy as np

import rt
from rt import mdl

GEARS = [1, 2, 4, 8]


def build(path: str, rng) -> dict:
    """Write the model file; return its weights for the numpy reference."""
    weights = {
        "w1": (rng.standard_normal((64, 128)) * 0.1).astype(np.float32),
        "b1": rng.standard_normal(128).astype(np.float32) * 0.1,
        "w2": (rng.standard_normal((128, 10)) * 0.1).astype(np.float32),
        "b2": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    g = mdl.GraphBuilder("mlp_classifier")
    x = g.input("features", "float32", [-1, 64])
    w = {name: g.constant(name, value) for name, value in weights.items()}
    hidden = g.op("Relu", [g.op("Gemm", [x, w["w1"], w["b1"]])])
    logits = g.op("Gemm", [hidden, w["w2"], w["b2"]])
    g.output("probs", g.op("Softmax", [logits], axis=-1))
    g.set_dynamic_batch(GEARS)
    g.save(path)
    return weights


def reference(x: np.ndarray, w: dict) -> np.ndarray:
    h = np.maximum(x @ w["w1"] + w["b1"], 0)
    z = h @ w["w2"] + w["b2"]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main() -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="npusim-mdl-") as tmp:
        path = os.path.join(tmp, "mlp.om")
        weights = build(path, rng)
        print(f"saved {path} ({os.path.getsize(path)} bytes)")
        run(path, weights, rng)


def run(path: str, weights: dict, rng) -> None:
    """CANN scenario 4 on card 0."""
    rt.init()
    rt.set_device(0)
    model_id = mdl.load_from_file(path)
    desc = mdl.get_desc(model_id)
    n_in, n_out = mdl.get_num_inputs(desc), mdl.get_num_outputs(desc)
    print(f"model {model_id}: {n_in} input(s), {n_out} output(s)")
    for i in range(n_in):
        print(f"  input {i} {mdl.get_input_name_by_index(desc, i)}: dims {mdl.get_input_dims(desc, i)['dims']}, "
              f"dtype {mdl.get_input_data_type(desc, i)}, {mdl.get_input_size_by_index(desc, i)} bytes")
    for i in range(n_out):
        print(f"  output {i} {mdl.get_output_name_by_index(desc, i)}: dims {mdl.get_output_dims(desc, i)['dims']}, "
              f"{mdl.get_output_size_by_index(desc, i)} bytes")

    # Device buffers of the size the desc asks for (the largest batch gear).
    in_size, out_size = mdl.get_input_size_by_index(desc, 0), mdl.get_output_size_by_index(desc, 0)
    in_ptr, out_ptr = rt.malloc(in_size), rt.malloc(out_size)
    inputs, outputs = mdl.create_dataset(), mdl.create_dataset()
    in_buf, out_buf = rt.create_data_buffer(in_ptr, in_size), rt.create_data_buffer(out_ptr, out_size)
    mdl.add_dataset_buffer(inputs, in_buf)
    mdl.add_dataset_buffer(outputs, out_buf)

    # Synchronous execution at batch 8.
    x = rng.standard_normal((8, 64)).astype(np.float32)
    rt.memcpy(in_ptr, in_size, x, x.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
    mdl.set_dynamic_batch_size(model_id, inputs, 0, 8)
    mdl.execute(model_id, inputs, outputs)
    dims = mdl.get_cur_output_dims(desc, 0)["dims"]
    probs = np.empty(dims, np.float32)
    rt.memcpy(probs, probs.nbytes, out_ptr, probs.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    np.testing.assert_allclose(probs, reference(x, weights), rtol=1e-5, atol=1e-6)
    print(f"execute (batch 8): output dims {dims}, predictions {probs.argmax(axis=1).tolist()}")

    # Asynchronous execution at batch 2 on a stream of our own.
    stream = rt.create_stream()
    x2 = rng.standard_normal((2, 64)).astype(np.float32)
    rt.memcpy(in_ptr, in_size, x2, x2.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
    mdl.set_dynamic_batch_size(model_id, inputs, 0, 2)
    mdl.execute_async(model_id, inputs, outputs, stream)
    rt.synchronize_stream(stream)
    dims = mdl.get_cur_output_dims(desc, 0)["dims"]
    probs2 = np.empty(dims, np.float32)
    rt.memcpy(probs2, probs2.nbytes, out_ptr, probs2.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    np.testing.assert_allclose(probs2, reference(x2, weights), rtol=1e-5, atol=1e-6)
    print(f"execute_async (batch 2): output dims {dims}, predictions {probs2.argmax(axis=1).tolist()}")

    # Teardown in CANN's order.
    rt.destroy_stream(stream)
    mdl.destroy_data_buffer(in_buf)
    mdl.destroy_data_buffer(out_buf)
    mdl.destroy_dataset(inputs)
    mdl.destroy_dataset(outputs)
    mdl.unload(model_id)
    rt.free(in_ptr)
    rt.free(out_ptr)
    rt.reset_device(0)
    rt.finalize()
    print("ok: both executions match the numpy forward pass")


if __name__ == "__main__":
    main()
