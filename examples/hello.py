"""Hello, cards: every rank all-reduces its rank number and prints the sum.

    launch --nproc 8 examples/hello.py

Each rank is its own process with RANK / WORLD_SIZE / DEVICE_ID set by `launch`; `hccl.init()`
builds the world communicator (calling `rt.init()` and `rt.set_device(DEVICE_ID)` first).
"""

import numpy as np

import hccl
import rt


def main() -> None:
    comm = hccl.init()
    rank, world = hccl.get_rank_id(comm), hccl.get_rank_size(comm)
    tensor = rt.Tensor.from_numpy(np.array([rank], dtype=np.int64))
    comm.all_reduce(tensor)          # in place, SUM, on the default stream
    rt.synchronize_stream(None)
    total = int(tensor.numpy()[0])
    expected = world * (world - 1) // 2
    print(f"hello from rank {rank} of {world} on card {rt.get_device()}: "
          f"all_reduce(sum of ranks) = {total}")
    tensor.free()
    hccl.comm_destroy(comm)
    if total != expected:
        raise SystemExit(f"rank {rank}: all_reduce gave {total}, expected {expected}")


if __name__ == "__main__":
    main()
