"""Run under `launch --nproc 2`: group names, DeviceMesh/DTensor, tensor parallel, functional collectives,
ProcessGroupHCCL.Options and torch.compile of DDP on "hccl", each against numpy or single-process torch.
Prints "MESH OK" on success."""

import os

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch_npu
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

local = int(os.environ["LOCAL_RANK"])
torch.npu.set_device(local)
opts = torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()
opts.hccl_config = {"hccl_buffer_size": 200}
dist.init_process_group("hccl", pg_options=opts)
rank, world = dist.get_rank(), dist.get_world_size()
c10d = dist.distributed_c10d

# group names: set by c10d, resolvable by name, as for NCCL/gloo
world_pg = dist.group.WORLD
sub = dist.new_group(list(range(world)))
assert world_pg.group_name == c10d._get_process_group_name(world_pg) == "0", world_pg.group_name
assert sub.group_name == c10d._get_process_group_name(sub) != world_pg.group_name
assert c10d._resolve_process_group(sub.group_name) is sub
backend = world_pg._get_backend(torch.device("npu"))
assert backend.options.hccl_config == {"hccl_buffer_size": 200} and backend.options.is_high_priority_stream is False
names = [None] * world
dist.all_gather_object(names, backend.get_hccl_comm_name(rank))
assert len(set(names)) == 1 and names[0] != sub._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
try:
    dist.new_group(list(range(world)), pg_options=object())
    raise AssertionError("new_group took pg_options=object()")
except TypeError as e:
    assert "ProcessGroupHCCL.Options" in str(e), e

# functional collectives, by group object and by name
x = torch.arange(6, dtype=torch.float32) + 10 * rank
want = sum(np.arange(6, dtype=np.float32) + 10 * r for r in range(world))
got = funcol.all_reduce(x.npu(), "sum", world_pg)
assert np.allclose(got.cpu().numpy(), want), got
got = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x.npu(), "sum", sub.group_name))
assert np.allclose(got.cpu().numpy(), want), got
gathered = funcol.all_gather_tensor(x.npu(), 0, world_pg)
assert np.allclose(gathered.cpu().numpy(), np.concatenate([np.arange(6) + 10 * r for r in range(world)]))

# DeviceMesh and DTensor against numpy
mesh = init_device_mesh("npu", (world,))
assert mesh.get_group().group_name == mesh.get_group()._get_backend(torch.device("npu")).group_name
assert DeviceMesh.from_group(world_pg, "npu").size() == world
g = torch.Generator().manual_seed(0)
a, b = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
da = distribute_tensor(a.npu(), mesh, [Shard(0)])
db = distribute_tensor(b.npu(), mesh, [Replicate()])
assert da.to_local().shape == (8 // world, 6)
prod = (da @ db).full_tensor().cpu().numpy()
assert np.allclose(prod, a.numpy() @ b.numpy(), atol=1e-5), prod
col = distribute_tensor(a.npu(), mesh, [Shard(1)])
assert np.allclose(col.sum().full_tensor().cpu().numpy(), a.numpy().sum(), atol=1e-4)
assert np.allclose(col.redistribute(mesh, [Shard(0)]).to_local().cpu().numpy(),
                   np.split(a.numpy(), world)[rank])

# tensor parallel MLP against the same MLP in one process
torch.manual_seed(0)
ref = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6))
tp = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6))
tp.load_state_dict(ref.state_dict())
tp = parallelize_module(tp.npu(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
inp = torch.randn(5, 6, generator=g)
out = tp(inp.npu())
out = out.full_tensor() if isinstance(out, DTensor) else out
assert torch.allclose(out.cpu(), ref(inp), atol=1e-5), (out, ref(inp))
out.sum().backward()
ref(inp).sum().backward()
w_grad = tp[0].weight.grad.full_tensor().cpu()
assert torch.allclose(w_grad, ref[0].weight.grad, atol=1e-5)

# torch.compile of DDP (steps with bucket rebuilding and a backward) against eager DDP
def train(compile_backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).npu(), device_ids=[local])
    run = torch.compile(model, backend=compile_backend) if compile_backend else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        batch = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * step + rank)).npu()
        loss = run(batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


eager_losses, eager_params = train(None)
for compile_backend in ("eager", "aot_eager"):
    losses, params = train(compile_backend)
    assert np.allclose(losses, eager_losses, atol=1e-6), (compile_backend, losses, eager_losses)
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(params, eager_params)), compile_backend

print("MESH OK", flush=True)
dist.destroy_process_group()
