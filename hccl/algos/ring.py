"""Ring algorithms: every rank only ever pulls from its left neighbour (rank − 1 mod n).

all_reduce splits the vector into n chunks and runs two phases of n − 1 steps each, 2(n − 1) in
all, every step moving one chunk per rank (n/p elements), which is bandwidth-optimal:

* reduce-scatter: in step s rank i pulls chunk (i − s − 2) mod n from its left neighbour — the
  partial sum the neighbour produced in step s − 1 (its own contribution in step 0) — and adds
  its own contribution. A chunk thus travels once around the ring collecting one contribution
  per hop and is complete at rank i after n − 1 hops: rank i ends with chunk i.
* all-gather: in step s rank i pulls chunk (i − 1 − s) mod n, which its neighbour completed or
  received in the step before; after n − 1 steps every rank has every chunk.

Every rank writes each chunk once per phase and reads its own contribution before writing that
chunk, so an in-place call (send is recv) is safe. Broadcast and reduce are chains around the ring
starting right of (ending at) the root, pipelined in segments; scatter is a chain that sends the
block of the farthest rank first, so every block arrives in the last of n − 1 steps.
"""

from __future__ import annotations

from typing import Sequence

from .schedule import (Layout, Schedule, Steps, by_rank, check_args, chunk_bounds, flat,
                       make_schedule, signal, move, window)


# ----------------------------------------------------------------------------------------------
# Phases over a group: member i's left neighbour is member i − 1 (mod the group size)

def reduce_scatter_phase(group: Sequence[int], bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member i ends with chunk [bounds[i], bounds[i+1]) reduced over the group, in ``acc``."""
    g = len(group)
    steps = []
    for s in range(g - 1):
        step = []
        for i, me in enumerate(group):
            b = (i - s - 2) % g
            left = group[(i - 1) % g]
            step += move(me, init, me, acc, bounds[b], bounds[b + 1], reduce=False)
            step += move(left, init if s == 0 else acc, me, acc, bounds[b], bounds[b + 1], reduce=True)
        steps.append(step)
    return steps


def all_gather_phase(group: Sequence[int], bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member i starts with chunk i in ``init``; everyone ends with every chunk in ``acc``."""
    g = len(group)
    steps = []
    for s in range(g - 1):
        step = []
        for i, me in enumerate(group):
            if s == 0:
                step += move(me, init, me, acc, bounds[i], bounds[i + 1], reduce=False)
            b = (i - 1 - s) % g
            step += move(group[(i - 1) % g], init if s == 0 else acc, me, acc,
                         bounds[b], bounds[b + 1], reduce=False)
        steps.append(step)
    return steps


def all_reduce_phase(group: Sequence[int], lo: int, hi: int, init: Layout, acc: Layout) -> Steps:
    bounds = chunk_bounds(lo, hi, len(group))
    return reduce_scatter_phase(group, bounds, init, acc) + all_gather_phase(group, bounds, acc, acc)


def _segments(lo: int, hi: int, g: int, segments: int | None) -> list[int]:
    # g − 1 segments keep the pipeline (g − 2 + segments steps) about twice the ideal length.
    k = segments or max(1, min(g - 1, hi - lo))
    return chunk_bounds(lo, hi, k)


def broadcast_phase(group: Sequence[int], root: int, lo: int, hi: int, buf: Layout,
                    segments: int | None = None) -> Steps:
    """Pipelined chain: the member at distance d right of the root pulls segment s − d + 1 in step s."""
    g = len(group)
    seg = _segments(lo, hi, g, segments)
    k = len(seg) - 1
    steps = []
    for s in range(g - 2 + k):
        step = []
        for d in range(1, g):
            h = s - d + 1
            if 0 <= h < k:
                me, left = group[(root + d) % g], group[(root + d - 1) % g]
                step += move(left, buf, me, buf, seg[h], seg[h + 1], reduce=False)
        steps.append(step)
    return steps


def reduce_phase(group: Sequence[int], root: int, lo: int, hi: int, init: Layout, acc: Layout,
                 segments: int | None = None) -> Steps:
    """Pipelined chain from the root's right neighbour (position 0) round to the root (position
    g − 1): position p ≥ 1 adds the left's partial of segment s − p + 1 to its own in step s."""
    g = len(group)
    seg = _segments(lo, hi, g, segments)
    k = len(seg) - 1
    steps = []
    for s in range(g - 2 + k):
        step = []
        for p in range(1, g):
            h = s - p + 1
            if 0 <= h < k:
                me, left = group[(root + 1 + p) % g], group[(root + p) % g]
                step += move(me, init, me, acc, seg[h], seg[h + 1], reduce=False)
                step += move(left, init if p == 1 else acc, me, acc, seg[h], seg[h + 1], reduce=True)
        steps.append(step)
    return steps


def scatter_phase(group: Sequence[int], root: int, bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Chain scatter: the block for distance D leaves the root in step g − 1 − D and moves one hop
    per step, so in step s the member at distance d pulls the block of distance g + d − s − 2.
    Blocks in transit are kept in ``acc`` at their logical position (tmp for foreign blocks)."""
    g = len(group)
    steps = []
    for s in range(g - 1):
        step = []
        if s == 0:
            step += move(group[root], init, group[root], acc, bounds[root], bounds[root + 1], False)
        for d in range(1, g):
            dist = g + d - s - 2
            if d <= dist <= g - 1:
                target = (root + dist) % g
                me, left = group[(root + d) % g], group[(root + d - 1) % g]
                step += move(left, init if d == 1 else acc, me, acc,
                             bounds[target], bounds[target + 1], reduce=False)
        steps.append(step)
    return steps


def barrier_phase(group: Sequence[int]) -> Steps:
    """g − 1 rounds of signals from the left: after them everyone knows everyone has arrived."""
    g = len(group)
    return [[signal(group[(i - 1) % g], me) for i, me in enumerate(group)] for _ in range(g - 1)]


# ----------------------------------------------------------------------------------------------
# Public schedules

def _trivial(op: str, world_size: int, count: int, root, **kw) -> Schedule | None:
    """One rank: the ring degenerates; the mesh schedule (a local copy) is the same thing."""
    if world_size != 1:
        return None
    from . import mesh
    sched = getattr(mesh, op)(world_size, count, root=root, **kw)
    return make_schedule("ring", op, 1, sched.count, sched.root, [list(s) for s in sched.steps])


def all_reduce(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """Ring reduce-scatter then ring all-gather: 2(n − 1) steps (see module docstring)."""
    check_args("all_reduce", world_size, count)
    if (t := _trivial("all_reduce", world_size, count, None)) is not None:
        return t
    steps = all_reduce_phase(list(range(world_size)), 0, count, flat("send"), flat("recv"))
    return make_schedule("ring", "all_reduce", world_size, count, None, steps)


def reduce_scatter(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """n − 1 steps; partial sums travel in tmp (laid out like send), block r lands in recv."""
    check_args("reduce_scatter", world_size, count)
    if (t := _trivial("reduce_scatter", world_size, count, None)) is not None:
        return t
    n, c = world_size, count
    acc = window(lambda r: r * c, lambda r: (r + 1) * c, flat("recv", lambda r: r * c), flat("tmp"))
    steps = reduce_scatter_phase(list(range(n)), [r * c for r in range(n + 1)], flat("send"), acc)
    return make_schedule("ring", "reduce_scatter", n, c, None, steps)


def all_gather(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """n − 1 steps; in step s rank r receives block (r − 1 − s) mod n from the left."""
    check_args("all_gather", world_size, count)
    if (t := _trivial("all_gather", world_size, count, None)) is not None:
        return t
    n, c = world_size, count
    steps = all_gather_phase(list(range(n)), [r * c for r in range(n + 1)],
                             flat("send", lambda r: r * c), flat("recv"))
    return make_schedule("ring", "all_gather", n, c, None, steps)


def broadcast(world_size: int, count: int, *, root=None, ranks_per_node=None,
              segments: int | None = None) -> Schedule:
    """Pipelined chain from the root to the right, over the single buffer "recv"."""
    check_args("broadcast", world_size, count, root)
    steps = broadcast_phase(list(range(world_size)), root, 0, count, flat("recv"), segments)
    return make_schedule("ring", "broadcast", world_size, count, root, steps)


def reduce(world_size: int, count: int, *, root=None, ranks_per_node=None,
           segments: int | None = None) -> Schedule:
    """Pipelined chain ending at the root; non-roots accumulate in tmp."""
    check_args("reduce", world_size, count, root)
    if (t := _trivial("reduce", world_size, count, root)) is not None:
        return t
    acc = by_rank(lambda r: flat("recv") if r == root else flat("tmp"))
    steps = reduce_phase(list(range(world_size)), root, 0, count, flat("send"), acc, segments)
    return make_schedule("ring", "reduce", world_size, count, root, steps)


def scatter(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """n − 1 steps, farthest block first; blocks in transit wait in tmp."""
    check_args("scatter", world_size, count, root)
    if (t := _trivial("scatter", world_size, count, root)) is not None:
        return t
    n, c = world_size, count
    acc = window(lambda r: r * c, lambda r: (r + 1) * c, flat("recv", lambda r: r * c), flat("tmp"))
    steps = scatter_phase(list(range(n)), root, [r * c for r in range(n + 1)], flat("send"), acc)
    return make_schedule("ring", "scatter", n, c, root, steps)


def barrier(world_size: int, count: int = 0, *, root=None, ranks_per_node=None) -> Schedule:
    check_args("barrier", world_size, 0)
    return make_schedule("ring", "barrier", world_size, 0, None, barrier_phase(list(range(world_size))))
