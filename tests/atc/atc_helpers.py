"""Helpers of the atc tests: skip markers, and running a converted model on a card through rt.mdl (the pyACL
sequence) and with onnxruntime, the oracle."""

from __future__ import annotations

import functools

import numpy as np
import pytest


def require_extras():
    """Skip the calling test module unless the atc-test extra (onnx, onnxruntime) and torch are installed."""
    pytest.importorskip("onnx", reason="atc tests need the atc-test extra (onnx)")
    pytest.importorskip("onnxruntime", reason="atc tests need the atc-test extra (onnxruntime, the oracle)")
    pytest.importorskip("torch", reason="atc tests export their models with torch")


def needs_kernels(*ops):
    """The card kernels a test's model needs: a missing one fails the test up front, naming the op (the converter
    would refuse the model, correctly, but with a less direct message)."""
    def mark(test):
        @functools.wraps(test)
        def checked(*args, **kwargs):
            from rt.kernels.registry import REGISTRY
            missing = [op for op in ops if op not in REGISTRY]
            assert not missing, f"card kernels not registered: {missing}"
            return test(*args, **kwargs)
        return checked
    return mark


def on_card(rt, path, feeds, gear=None, dynamic_dims=False):
    """Outputs of the model at ``path`` for ``feeds`` (arrays in input order), on the current device."""
    from rt import mdl
    model_id = mdl.load_from_file(str(path))
    try:
        desc = mdl.get_desc(model_id)
        ds_in, ds_out = mdl.create_dataset(), mdl.create_dataset()
        tensors = [rt.Tensor.from_numpy(np.ascontiguousarray(x)) for x in feeds]
        for i, t in enumerate(tensors):
            mdl.add_dataset_buffer(ds_in, mdl.create_data_buffer(t.ptr, t.nbytes))
            if dynamic_dims:
                mdl.set_input_dynamic_dims(model_id, ds_in, i, list(feeds[i].shape))
        if gear is not None:
            mdl.set_dynamic_batch_size(model_id, ds_in, 0, gear)
        outs = []
        for i in range(mdl.get_num_outputs(desc)):
            size = mdl.get_output_size_by_index(desc, i) or (64 << 20)   # dynamic dims: size 0, allocate enough
            t = rt.malloc(size)
            outs.append((t, size))
            mdl.add_dataset_buffer(ds_out, mdl.create_data_buffer(t, size))
        mdl.execute(model_id, ds_in, ds_out)
        results = []
        for i, (ptr, size) in enumerate(outs):
            dims = mdl.get_cur_output_dims(desc, i)["dims"]
            dtype = np.dtype(rt.dtypes.np_dtype(mdl.get_output_data_type(desc, i)))
            host = np.empty(dims, dtype)
            rt.memcpy(host, host.nbytes, ptr, host.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
            results.append(host)
            rt.free(ptr)
        return results
    finally:
        mdl.unload(model_id)


def onnxruntime(path, feeds):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), feeds)})
