"""Hierarchical algorithms: level0 inside a node (mesh), level1 across nodes (ring or H-D_R).

Ranks are contiguous per node: rank = node * ranks_per_node + local. Level1 runs in parallel
over the "columns" of ranks sharing a local index, so only ranks with the same local index ever
talk across nodes. The stages follow HCCL on Atlas A2 (reference §3.7):

| collective     | stage 1              | stage 2              | stage 3            |
|----------------|----------------------|----------------------|--------------------|
| all_reduce     | intra reduce-scatter | inter all_reduce     | intra all-gather   |
| all_gather     | intra all-gather     | inter all-gather     |                    |
| reduce_scatter | inter reduce-scatter | intra reduce-scatter |                    |
| broadcast      | intra scatter        | inter broadcast      | intra all-gather   |
| reduce         | intra reduce-scatter | inter reduce         | intra gather       |
| scatter        | inter scatter        | intra scatter        |                    |

all_reduce moves 1/m of the vector per rank across nodes (m = ranks per node). One node is the
mesh algorithm and one rank per node is the level1 algorithm; both are returned as such (with
algo "hierarchical"). all_to_all is not hierarchical here; ``select`` falls back to mesh.
"""

from __future__ import annotations

from . import hd, mesh, ring
from .schedule import (Schedule, Steps, by_rank, check_args, chunk_bounds, flat, in_parallel,
                       make_schedule, window)

LEVEL1 = {"ring": ring, "hd": hd, "H-D_R": hd}


class _Topo:
    """Node / column membership for world_size ranks, ranks_per_node contiguous per node."""

    def __init__(self, op: str, world_size: int, count: int, root, ranks_per_node, level1: str):
        check_args(op, world_size, count, root, ranks_per_node)
        if level1 not in LEVEL1:
            from ..errors import HcclError
            from ..types import HcclResult
            raise HcclError(HcclResult.HCCL_E_PARA,
                            f"hierarchical {op}: level1 algorithm {level1!r} unknown (expected ring or hd)")
        self.m = ranks_per_node or world_size
        self.k = world_size // self.m
        self.level1 = LEVEL1[level1]

    def node(self, g: int) -> list[int]:
        return [g * self.m + local for local in range(self.m)]

    def column(self, local: int) -> list[int]:
        return [g * self.m + local for g in range(self.k)]

    def degenerate(self, op: str, world_size: int, count: int, root, **kw) -> Schedule | None:
        """One node → mesh; one rank per node → level1 alone; relabelled "hierarchical"."""
        module = mesh if self.k == 1 else self.level1 if self.m == 1 else None
        if module is None:
            return None
        s = getattr(module, op)(world_size, count, root=root, **kw)
        return make_schedule("hierarchical", op, world_size, s.count, s.root, [list(x) for x in s.steps])


def _finish(op: str, topo: _Topo, count: int, root, *stages: Steps) -> Schedule:
    steps = [step for stage in stages for step in stage]
    return make_schedule("hierarchical", op, topo.k * topo.m, count, root, steps)


def all_reduce(world_size: int, count: int, *, root=None, ranks_per_node=None, level1="ring") -> Schedule:
    """Intra reduce-scatter → inter all_reduce of each rank's chunk → intra all-gather."""
    t = _Topo("all_reduce", world_size, count, None, ranks_per_node, level1)
    if (s := t.degenerate("all_reduce", world_size, count, None)) is not None:
        return s
    bounds = chunk_bounds(0, count, t.m)
    send, recv = flat("send"), flat("recv")
    return _finish("all_reduce", t, count, None,
                   in_parallel(*[mesh.reduce_scatter_phase(t.node(g), bounds, send, recv) for g in range(t.k)]),
                   in_parallel(*[t.level1.all_reduce_phase(t.column(j), bounds[j], bounds[j + 1], recv, recv)
                                 for j in range(t.m)]),
                   in_parallel(*[mesh.all_gather_phase(t.node(g), bounds, recv, recv) for g in range(t.k)]))


def all_gather(world_size: int, count: int, *, root=None, ranks_per_node=None, level1="ring") -> Schedule:
    """Intra all-gather of the node's blocks → inter all-gather of whole node regions."""
    t = _Topo("all_gather", world_size, count, None, ranks_per_node, level1)
    if (s := t.degenerate("all_gather", world_size, count, None)) is not None:
        return s
    c, m = count, t.m
    recv = flat("recv")
    node_blocks = [g * m * c for g in range(t.k + 1)]
    return _finish("all_gather", t, c, None,
                   in_parallel(*[mesh.all_gather_phase(t.node(g), [(g * m + j) * c for j in range(m + 1)],
                                                       flat("send", lambda r: r * c), recv)
                                 for g in range(t.k)]),
                   in_parallel(*[t.level1.all_gather_phase(t.column(j), node_blocks, recv, recv)
                                 for j in range(m)]))


def reduce_scatter(world_size: int, count: int, *, root=None, ranks_per_node=None, level1="ring") -> Schedule:
    """Inter reduce-scatter of node regions (into tmp, laid out like send) → intra reduce-scatter."""
    t = _Topo("reduce_scatter", world_size, count, None, ranks_per_node, level1)
    if (s := t.degenerate("reduce_scatter", world_size, count, None)) is not None:
        return s
    c, m = count, t.m
    tmp = flat("tmp")
    own = window(lambda r: r * c, lambda r: (r + 1) * c, flat("recv", lambda r: r * c), tmp)
    node_blocks = [g * m * c for g in range(t.k + 1)]
    return _finish("reduce_scatter", t, c, None,
                   in_parallel(*[t.level1.reduce_scatter_phase(t.column(j), node_blocks, flat("send"), tmp)
                                 for j in range(m)]),
                   in_parallel(*[mesh.reduce_scatter_phase(t.node(g), [(g * m + j) * c for j in range(m + 1)],
                                                           tmp, own)
                                 for g in range(t.k)]))


def broadcast(world_size: int, count: int, *, root=None, ranks_per_node=None, level1="ring") -> Schedule:
    """Intra scatter in the root's node → inter broadcast per chunk → intra all-gather."""
    t = _Topo("broadcast", world_size, count, root, ranks_per_node, level1)
    if (s := t.degenerate("broadcast", world_size, count, root)) is not None:
        return s
    node_r, local_r = divmod(root, t.m)
    bounds = chunk_bounds(0, count, t.m)
    buf = flat("recv")
    gather = in_parallel(*[mesh.all_gather_phase(t.node(g), bounds, buf, buf) for g in range(t.k)])
    gather = [[x for x in step if x.dst != root] for step in gather]  # the root has it all already
    return _finish("broadcast", t, count, root,
                   mesh.scatter_phase(t.node(node_r), local_r, bounds, buf, buf),
                   in_parallel(*[t.level1.broadcast_phase(t.column(j), node_r, bounds[j], bounds[j + 1], buf)
                                 for j in range(t.m)]),
                   gather)


def reduce(world_size: int, count: int, *, root=None, ranks_per_node=None, level1="ring") -> Schedule:
    """Intra reduce-scatter → inter reduce of each chunk to the root's node → intra gather."""
    t = _Topo("reduce", world_size, count, root, ranks_per_node, level1)
    if (s := t.degenerate("reduce", world_size, count, root)) is not None:
        return s
    node_r, local_r = divmod(root, t.m)
    bounds = chunk_bounds(0, count, t.m)
    acc = by_rank(lambda r: flat("recv") if r == root else flat("tmp"))
    return _finish("reduce", t, count, root,
                   in_parallel(*[mesh.reduce_scatter_phase(t.node(g), bounds, flat("send"), acc)
                                 for g in range(t.k)]),
                   in_parallel(*[t.level1.reduce_phase(t.column(j), node_r, bounds[j], bounds[j + 1], acc, acc)
                                 for j in range(t.m)]),
                   mesh.gather_phase(t.node(node_r), local_r, bounds, acc, acc))


def scatter(world_size: int, count: int, *, root=None, ranks_per_node=None, level1="ring") -> Schedule:
    """Inter scatter of node regions along the root's column → intra scatter in every node."""
    t = _Topo("scatter", world_size, count, root, ranks_per_node, level1)
    if (s := t.degenerate("scatter", world_size, count, root)) is not None:
        return s
    c, m = count, t.m
    node_r, local_r = divmod(root, m)
    held = by_rank(lambda r: flat("send") if r == root else flat("tmp"))
    own = window(lambda r: r * c, lambda r: (r + 1) * c, flat("recv", lambda r: r * c), flat("tmp"))
    return _finish("scatter", t, c, root,
                   t.level1.scatter_phase(t.column(local_r), node_r, [g * m * c for g in range(t.k + 1)],
                                          flat("send"), held),
                   in_parallel(*[mesh.scatter_phase(t.node(g), local_r, [(g * m + j) * c for j in range(m + 1)],
                                                    held, own)
                                 for g in range(t.k)]))


def barrier(world_size: int, count: int = 0, *, root=None, ranks_per_node=None, level1="ring") -> Schedule:
    """Intra barrier → inter barrier per column → intra barrier."""
    t = _Topo("barrier", world_size, 0, None, ranks_per_node, level1)
    if (s := t.degenerate("barrier", world_size, 0, None)) is not None:
        return s
    intra = in_parallel(*[mesh.barrier_phase(t.node(g)) for g in range(t.k)])
    inter = in_parallel(*[t.level1.barrier_phase(t.column(j)) for j in range(t.m)])
    return _finish("barrier", t, 0, None, intra, inter, intra)
