"""A stand-in for an ATC model: same inputs and outputs as ResNet-50's ``resnet50.om``, built for npusim.

    python examples/acl_standin.py resnet50.om             # input [1,3,224,224] float32 -> output [1,1000]
    python examples/acl_standin.py resnet50.om --batch 1,2,4,8   # dynamic batch gears, as atc --dynamic_batch_size

A real ``.om`` is ATC's binary for the AI Core and cannot run on a simulated card; a pyACL program that
loads one needs a model with the same input and output names, shapes and dtypes, so that its buffer sizes,
``get_input_dims`` answers and post-processing stay as they are. This one averages each colour channel
(ReduceMean over H and W), maps the three means to 1000 logits (Gemm) and returns softmax probabilities.
Its weights go beside the model (``resnet50.npz``) so a test can check the program's output with numpy::

    w = np.load("resnet50.npz"); probs = reference(image, w)

Make your own stand-in the same way: one ``g.input`` per ATC input (name, dtype, dims; ``-1`` for a dynamic
dimension), any small graph of the ONNX-named kernels, one ``g.output`` per ATC output (docs/pyacl.md).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from rt import mdl

INPUT, OUTPUT = "actual_input_1", "output1"       # the names ATC gives an ONNX ResNet-50's input and output
CLASSES = 1000


def build(path: str, gears: list[int] | None = None, seed: int = 0, hw: int = 224) -> dict:
    """Write the stand-in model to ``path`` and its weights to ``<path without suffix>.npz``; return them."""
    rng = np.random.default_rng(seed)
    weights = {"w": rng.standard_normal((3, CLASSES)).astype(np.float32),
               "b": (rng.standard_normal(CLASSES) * 0.1).astype(np.float32)}
    g = mdl.GraphBuilder("resnet50_standin")
    x = g.input(INPUT, "float32", [-1 if gears else 1, 3, hw, hw])
    means = g.op("ReduceMean", [x], axes=[2, 3], keepdims=0)
    logits = g.op("Gemm", [means, g.constant("w", weights["w"]), g.constant("b", weights["b"])])
    g.output(OUTPUT, g.op("Softmax", [logits], axis=-1))
    if gears:
        g.set_dynamic_batch(gears)
    g.save(path)
    np.savez(os.path.splitext(path)[0] + ".npz", **weights)
    return weights


def reference(images: np.ndarray, weights) -> np.ndarray:
    """The numpy forward pass of the stand-in: probabilities [N, 1000]."""
    z = images.astype(np.float64).mean(axis=(2, 3)) @ weights["w"] + weights["b"]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", help="where to write the model (any name; resnet50.om is fine)")
    p.add_argument("--batch", default="", help="dynamic batch gears, e.g. 1,2,4,8 (default: static batch 1)")
    p.add_argument("--hw", type=int, default=224, help="image height and width (default 224)")
    a = p.parse_args()
    gears = [int(b) for b in a.batch.split(",") if b]
    build(a.path, gears or None, hw=a.hw)
    print(f"wrote {a.path} ({os.path.getsize(a.path)} bytes): input {INPUT} "
          f"[{'-1' if gears else 1},3,{a.hw},{a.hw}] float32 -> output {OUTPUT} [.., {CLASSES}] float32"
          + (f", batch gears {gears}" if gears else ""))


if __name__ == "__main__":
    main()
