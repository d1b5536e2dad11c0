"""Recursive halving-doubling (HCCL_ALGO ``H-D_R``) and binomial trees.

For p = 2^k ranks, all_reduce runs k reduce-scatter steps by recursive *halving* — in step j a
rank exchanges with the partner whose virtual rank differs in bit k − 1 − j, keeps the half of
its current range that bit selects and reduces the partner's copy of that half into its own — and
then k all-gather steps by recursive *doubling* in the reverse bit order: 2·log2 p steps, each
moving half of the previous amount (cost 2 log p·α + 2(p−1)nβ/p + (p−1)nγ/p).

For a non-power of two n, with p = 2^⌊log2 n⌋ and r = n − p, the first 2r ranks are folded in
pairs: the odd member pulls and reduces the even member's data, the evens sit out, HD runs on the
p survivors (virtual rank v is member 2v + 1 for v < r and member v + r after), and a final step
unfolds the result back to the evens: two extra steps.

reduce_scatter and all_gather use the same halving / doubling with the chunks of folded pairs
merged (a pair owns two adjacent blocks). broadcast and reduce are binomial trees (⌈log2 n⌉
steps, full vector per step); scatter is a binomial tree that halves the data per step.
"""

from __future__ import annotations

from typing import Sequence

from .schedule import (Layout, Schedule, Steps, by_rank, check_args, chunk_bounds, flat,
                       make_schedule, move, signal, window)


def _fold(g: int) -> tuple[int, int, list[int]]:
    """(p, r, members): the power of two, the number of folded pairs, virtual rank → member."""
    p = 1 << (g.bit_length() - 1)
    r = g - p
    return p, r, [2 * v + 1 if v < r else v + r for v in range(p)]


def _halving(members: Sequence[int], chunks: Sequence[int], cur: list[Layout], init: Layout,
             acc: Layout) -> Steps:
    """Recursive-halving reduce-scatter among ``members`` (power of two): virtual rank v ends with
    [chunks[v], chunks[v+1]) reduced, in ``acc``. ``cur[v]`` says where v's data is now (init or
    acc); a rank still reading ``init`` first copies its kept half into ``acc``."""
    p = len(members)
    lo_idx = [0] * p
    hi_idx = [p] * p
    steps = []
    bit = p >> 1
    while bit:
        step = []
        for v, me in enumerate(members):
            partner = v ^ bit
            mid = (lo_idx[v] + hi_idx[v]) // 2
            if v & bit:
                lo_idx[v] = mid
            else:
                hi_idx[v] = mid
            a, b = chunks[lo_idx[v]], chunks[hi_idx[v]]
            if cur[v] is not acc:
                step += move(me, cur[v], me, acc, a, b, reduce=False)
            step += move(members[partner], cur[partner], me, acc, a, b, reduce=True)
        cur[:] = [acc] * p
        steps.append(step)
        bit >>= 1
    return steps


def _doubling(members: Sequence[int], chunks: Sequence[int], cur: list[Layout], acc: Layout) -> Steps:
    """Recursive-doubling all-gather: virtual rank v starts with chunk v at ``cur[v]`` and everyone
    ends with [chunks[0], chunks[p]) in ``acc``."""
    p = len(members)
    steps = []
    bit = 1
    while bit < p:
        step = []
        for v, me in enumerate(members):
            partner = v ^ bit
            if bit == 1 and cur[v] is not acc:
                step += move(me, cur[v], me, acc, chunks[v], chunks[v + 1], reduce=False)
            base = partner & ~(bit - 1)  # the partner holds chunks [base, base + bit)
            step += move(members[partner], cur[partner], me, acc, chunks[base], chunks[base + bit],
                         reduce=False)
        cur[:] = [acc] * p
        steps.append(step)
        bit <<= 1
    return steps


def all_reduce_phase(group: Sequence[int], lo: int, hi: int, init: Layout, acc: Layout) -> Steps:
    g = len(group)
    p, r, virt = _fold(g)
    members = [group[m] for m in virt]
    cur = [acc if v < r else init for v in range(p)]
    fold = [t for i in range(r) for t in
            move(group[2 * i + 1], init, group[2 * i + 1], acc, lo, hi, False)
            + move(group[2 * i], init, group[2 * i + 1], acc, lo, hi, True)]
    chunks = chunk_bounds(lo, hi, p)
    steps = [fold] + _halving(members, chunks, cur, init, acc) + _doubling(members, chunks, cur, acc)
    unfold = [t for i in range(r) for t in move(group[2 * i + 1], acc, group[2 * i], acc, lo, hi, False)]
    return [s for s in steps + [unfold] if s]


def _pair_chunks(bounds: Sequence[int], p: int, r: int) -> list[int]:
    """Virtual chunk boundaries: a folded pair v < r owns member chunks 2v and 2v + 1."""
    return [bounds[2 * v] if v < r else bounds[v + r] for v in range(p)] + [bounds[-1]]


def reduce_scatter_phase(group: Sequence[int], bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member i ends with chunk i reduced over the group in ``acc``."""
    g = len(group)
    p, r, virt = _fold(g)
    lo, hi = bounds[0], bounds[-1]
    fold = [t for i in range(r) for t in
            move(group[2 * i + 1], init, group[2 * i + 1], acc, lo, hi, False)
            + move(group[2 * i], init, group[2 * i + 1], acc, lo, hi, True)]
    cur = [acc if v < r else init for v in range(p)]
    halving = _halving([group[m] for m in virt], _pair_chunks(bounds, p, r), cur, init, acc)
    unfold = [t for i in range(r) for t in
              move(group[2 * i + 1], acc, group[2 * i], acc, bounds[2 * i], bounds[2 * i + 1], False)]
    return [s for s in [fold] + halving + [unfold] if s]


def all_gather_phase(group: Sequence[int], bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Member i starts with chunk i in ``init``; everyone ends with every chunk in ``acc``."""
    g = len(group)
    p, r, virt = _fold(g)
    fold = [t for i in range(r) for t in
            move(group[2 * i + 1], init, group[2 * i + 1], acc, bounds[2 * i + 1], bounds[2 * i + 2], False)
            + move(group[2 * i], init, group[2 * i + 1], acc, bounds[2 * i], bounds[2 * i + 1], False)]
    cur = [acc if v < r else init for v in range(p)]
    doubling = _doubling([group[m] for m in virt], _pair_chunks(bounds, p, r), cur, acc)
    unfold = [t for i in range(r) for t in
              move(group[2 * i + 1], acc, group[2 * i], acc, bounds[0], bounds[-1], False)]
    return [s for s in [fold] + doubling + [unfold] if s]


def broadcast_phase(group: Sequence[int], root: int, lo: int, hi: int, buf: Layout) -> Steps:
    """Binomial tree: in step k the members 2^k..2^(k+1)−1 places right of the root pull from the
    member 2^k places left of them, which already has the data."""
    g = len(group)
    steps = []
    bit = 1
    while bit < g:
        steps.append([t for rel in range(bit, min(2 * bit, g)) for t in
                      move(group[(root + rel - bit) % g], buf, group[(root + rel) % g], buf, lo, hi, False)])
        bit <<= 1
    return steps


def reduce_phase(group: Sequence[int], root: int, lo: int, hi: int, init: Layout, acc: Layout) -> Steps:
    """Binomial tree: in step k a member at relative position rel ≡ 0 (mod 2^(k+1)) reduces the
    partial of the member at rel + 2^k into its own; the root ends with the result in ``acc``."""
    g = len(group)
    has_acc = [False] * g  # by relative position: has this member's partial moved to acc yet?
    steps = []
    bit = 1
    while bit < g:
        step = []
        for rel in range(0, g - bit, 2 * bit):
            me, child = group[(root + rel) % g], group[(root + rel + bit) % g]
            if not has_acc[rel]:
                step += move(me, init, me, acc, lo, hi, reduce=False)
                has_acc[rel] = True
            step += move(child, acc if has_acc[rel + bit] else init, me, acc, lo, hi, reduce=True)
        steps.append(step)
        bit <<= 1
    return steps


def scatter_phase(group: Sequence[int], root: int, bounds: Sequence[int], init: Layout, acc: Layout) -> Steps:
    """Binomial scatter: the member at rel ≡ 0 (mod 2^(k+1)) hands the blocks of rel + 2^k ..
    rel + 2^(k+1) − 1 to member rel + 2^k, largest subtree first; blocks in transit live in acc."""
    g = len(group)
    steps = []
    own = move(group[root], init, group[root], acc, bounds[root], bounds[root + 1], False)
    bit = 1 << (g - 1).bit_length() >> 1  # the largest power of two below g (0 for g == 1)
    while bit:
        step = []
        for rel in range(0, g - bit, 2 * bit):
            parent, child = group[(root + rel) % g], group[(root + rel + bit) % g]
            for sub in range(rel + bit, min(rel + 2 * bit, g)):
                m = (root + sub) % g
                step += move(parent, init if rel == 0 else acc, child, acc, bounds[m], bounds[m + 1], False)
        steps.append(step)
        bit >>= 1
    if steps:
        steps[0] = own + steps[0]
    else:
        steps = [own]
    return steps


def barrier_phase(group: Sequence[int]) -> Steps:
    """Dissemination barrier: in step k member i hears from member i − 2^k; ⌈log2 g⌉ steps."""
    g = len(group)
    steps = []
    bit = 1
    while bit < g:
        steps.append([signal(group[(i - bit) % g], me) for i, me in enumerate(group)])
        bit <<= 1
    return steps


# ----------------------------------------------------------------------------------------------
# Public schedules

def all_reduce(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """2·log2 n steps for powers of two, 2 more (fold, unfold) otherwise."""
    check_args("all_reduce", world_size, count)
    if world_size == 1:
        local = move(0, flat("send"), 0, flat("recv"), 0, count, False)
        return make_schedule("hd", "all_reduce", 1, count, None, [local])
    steps = all_reduce_phase(list(range(world_size)), 0, count, flat("send"), flat("recv"))
    return make_schedule("hd", "all_reduce", world_size, count, None, steps)


def reduce_scatter(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """log2 n halving steps (+ fold/unfold); partials in tmp laid out like send."""
    check_args("reduce_scatter", world_size, count)
    n, c = world_size, count
    acc = window(lambda r: r * c, lambda r: (r + 1) * c, flat("recv", lambda r: r * c), flat("tmp"))
    if n == 1:
        return make_schedule("hd", "reduce_scatter", 1, c, None, [move(0, flat("send"), 0, acc, 0, c, False)])
    steps = reduce_scatter_phase(list(range(n)), [r * c for r in range(n + 1)], flat("send"), acc)
    return make_schedule("hd", "reduce_scatter", n, c, None, steps)


def all_gather(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """log2 n doubling steps (+ fold/unfold)."""
    check_args("all_gather", world_size, count)
    n, c = world_size, count
    init = flat("send", lambda r: r * c)
    if n == 1:
        return make_schedule("hd", "all_gather", 1, c, None, [move(0, init, 0, flat("recv"), 0, c, False)])
    steps = all_gather_phase(list(range(n)), [r * c for r in range(n + 1)], init, flat("recv"))
    return make_schedule("hd", "all_gather", n, c, None, steps)


def broadcast(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """Binomial tree, ⌈log2 n⌉ steps."""
    check_args("broadcast", world_size, count, root)
    steps = broadcast_phase(list(range(world_size)), root, 0, count, flat("recv"))
    return make_schedule("hd", "broadcast", world_size, count, root, steps)


def reduce(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """Binomial tree, ⌈log2 n⌉ steps; non-roots accumulate in tmp."""
    check_args("reduce", world_size, count, root)
    acc = by_rank(lambda r: flat("recv") if r == root else flat("tmp"))
    if world_size == 1:
        return make_schedule("hd", "reduce", 1, count, root, [move(0, flat("send"), 0, acc, 0, count, False)])
    steps = reduce_phase(list(range(world_size)), root, 0, count, flat("send"), acc)
    return make_schedule("hd", "reduce", world_size, count, root, steps)


def scatter(world_size: int, count: int, *, root=None, ranks_per_node=None) -> Schedule:
    """Binomial tree, ⌈log2 n⌉ steps; blocks in transit wait in tmp."""
    check_args("scatter", world_size, count, root)
    n, c = world_size, count
    acc = window(lambda r: r * c, lambda r: (r + 1) * c, flat("recv", lambda r: r * c), flat("tmp"))
    steps = scatter_phase(list(range(n)), root, [r * c for r in range(n + 1)], flat("send"), acc)
    return make_schedule("hd", "scatter", n, c, root, steps)


def barrier(world_size: int, count: int = 0, *, root=None, ranks_per_node=None) -> Schedule:
    check_args("barrier", world_size, 0)
    return make_schedule("hd", "barrier", world_size, 0, None, barrier_phase(list(range(world_size))))
