"""Mesh algorithms: one-shot collectives over peer memory (intra-node full mesh, HCCS-style).

Every rank reads what it needs directly from every peer, so a collective takes one or two steps
whatever the rank count: all_reduce is a reduce-scatter step (rank i pulls chunk i from every rank
and reduces, starting from its own data so an in-place call never reads a region it already
overwrote, then the peers in rank order) followed by an all-gather step. Costs follow the
reference: all_reduce 2α + 2nβ/p + (p−1)nγ/p.

The ``*_phase`` functions work on a group of ranks over logical ranges described by layouts (see
``schedule``) and are reused by the hierarchical algorithm as its level0.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from .schedule import (Layout, Schedule, Steps, Transfer, by_rank, check_args, chunk_bounds, flat,
                       make_schedule, move, signal, window)

# A broadcast whose per-rank chunk would be smaller than this many elements is a direct pull:
# two barriers cost more than moving a few extra elements.
DIRECT_BROADCAST_MIN_CHUNK = 64


# ----------------------------------------------------------------------------------------------
# Phases over a group (group[i] is the real rank of member i)

def reduce_scatter_phase(group: Sequence[int], bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member i ends with chunk [bounds[i], bounds[i+1]) reduced over the group, in ``acc``."""
    step = []
    for i, me in enumerate(group):
        lo, hi = bounds[i], bounds[i + 1]
        step += move(me, init, me, acc, lo, hi, reduce=False)
        for j, peer in enumerate(group):
            if j != i:
                step += move(peer, init, me, acc, lo, hi, reduce=True)
    return [step]


def all_gather_phase(group: Sequence[int], bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member i starts with chunk i in ``init``; everyone ends with every chunk in ``acc``."""
    step = []
    for me in group:
        for j, peer in enumerate(group):
            step += move(peer, init, me, acc, bounds[j], bounds[j + 1], reduce=False)
    return [step]


def all_reduce_phase(group: Sequence[int], lo: int, hi: int, init: Layout, acc: Layout) -> Steps:
    bounds = chunk_bounds(lo, hi, len(group))
    return reduce_scatter_phase(group, bounds, init, acc) + all_gather_phase(group, bounds, acc, acc)


def gather_phase(group: Sequence[int], root: int, bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member i holds chunk i in ``init``; member ``root`` ends with all chunks in ``acc``."""
    step = []
    for j, peer in enumerate(group):
        step += move(peer, init, group[root], acc, bounds[j], bounds[j + 1], reduce=False)
    return [step]


def scatter_phase(group: Sequence[int], root: int, bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member ``root`` holds every chunk in ``init``; member i ends with chunk i in ``acc``."""
    step = []
    for i, me in enumerate(group):
        step += move(group[root], init, me, acc, bounds[i], bounds[i + 1], reduce=False)
    return [step]


def broadcast_phase(group: Sequence[int], root: int, lo: int, hi: int, buf: Layout,
                    direct: bool | None = None) -> Steps:
    """Everyone ends with the root's [lo, hi) in ``buf``: a direct pull, or scatter + all-gather."""
    g = len(group)
    if direct is None:
        direct = hi - lo < g * DIRECT_BROADCAST_MIN_CHUNK
    if direct:
        return [[t for i, me in enumerate(group) if i != root
                 for t in move(group[root], buf, me, buf, lo, hi, reduce=False)]]
    bounds = chunk_bounds(lo, hi, g)
    scatter = [t for i, me in enumerate(group) if i != root
               for t in move(group[root], buf, me, buf, bounds[i], bounds[i + 1], reduce=False)]
    gather = [t for i, me in enumerate(group) if i != root
              for j, peer in enumerate(group) if j != i
              for t in move(peer, buf, me, buf, bounds[j], bounds[j + 1], reduce=False)]
    return [scatter, gather]


def push_broadcast_phase(group: Sequence[int], root: int, lo: int, hi: int, buf: Layout) -> Steps:
    """Everyone ends with the root's [lo, hi) in ``buf``, in one step: member i reads chunk i of the root's buffer
    once and writes it into every other member's (``Transfer.by``). Each chunk is read from memory once instead
    of once per member, and the runner writes it everywhere while it is in its core's cache
    (``steps.run_step``): 16 MiB on 8 ranks, 2 cores, docs/performance.md. Inside one node only."""
    bounds = chunk_bounds(lo, hi, len(group))
    return [[replace(t, by=me) for i, me in enumerate(group)
             for j, peer in enumerate(group) if j != root
             for t in move(group[root], buf, peer, buf, bounds[i], bounds[i + 1], reduce=False)]]


def push_all_gather_phase(group: Sequence[int], bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """As ``all_gather_phase``, but member j writes its chunk into every member's ``acc`` (itself first): the
    chunk is read once (``push_broadcast_phase``). Inside one node only."""
    order = lambda j: [j] + [i for i in range(len(group)) if i != j]    # noqa: E731
    return [[replace(t, by=peer) for j, peer in enumerate(group) for i in order(j)
             for t in move(peer, init, group[i], acc, bounds[j], bounds[j + 1], reduce=False)]]


def reduce_phase(group: Sequence[int], root: int, lo: int, hi: int, init: Layout, acc: Layout) -> Steps:
    """Member ``root`` ends with [lo, hi) reduced over the group in ``acc`` (others' acc is scratch)."""
    bounds = chunk_bounds(lo, hi, len(group))
    return (reduce_scatter_phase(group, bounds, init, acc)
            + gather_phase(group, root, bounds, acc, acc))


def barrier_phase(group: Sequence[int]) -> Steps:
    return [[signal(peer, me) for me in group for peer in group if peer != me]]


# ----------------------------------------------------------------------------------------------
# Public schedules

def _ranks(n: int) -> list[int]:
    return list(range(n))


def all_reduce(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """Reduce-scatter step + all-gather step; send → recv (in place allowed)."""
    check_args("all_reduce", world_size, count)
    steps = all_reduce_phase(_ranks(world_size), 0, count, flat("send"), flat("recv"))
    return make_schedule("mesh", "all_reduce", world_size, count, None, steps)


def reduce_scatter(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """One step: rank r reduces block r of every send into recv[count]."""
    check_args("reduce_scatter", world_size, count)
    n, c = world_size, count
    acc = window(lambda r: r * c, lambda r: (r + 1) * c, flat("recv", lambda r: r * c), flat("tmp"))
    bounds = [r * c for r in range(n + 1)]
    steps = reduce_scatter_phase(_ranks(n), bounds, flat("send"), acc)
    return make_schedule("mesh", "reduce_scatter", n, c, None, steps)


def all_gather(world_size: int, count: int, *, root=None, ranks_per_node=None, push: bool = False) -> Schedule:
    """One step: rank r pulls every rank's send[count] into block j of recv[count * n]; ``push``: rank r writes its
    send[count] into block r of every rank's recv (``push_all_gather_phase``)."""
    check_args("all_gather", world_size, count)
    n, c = world_size, count
    phase = push_all_gather_phase if push else all_gather_phase
    steps = phase(_ranks(n), [r * c for r in range(n + 1)], flat("send", lambda r: r * c), flat("recv"))
    return make_schedule("mesh", "all_gather", n, c, None, steps)


def broadcast(world_size: int, count: int, *, root=None, ranks_per_node=None,
              direct: bool | None = None, push: bool = False) -> Schedule:
    """Scatter + all-gather over the single buffer "recv" (a direct pull for small counts); ``push``: one step in
    which rank i writes chunk i of the root's buffer into every other rank's (``push_broadcast_phase``)."""
    check_args("broadcast", world_size, count, root)
    group = _ranks(world_size)
    if push and count >= world_size * DIRECT_BROADCAST_MIN_CHUNK:
        steps = push_broadcast_phase(group, root, 0, count, flat("recv"))
    else:
        steps = broadcast_phase(group, root, 0, count, flat("recv"), direct)
    return make_schedule("mesh", "broadcast", world_size, count, root, steps)


def reduce(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """Reduce-scatter step (non-roots accumulate in tmp) + gather to the root's recv."""
    check_args("reduce", world_size, count, root)
    acc = by_rank(lambda r: flat("recv") if r == root else flat("tmp"))
    steps = reduce_phase(_ranks(world_size), root, 0, count, flat("send"), acc)
    return make_schedule("mesh", "reduce", world_size, count, root, steps)


def scatter(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """One step: rank r pulls block r of the root's send into recv[count]."""
    check_args("scatter", world_size, count, root)
    n, c = world_size, count
    steps = scatter_phase(_ranks(n), root, [r * c for r in range(n + 1)], flat("send"),
                          flat("recv", lambda r: r * c))
    return make_schedule("mesh", "scatter", n, c, root, steps)


def all_to_all(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """One step: rank i pulls block i of rank j's send into block j of its recv, for every j."""
    check_args("all_to_all", world_size, count)
    n, c = world_size, count
    step = [Transfer(j, "send", i * c, i, "recv", j * c, c, False) for i in range(n) for j in range(n)]
    return make_schedule("mesh", "all_to_all", n, c, None, [step])


def barrier(world_size: int, count: int = 0, *, root=None, ranks_per_node=None) -> Schedule:
    """One step in which every rank waits for every other (zero-count signals)."""
    check_args("barrier", world_size, 0)
    return make_schedule("mesh", "barrier", world_size, 0, None, barrier_phase(_ranks(world_size)))
