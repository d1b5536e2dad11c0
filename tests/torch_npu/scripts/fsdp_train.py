"""FSDP on npu tensors over "hccl": FSDP1 ``FULL_SHARD`` and ``SHARD_GRAD_OP`` and FSDP2 ``fully_shard`` each train
a small model for a few AdamW steps, every rank on its slice of the global batch. FSDP frees and re-allocates its
unsharded parameters by resizing their storages (``resize_(0)`` / ``resize_(n)``); each rank checks that they were
freed, and that the losses and the trained (full) parameters equal plain AdamW training on the whole global batch
in this process on CPU tensors (the oracle), and prints ``rank R MODE OK`` per mode.

    launch --nproc 2 fsdp_train.py [MODE ...]      # modes: full_shard shard_grad_op fully_shard (default: all)
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp import StateDictType, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import torch_npu  # noqa: F401

STEPS, PER_RANK = 3, 4
MODES = ("full_shard", "shard_grad_op", "fully_shard")


class Block(torch.nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 24)
        self.fc2 = torch.nn.Linear(24, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def batches(world):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(world * PER_RANK, 8, generator=g), torch.randint(0, 4, (world * PER_RANK,), generator=g))
            for _ in range(STEPS)]


def oracle(data):
    """Plain training on the global batch (FSDP averages the ranks' gradients of their slices' mean losses)."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    losses = []
    for x, y in data:
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in net.state_dict().items()}


def wrap(mode, device):
    torch.manual_seed(0)
    net = Net().to(device)
    if mode == "fully_shard":
        for block in net.blocks:
            fully_shard(block)
        return fully_shard(net)
    strategy = ShardingStrategy.FULL_SHARD if mode == "full_shard" else ShardingStrategy.SHARD_GRAD_OP
    return FSDP(net, sharding_strategy=strategy, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=device)


def freed_unsharded(model, mode) -> bool:
    """Whether FSDP gave its unsharded parameters' memory back (their storages resized to 0 bytes) after the step
    (SHARD_GRAD_OP keeps them from forward to backward and frees them after backward)."""
    if mode == "fully_shard":
        groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if hasattr(m, "_get_fsdp_state")]
        unsharded = [out for g in groups if g is not None for p in g.fsdp_params for out in p.all_gather_outputs]
    else:
        handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
        unsharded = [h.flat_param._full_param_padded for h in handles]
    assert unsharded, f"{mode}: no unsharded parameter found"
    return all(t.untyped_storage().nbytes() == 0 for t in unsharded)


def full_state(model, mode):
    if mode == "fully_shard":
        return {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False)):
        return {k.replace("_fsdp_wrapped_module.", ""): v.cpu() for k, v in model.state_dict().items()}


def train(mode, device, rank, world, data, expected_losses, expected_state):
    model = wrap(mode, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for step, (x, y) in enumerate(data):
        loss = F.cross_entropy(model(x[mine].to(device)), y[mine].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert freed_unsharded(model, mode), f"{mode} step {step}: unsharded parameters not freed"
        total = loss.detach().clone()
        dist.all_reduce(total)
        torch.testing.assert_close(total.item() / world, expected_losses[step], rtol=1e-5, atol=1e-6,
                                   msg=f"{mode} step {step}: loss")
    state = full_state(model, mode)
    assert set(state) == set(expected_state), (sorted(state), sorted(expected_state))
    for name, value in expected_state.items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5, msg=f"{mode}: {name}")


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("npu", local_rank)
    data = batches(world)
    expected_losses, expected_state = oracle(data)
    for mode in sys.argv[1:] or MODES:
        train(mode, device, rank, world, data, expected_losses, expected_state)
        print(f"rank {rank} {mode} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
