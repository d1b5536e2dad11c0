"""A training script as torch_npu users write it: ``torch.npu.set_device(local_rank)``, ``init_process_group("hccl")``,
``model.npu()``, DDP, mixed precision with ``torch_npu.npu.amp`` (``autocast`` + ``GradScaler``), batches copied to
the card on a side ``torch.npu.Stream``, step timing with ``torch.npu.Event``, ``torch.npu.memory_allocated()``.
``--device cpu`` runs the same program on CPU tensors over gloo (``torch.autocast("cpu", float16)``,
``torch.amp.GradScaler("cpu")``): the oracle. Rank 0 writes the per-step losses and the final weights to ``--out``.

    launch --nproc 2 user_train.py --out npu.pt            torchrun --nproc-per-node 2 user_train.py --out npu.pt
    launch --nproc 2 user_train.py --device cpu --out cpu.pt
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_npu  # noqa: F401
from torch_npu.npu import amp

STEPS, BATCH, FEATURES, HIDDEN, CLASSES = 12, 16, 24, 64, 6


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


def batches(rank, world):
    g = torch.Generator().manual_seed(7)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    for _ in range(STEPS):
        x = torch.randn(BATCH * world, FEATURES, generator=g)
        y = (x @ teacher).argmax(-1)                                    # a learnable labelling
        yield x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="npu", choices=["npu", "cpu"])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    on_npu = args.device == "npu"
    if on_npu:
        torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl" if on_npu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"npu:{local_rank}") if on_npu else torch.device("cpu")

    torch.manual_seed(0)
    model = Net().npu() if on_npu else Net()
    ddp = DDP(model, device_ids=[local_rank] if on_npu else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    scaler = amp.GradScaler(init_scale=2.0 ** 10) if on_npu else torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    copy_stream = torch.npu.Stream() if on_npu else None
    start = torch.npu.Event(enable_timing=True) if on_npu else None
    end = torch.npu.Event(enable_timing=True) if on_npu else None

    losses, step_ms = [], []
    for x, y in batches(rank, world):
        if on_npu:
            with torch.npu.stream(copy_stream):
                x, y = x.npu(non_blocking=True), y.npu(non_blocking=True)
            torch.npu.current_stream().wait_stream(copy_stream)
            start.record()
        autocast = amp.autocast() if on_npu else torch.autocast("cpu", dtype=torch.float16)
        with autocast:
            loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if on_npu:
            end.record()
            end.synchronize()
            step_ms.append(start.elapsed_time(end))
        mean = loss.detach().float().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())

    assert x.device == device and loss.dtype == torch.float32, (x.device, loss.dtype)
    if on_npu:
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        allocated = torch.npu.memory_allocated()
        assert allocated >= 2 * params, (allocated, params)          # weights and their gradients at least
        assert torch.npu.max_memory_allocated() >= allocated
        assert all(ms >= 0 for ms in step_ms), step_ms
        print(f"rank {rank}: memory_allocated {allocated} B for {params} B of weights; "
              f"step {sum(step_ms) / len(step_ms):.2f} ms on card {torch.npu.current_device()}", flush=True)
    if rank == 0:
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        torch.save({"losses": losses, "weights": weights, "scale": scaler.get_scale()}, args.out)
        print(f"TRAINED on {args.device}: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
