"""atc and a converted ResNet-18 (not a test): conversion time, images/s on 1 card and batch-sharded on 8 cards,
beside onnxruntime on the same machine.

    python bench/atc_bench.py [--backend ray|local] [--hw 224] [--batch 8] [--iters 3]

1. ``torch.onnx.export`` of ResNet-18 (examples/atc_models.py, random weights), then ``atc`` (the CLI's
   ``main``, in-process) with ``--dynamic_batch_size=1,<batch>``: wall time of the conversion;
2. the model on card 0 (rt.mdl: load, execute at gear ``batch``): images/s over ``iters`` executions after one
   warm-up, host copies included;
3. ``hccl.load_sharded(om, 8 cards, "batch")`` on ``8 x batch`` images (``batch`` per card): images/s;
4. onnxruntime (CPU provider, default threads) on the same ONNX file and batch.

A card computes with numpy on the host's cores, so the 8-card figure is bounded by the machine's core count, not
by 8x: it shows the sharding overhead and what parallelism the host gives, not an NPU's speed. Reported, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

CARDS = 8


def per_second(fn, count: int, iters: int) -> float:
    fn()                                                      # warm-up: loads, first allocations
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return count * iters / (time.perf_counter() - t0)


def one_card(rt, om: str, x: np.ndarray, iters: int) -> float:
    from rt import mdl
    rt.set_device(0)
    model_id = mdl.load_from_file(om)
    desc = mdl.get_desc(model_id)
    t_in = rt.Tensor.from_numpy(x)
    out_size = mdl.get_output_size_by_index(desc, 0)
    out = rt.malloc(out_size)
    ds_in, ds_out = mdl.create_dataset(), mdl.create_dataset()
    mdl.add_dataset_buffer(ds_in, mdl.create_data_buffer(t_in.ptr, t_in.nbytes))
    mdl.add_dataset_buffer(ds_out, mdl.create_data_buffer(out, out_size))
    host = np.empty((len(x), 1000), np.float32)

    def run():
        rt.memcpy(t_in.ptr, t_in.nbytes, x, x.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
        mdl.set_dynamic_batch_size(model_id, ds_in, 0, len(x))
        mdl.execute(model_id, ds_in, ds_out)
        rt.memcpy(host, host.nbytes, out, host.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    try:
        return per_second(run, len(x), iters)
    finally:
        mdl.unload(model_id)
        rt.free(out)


def eight_cards(om: str, x: np.ndarray, iters: int) -> float:
    import hccl
    comms = hccl.comm_init_all(list(range(CARDS)))
    try:
        with hccl.load_sharded(om, comms, "batch") as model:
            return per_second(lambda: model.execute([x]), len(x), iters)
    finally:
        for c in comms:
            hccl.comm_destroy(c)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("ray", "local"), default="ray")
    parser.add_argument("--hw", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8, help="images per card per execution")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args(argv)

    import atc_models
    import onnxruntime as ort
    import torch

    import rt
    from launcher.tools.atc import main as atc_main

    with tempfile.TemporaryDirectory(prefix="npusim-atc-bench-") as tmp:
        onnx_path, om_base = os.path.join(tmp, "resnet18.onnx"), os.path.join(tmp, "resnet18")
        torch.manual_seed(0)
        atc_models.export(atc_models.randomize_bn(atc_models.ResNet18()), (torch.randn(1, 3, args.hw, args.hw),),
                          onnx_path, ["input"], ["output"], dynamic_batch=True)
        t0 = time.perf_counter()
        status = atc_main([f"--model={onnx_path}", "--framework=5", f"--output={om_base}", "--soc_version=Ascend910B1",
                           f"--input_shape=input:-1,3,{args.hw},{args.hw}", f"--dynamic_batch_size=1,{args.batch}"])
        atc_s = time.perf_counter() - t0
        if status != 0:
            raise SystemExit(f"atc failed ({status})")
        om = om_base + ".om"
        rng = np.random.default_rng(0)
        x1 = rng.standard_normal((args.batch, 3, args.hw, args.hw)).astype(np.float32)
        x8 = rng.standard_normal((CARDS * args.batch, 3, args.hw, args.hw)).astype(np.float32)

        sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        ort_ips = per_second(lambda: sess.run(None, {"input": x1}), len(x1), args.iters)

        rt.init(backend=args.backend)
        try:
            card_ips = one_card(rt, om, x1, args.iters)
            sharded_ips = eight_cards(om, x8, args.iters)
        finally:
            rt.finalize()

    print(f"ResNet-18 {args.hw}x{args.hw}, batch {args.batch} per card, {os.cpu_count()} host cores, "
          f"backend {args.backend}")
    print(f"  atc (ONNX -> npusim-om, in-process)     {atc_s:8.2f} s")
    print(f"  1 card (rt.mdl.execute)                 {card_ips:8.2f} images/s")
    print(f"  8 cards, batch-sharded (load_sharded)   {sharded_ips:8.2f} images/s")
    print(f"  onnxruntime CPU                          {ort_ips:8.2f} images/s")


if __name__ == "__main__":
    main()
