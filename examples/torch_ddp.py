"""DistributedDataParallel over the "hccl" backend on simulated cards, checked against single-process training.

    launch --nproc 4 examples/torch_ddp.py          # torchrun --nproc-per-node 4 examples/torch_ddp.py works too

A torch_npu-style script: ``init_process_group("hccl")``, ``torch.npu.set_device(local_rank)``, the model and
each batch moved with ``.npu()`` (tensors on ``npu:N``), ``DistributedDataParallel(model, device_ids=[local_rank])``.
Each rank trains on its quarter of every global batch; DDP all-reduces the gradients through npusim's HCCL on
the cards. Rank 0 then trains the
same model in one process on the whole global batch and checks that every step's loss and the final weights
agree (float tolerance): data parallelism must not change the mathematics. Needs ``pip install "npusim[torch]"``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_npu  # noqa: F401  - registers torch.npu and the "hccl" backend

STEPS, GLOBAL_BATCH, FEATURES, CLASSES, LR = 30, 64, 20, 5, 0.2


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, CLASSES))


def make_data():
    """The same synthetic classification data on every rank: a noisy linear teacher."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, GLOBAL_BATCH, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(STEPS, GLOBAL_BATCH, CLASSES, generator=g)).argmax(-1)
    return x, y


def train_ddp(rank: int, world: int, device: torch.device, x, y) -> list[float]:
    model = make_model().npu()                # onto torch.npu.set_device's card, as torch_npu scripts do
    assert next(model.parameters()).device == device, next(model.parameters()).device
    ddp = DDP(model, device_ids=[device.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    per_rank = GLOBAL_BATCH // world
    losses = []
    for step in range(STEPS):
        xs = x[step, rank * per_rank:(rank + 1) * per_rank].npu()
        ys = y[step, rank * per_rank:(rank + 1) * per_rank].npu()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(xs), ys)
        loss.backward()                       # DDP all-reduces the gradient buckets here
        opt.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
        losses.append(global_loss.item())
    return losses, model


def train_single(x, y) -> tuple[list[float], torch.nn.Module]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[step]), y[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def main() -> None:
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.npu.set_device(local_rank)
    device = torch.device(f"npu:{local_rank}")
    if GLOBAL_BATCH % world:
        raise SystemExit(f"the global batch ({GLOBAL_BATCH}) must split evenly over {world} ranks")
    x, y = make_data()
    losses, model = train_ddp(rank, world, device, x, y)
    if rank == 0:
        ref_losses, ref_model = train_single(x, y)
        for step in (0, STEPS // 2, STEPS - 1):
            print(f"step {step:2d}: loss {losses[step]:.5f} on {world} ranks, {ref_losses[step]:.5f} in one process")
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
        print(f"ok: DDP over hccl on {world} simulated cards matches single-process training "
              f"(loss {losses[0]:.3f} -> {losses[-1]:.3f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
