"""The CANN runtime's classic scenarios 1-3, in Python against ``rt``.

    python examples/scenarios.py [--backend ray|local]

1. Devices: enumerate the cards, activate each one, read its name, SoC and memory.
2. Memory: allocate device memory, copy a 4 MiB buffer host -> device -> host, bit-exactly
   (from pageable and from pinned host memory).
3. Streams and events: a copy stream uploads data while a compute stream waits for an event the
   copy stream records, then computes on what was uploaded; and an enqueue returns before a
   1-second kernel finishes (the stream reports NOT_READY until it does).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import rt

MiB = 1 << 20


@rt.kernel
def scale(x, out, *, factor):
    """out = factor * x, run on the card in stream order."""
    out[...] = factor * x


def scenario_devices() -> None:
    print("== 1. enumerate and activate cards")
    count = rt.get_device_count()
    print(f"   {count} cards, SoC {rt.get_soc_name()}")
    for i in range(count):
        rt.set_device(i)
        info = rt.get_device_info(i)
        free, total = rt.get_mem_info()
        print(f"   device {i}: {info.name}  {free / MiB:.0f} MiB free of {total / MiB:.0f} MiB")
        rt.reset_device(i)
    rt.set_device(0)
    print(f"   current device: {rt.get_device()}")


def scenario_memory() -> None:
    print("== 2. allocate, copy 4 MiB host -> device -> host")
    data = np.random.default_rng(0).integers(0, 256, 4 * MiB, dtype=np.uint8)
    dev = rt.malloc(data.nbytes)
    rt.memcpy(dev, data.nbytes, data, data.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE)
    back = np.zeros_like(data)
    rt.memcpy(back, back.nbytes, dev, data.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    print(f"   pageable round trip bit-exact: {np.array_equal(back, data)}")
    pinned = rt.malloc_host(data.nbytes)
    rt.memcpy(pinned, data.nbytes, dev, data.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    print(f"   pinned round trip bit-exact:   {np.array_equal(np.frombuffer(pinned, np.uint8), data)}")
    rt.free_host(pinned)
    rt.free(dev)
    if not np.array_equal(back, data):
        raise SystemExit("scenario 2 failed: the round trip changed the data")


def scenario_streams() -> None:
    print("== 3. streams and events")
    copy_stream, compute_stream = rt.create_stream(), rt.create_stream()
    uploaded = rt.create_event()
    x = np.arange(MiB // 4, dtype=np.float32)
    src = rt.empty(x.shape, np.float32)
    out = rt.empty(x.shape, np.float32)
    rt.sleep_kernel(0.2, copy_stream)              # the upload is late: compute must wait for it
    rt.memcpy_async(src.ptr, src.nbytes, x, x.nbytes, rt.ACL_MEMCPY_HOST_TO_DEVICE, copy_stream)
    rt.record_event(uploaded, copy_stream)
    rt.stream_wait_event(compute_stream, uploaded)
    rt.launch_kernel(scale, [src], [out], {"factor": 2.0}, stream=compute_stream)
    rt.synchronize_stream(compute_stream)
    ok = np.array_equal(out.numpy(), 2 * x)
    print(f"   compute stream ran after the copy stream's event: {ok}")

    t0 = time.perf_counter()
    rt.sleep_kernel(1.0, compute_stream)
    enqueue_ms = (time.perf_counter() - t0) * 1e3
    status = rt.stream_query(compute_stream)
    print(f"   enqueued a 1 s kernel in {enqueue_ms:.2f} ms; stream status right after: "
          f"{'NOT_READY' if status == rt.ACL_STREAM_STATUS_NOT_READY else 'COMPLETE'}")
    rt.synchronize_stream(compute_stream)
    print(f"   synchronize returned after {time.perf_counter() - t0:.2f} s")
    for s in (copy_stream, compute_stream):
        rt.destroy_stream(s)
    rt.destroy_event(uploaded)
    if not ok or status != rt.ACL_STREAM_STATUS_NOT_READY:
        raise SystemExit("scenario 3 failed")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="CANN runtime scenarios 1-3 against rt")
    p.add_argument("--backend", choices=("ray", "local"), default=None,
                   help="ray (default: card actors in an embedded Ray session) or local (in-process cards)")
    args = p.parse_args(argv)
    rt.init(backend=args.backend)
    try:
        scenario_devices()
        scenario_memory()
        scenario_streams()
        rt.reset_device(0)
    finally:
        rt.finalize()
    print("all scenarios done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
