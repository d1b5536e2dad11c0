"""``nn.SyncBatchNorm`` as torch_npu users train with it: ``convert_sync_batchnorm`` + DDP over "hccl", each rank a
slice of the global batch (rank 1's slice may be smaller, or empty with ``--empty``). Every rank checks its outputs,
the trained weights, the gradients and the running statistics against plain ``BatchNorm2d`` over the whole global
batch in this process on CPU tensors (the oracle), and prints ``OK``.

    launch --nproc 2 sync_batch_norm.py [--empty]
"""

import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_npu  # noqa: F401

STEPS, CHANNELS = 3, 5


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(3, CHANNELS, 3, padding=1), torch.nn.BatchNorm2d(CHANNELS),
                               torch.nn.ReLU(), torch.nn.Conv2d(CHANNELS, 2, 1), torch.nn.BatchNorm2d(2, affine=False))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [6, 0] if "--empty" in sys.argv else [6, 4]      # per-rank batch sizes: uneven counts
    start = sum(sizes[:rank])

    oracle = model()
    net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(oracle)).npu()
    assert isinstance(net[1], torch.nn.SyncBatchNorm)
    ddp = DDP(net, device_ids=[local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(oracle.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(11)
    for step in range(STEPS):
        x = torch.randn(sum(sizes), 3, 4, 4, generator=g)
        target = torch.randn(sum(sizes), 2, 4, 4, generator=g)
        # The oracle's loss is the global batch's sum / N; DDP averages each rank's gradient over the ranks, so a
        # rank's loss is its slice's sum * world / N.
        ref_out = oracle(x)
        ((ref_out - target) ** 2).sum().div(sum(sizes)).backward()
        mine = slice(start, start + sizes[rank])
        out = ddp(x[mine].npu())
        assert out.device == torch.device("npu", local_rank), out.device
        ((out - target[mine].npu()) ** 2).sum().mul(world / sum(sizes)).backward()
        torch.testing.assert_close(out.cpu(), ref_out[mine].detach(), rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(oracle.named_parameters(), net.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=f"step {step}: {name}.grad")
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    for (name, b), c in zip(oracle.named_buffers(), net.buffers()):
        torch.testing.assert_close(c.cpu(), b, rtol=1e-4, atol=1e-5, msg=name)
    for (name, p), q in zip(oracle.named_parameters(), net.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)
    net.eval()                                    # eval: the running statistics, no collective
    x = torch.randn(4, 3, 4, 4, generator=g)
    oracle.eval()
    torch.testing.assert_close(net(x.npu()).cpu(), oracle(x).detach(), rtol=1e-4, atol=1e-5)
    dist.destroy_process_group()
    print(f"rank {rank} OK", flush=True)


if __name__ == "__main__":
    main()
