"""End to end: a torch model -> ONNX -> ``atc`` -> the pyACL classification flow on one card -> the same model
batch-sharded over 8 cards.

    python examples/atc_resnet.py                    # ResNet-18 at 224x224, in a temporary directory
    python examples/atc_resnet.py --hw 64 --keep out  # smaller images (quicker on a laptop), files kept in out/

1. ``torch.onnx.export`` of ResNet-18 (``examples/atc_models.py``, torchvision's layout, random weights);
2. ``atc --model=resnet18.onnx --framework=5 --output=resnet18 --soc_version=Ascend910B1
   --input_shape="input:1,3,H,W"`` (the console script, as a user types it);
3. the classification flow of CANN's pyACL samples, unchanged: ``acl.init``, ``set_device``, ``create_context``,
   ``load_from_file``, the model desc, device buffers of ``get_input_size_by_index`` bytes, datasets,
   ``execute``, output copied back, top-5, teardown in CANN's order;
4. the same static batch-1 ``resnet18.om`` loaded with ``hccl.load_sharded(path, comms, "batch")`` over 8
   cards: a global batch of 8 images, one per card, outputs all-gathered; equal to the single-card results (and to onnxruntime when installed).

Needs torch and onnx (``pip install "npusim[atc]" torch``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2
CARDS = 8


def check(ret, what):
    if ret != ACL_SUCCESS:
        import acl
        raise RuntimeError(f"{what} failed, ret={ret}: {acl.get_recent_err_msg()}")


def export_resnet18(path: str, hw: int) -> None:
    import atc_models
    import torch
    torch.manual_seed(0)
    model = atc_models.randomize_bn(atc_models.ResNet18())
    atc_models.export(model, (torch.randn(1, 3, hw, hw),), path, ["input"], ["output"])


def run_atc(onnx_path: str, output: str, hw: int) -> None:
    """The atc console script if installed, else the same entry point through python -m."""
    exe = shutil.which("atc")
    cmd = [exe] if exe else [sys.executable, "-m", "launcher.tools.atc"]
    cmd += [f"--model={onnx_path}", "--framework=5", f"--output={output}", "--soc_version=Ascend910B1",
            f"--input_shape=input:1,3,{hw},{hw}"]
    print("$ atc", " ".join(cmd[-5:]))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    print(done.stdout.rstrip(), f"({time.perf_counter() - t0:.1f} s)")
    if done.returncode != 0:
        raise SystemExit(f"atc exited {done.returncode}")


class Classifier:
    """The pyACL classification flow of CANN's samples (synchronous execute; a dynamic-batch model's
    ``ascend_mbatch_shape_data`` input is set as acllite does, a static model has none)."""

    def __init__(self, model_path: str, device_id: int = 0):
        import acl
        self.acl, self.device_id = acl, device_id
        check(acl.init(), "acl.init")
        check(acl.rt.set_device(device_id), "set_device")
        self.context, ret = acl.rt.create_context(device_id)
        check(ret, "create_context")
        self.model_id, ret = acl.mdl.load_from_file(model_path)
        check(ret, "load_from_file")
        self.desc = acl.mdl.create_desc()
        check(acl.mdl.get_desc(self.desc, self.model_id), "get_desc")
        # every input gets a buffer, the virtual ascend_mbatch_shape_data input of a dynamic-batch model too
        self.mbatch, ret = acl.mdl.get_input_index_by_name(self.desc, "ascend_mbatch_shape_data")
        if ret != ACL_SUCCESS:
            self.mbatch = None
        self.in_sizes = [acl.mdl.get_input_size_by_index(self.desc, i) for i in range(acl.mdl.get_num_inputs(self.desc))]
        self.out_size = acl.mdl.get_output_size_by_index(self.desc, 0)
        self.inputs, self.in_ptrs, self.in_bufs = self._dataset(self.in_sizes)
        self.outputs, self.out_ptrs, self.out_bufs = self._dataset([self.out_size])

    def _dataset(self, sizes):
        acl = self.acl
        dataset, ptrs, bufs = acl.mdl.create_dataset(), [], []
        for size in sizes:
            ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
            check(ret, "malloc")
            buf = acl.create_data_buffer(ptr, size)
            _, ret = acl.mdl.add_dataset_buffer(dataset, buf)
            check(ret, "add_dataset_buffer")
            ptrs.append(ptr)
            bufs.append(buf)
        return dataset, ptrs, bufs

    def logits(self, image: np.ndarray) -> np.ndarray:
        acl = self.acl
        data = np.ascontiguousarray(image, dtype=np.float32)
        check(acl.rt.memcpy(self.in_ptrs[0], self.in_sizes[0], acl.util.numpy_to_ptr(data), data.nbytes,
                            ACL_MEMCPY_HOST_TO_DEVICE), "memcpy H2D")
        if self.mbatch is not None:
            check(acl.mdl.set_dynamic_batch_size(self.model_id, self.inputs, self.mbatch, len(data)),
                  "set_dynamic_batch_size")
        check(acl.mdl.execute(self.model_id, self.inputs, self.outputs), "execute")
        dims, ret = acl.mdl.get_cur_output_dims(self.desc, 0)
        check(ret, "get_cur_output_dims")
        nbytes = int(np.prod(dims["dims"])) * 4
        host, ret = acl.rt.malloc_host(nbytes)
        check(ret, "malloc_host")
        check(acl.rt.memcpy(host, nbytes, self.out_ptrs[0], nbytes, ACL_MEMCPY_DEVICE_TO_HOST), "memcpy D2H")
        out = acl.util.ptr_to_numpy(host, tuple(dims["dims"]), 11).copy()   # 11: NPY_FLOAT32
        check(acl.rt.free_host(host), "free_host")
        return out

    def release(self):
        acl = self.acl
        for dataset, bufs, ptrs in ((self.inputs, self.in_bufs, self.in_ptrs), (self.outputs, self.out_bufs, self.out_ptrs)):
            for buf, ptr in zip(bufs, ptrs):
                check(acl.destroy_data_buffer(buf), "destroy_data_buffer")
                check(acl.rt.free(ptr), "free")
            check(acl.mdl.destroy_dataset(dataset), "destroy_dataset")
        check(acl.mdl.destroy_desc(self.desc), "destroy_desc")
        check(acl.mdl.unload(self.model_id), "unload")
        check(acl.rt.destroy_context(self.context), "destroy_context")
        check(acl.rt.reset_device(self.device_id), "reset_device")
        check(acl.finalize(), "finalize")


def top5(logits: np.ndarray) -> list[tuple[int, float]]:
    e = np.exp(logits - logits.max())
    probs = e / e.sum()
    order = np.argsort(-probs)[:5]
    return [(int(i), round(float(probs[i]), 4)) for i in order]


def sharded(om: str, images: np.ndarray) -> np.ndarray:
    import hccl
    import rt
    rt.init()
    try:
        comms = hccl.comm_init_all(list(range(CARDS)))
        with hccl.load_sharded(om, comms, "batch") as model:
            t0 = time.perf_counter()
            (out,) = model.execute([images])
            print(f"batch-sharded over {CARDS} cards: {len(images)} images in {time.perf_counter() - t0:.2f} s "
                  f"(one per card, outputs all-gathered)")
        for c in comms:
            hccl.comm_destroy(c)
        return out
    finally:
        rt.finalize()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", type=int, default=224, help="image height and width (default 224)")
    parser.add_argument("--keep", metavar="DIR", help="write the .onnx and .om here and keep them")
    args = parser.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="npusim-atc-")
    os.makedirs(work, exist_ok=True)
    onnx_path, om_base = os.path.join(work, "resnet18.onnx"), os.path.join(work, "resnet18")
    try:
        export_resnet18(onnx_path, args.hw)
        print(f"exported {onnx_path} ({os.path.getsize(onnx_path) >> 20} MiB)")
        run_atc(onnx_path, om_base, args.hw)
        om = om_base + ".om"

        images = np.random.default_rng(0).standard_normal((CARDS, 1, 3, args.hw, args.hw)).astype(np.float32)
        clf = Classifier(om)
        t0 = time.perf_counter()
        single = np.concatenate([clf.logits(img) for img in images])
        print(f"pyACL flow on card 0: {CARDS} images in {time.perf_counter() - t0:.2f} s; image 0 top-5 {top5(single[0])}")
        clf.release()

        out = sharded(om, images.reshape(CARDS, 3, args.hw, args.hw))
        np.testing.assert_allclose(out, single, rtol=1e-4, atol=1e-4)
        print("sharded outputs == single-card outputs")
        try:
            import onnxruntime as ort
        except ImportError:
            return
        sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        ref = np.concatenate([sess.run(None, {"input": img})[0] for img in images])
        np.testing.assert_allclose(single, ref, rtol=1e-4, atol=1e-4)
        print("single-card outputs == onnxruntime (rtol 1e-4)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
