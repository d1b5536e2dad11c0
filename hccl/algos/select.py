"""Algorithm choice: ``HCCL_ALGO`` parsing, the automatic selection, and ``build`` — the single
entry point from (collective, algorithm, world size, count) to a Schedule.

``HCCL_ALGO`` is parsed as CANN parses it: spaces are dropped; globally ``"level0:NA;level1:H-D_R"`` or per
operator ``"allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R"`` (operators broadcast,
allreduce, reduce, send, receive, allgather, reducescatter, alltoall, gather, scatter, sendrecv and
``others``; npusim also takes ``other``), never both; levels level0..level3, each at most once; algorithm
names as CANN spells them (case matters): NA, null, ring, H-D_R, fullmesh, pipeline, pairwise, NHR, NHR_V1,
NB, AHC, AHC_BROKE. A later setting of the same operator wins, as in CANN. Anything else is refused with
``HCCL_E_PARA`` (``EI0001``, naming the bad part). An empty value means automatic selection.

What the names run here: level0 (inside a node) NA = automatic, fullmesh = the one-shot mesh, ring = ring,
H-D_R = recursive halving-doubling; level1 (across nodes) ring and H-D_R as named, fullmesh = one mesh over
every rank; the other real names map to the closest implemented algorithm and the choice says so in
``params["note"]``. Level1 only matters for a communicator spanning several nodes (``level0:NA;level1:fullmesh``
on one node is the automatic choice); level2/level3 (SuperPoDs) are accepted and have nothing to choose here.
"""

from __future__ import annotations

import functools


from ..errors import HcclError
from ..types import HcclResult, hccl_np_dtype
from . import hd, hierarchical, mesh, ring
from .schedule import OPS, Schedule

ALGORITHMS = {"mesh": mesh, "ring": ring, "hd": hd, "hierarchical": hierarchical}

# Per collective, the largest message (bytes) one full-mesh node runs as the one-shot mesh; above it, the
# bandwidth-optimal ring. None by default: measured on the 2-core laptop (docs/performance.md), mesh wins at
# every size (16 MiB all_reduce: mesh 1.41 GB/s busbw, ring 0.73). A config's [hccl] ring_threshold_bytes sets
# one for all_reduce, all_gather and reduce_scatter (the card's HCCL extension passes it as ``thresholds``).
DEFAULT_THRESHOLDS: dict[str, int] = {}

# The collectives whose one-node mesh schedule pushes (``mesh.push_broadcast_phase``) when a card or a rank's
# process runs it (``for_call``); ``build`` and ``choose`` alone give the pull schedules.
PUSH_OPS = ("broadcast", "all_gather")

# Collective names as callers spell them → ours.
_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
          "alltoall": "all_to_all", "alltoallv": "all_to_all_v", "alltoallvc": "all_to_all_v"}
# HCCL_ALGO operator keys (CANN's, exact case) → the collectives they configure; "other" (npusim's spelling
# of CANN's "others") covers every collective not named. p2p and gather have no algorithm to choose here.
_OP_KEYS = {"broadcast": ("broadcast",), "allreduce": ("all_reduce",), "reduce": ("reduce",),
            "allgather": ("all_gather",), "reducescatter": ("reduce_scatter",), "scatter": ("scatter",),
            "alltoall": ("all_to_all", "all_to_all_v"), "gather": ("gather",), "send": ("p2p",),
            "receive": ("p2p",), "sendrecv": ("p2p",), "others": ("other",), "other": ("other",)}
_LEVELS = ("level0", "level1", "level2", "level3")
_ALGOS = ("NA", "null", "ring", "H-D_R", "fullmesh", "pipeline", "pairwise", "NHR", "NHR_V1", "NB", "AHC",
          "AHC_BROKE")
_EXPECT = "level0:NA;level1:<algo> or <op0>=level0:NA;level1:<algo0>/<op1>=level0:NA;level1:<algo1>"
# Real name → (implemented algorithm, note when it is a stand-in); None = automatic.
_IMPL = {"NA": (None, None), "null": (None, None), "ring": ("ring", None), "H-D_R": ("hd", None),
         "fullmesh": ("mesh", None),
         "NHR": ("hd", "NHR is not implemented; using H-D_R (also log-step)"),
         "NHR_V1": ("hd", "NHR_V1 is not implemented; using H-D_R"),
         "NB": ("hd", "NB is not implemented; using H-D_R (also log-step)"),
         "AHC": ("hd", "AHC is not implemented; using H-D_R"),
         "AHC_BROKE": ("hd", "AHC_BROKE is not implemented; using H-D_R"),
         "pipeline": ("ring", "pipeline is not implemented; using ring"),
         "pairwise": ("mesh", "pairwise applies to all_to_all only; using the direct mesh exchange")}


def _bad(text: str, part: str, why: str) -> HcclError:
    return HcclError(HcclResult.HCCL_E_PARA, f"EI0001 HCCL_ALGO={text!r} is invalid: bad part {part!r}: {why} "
                                             f"(expected {_EXPECT})")


def _levels(text: str, body: str) -> dict[str, str]:
    """``levelN:<algo>;...`` → {"levelN": algo}, refusing what CANN's parser refuses."""
    items = body.split(";")
    if len(items) > len(_LEVELS):
        raise _bad(text, body, f"more than {len(_LEVELS)} levels")
    levels: dict[str, str] = {}
    for item in items:
        level, sep, value = item.partition(":")
        if not item or not sep or not level or not value:
            raise _bad(text, item, "expected levelN:<algo>")
        if level not in _LEVELS:
            raise _bad(text, item, f"unknown level {level!r} (expected one of {list(_LEVELS)})")
        if value not in _ALGOS:
            raise _bad(text, item, f"unknown algorithm {value!r} (expected one of {list(_ALGOS)})")
        if level in levels:
            raise _bad(text, item, f"{level} given twice")
        levels[level] = value
    return levels


def parse_hccl_algo(text: str) -> dict[str, dict[str, str]]:
    """Parse HCCL_ALGO into {collective or "all" or "other": {"level0": ..., "level1": ..., ...}}
    ({} for an empty value: automatic selection)."""
    if not isinstance(text, str):
        raise HcclError(HcclResult.HCCL_E_PARA, f"HCCL_ALGO must be a string, got {text!r}")
    value = text.replace(" ", "")
    if not value:
        return {}
    blocks = value.split("/")
    specific = ["=" in b for b in blocks]
    if any(specific) and not all(specific):
        raise _bad(text, text, "mixes a global setting with per-operator settings")
    if not any(specific) and len(blocks) > 1:
        raise _bad(text, text, "the global setting is given twice")
    out: dict[str, dict[str, str]] = {}
    for block in blocks:
        if not any(specific):
            out["all"] = _levels(text, block)
            continue
        name, _, body = block.partition("=")
        if not name or not body:
            raise _bad(text, block, "expected <op>=levelN:<algo>;...")
        if name not in _OP_KEYS:
            raise _bad(text, block, f"unknown operator {name!r} (expected one of {sorted(_OP_KEYS)})")
        levels = _levels(text, body)
        if levels.get("level0") == "null":
            raise _bad(text, block, "a per-operator setting cannot make level0 null")
        for op in _OP_KEYS[name]:
            out[op] = levels                      # a later setting of the same operator wins, as in CANN
    return out


def _normalize_op(op: str) -> str:
    key = op.lower().replace("_", "")
    name = _NAMES.get(key, key if key in OPS else op)
    if name not in OPS:
        raise HcclError(HcclResult.HCCL_E_PARA, f"unknown collective {op!r} (expected one of {list(OPS)})")
    return name


def supports(algo: str, op: str) -> bool:
    """Whether ``algo`` has a schedule for collective ``op``."""
    return algo in ALGORITHMS and hasattr(ALGORITHMS[algo], _normalize_op(op))


def choose(op: str, world_size: int, nbytes: int, *, nodes: int = 1, topology: str = "fullmesh",
           hccl_algo=None, thresholds: dict | None = None) -> tuple[str, dict]:
    """Pick (algo, params) for a collective; params feed ``build`` (plus "reason"/"note" text).

    One node: mesh up to the size threshold, ring above it for all_reduce/all_gather/reduce_scatter
    (a "2x4" node runs hierarchically over its two HCCS groups). Several nodes: hierarchical with
    level1 H-D_R when the node count is a power of two, else ring (as CANN on Atlas training).
    ``hccl_algo`` (text or parsed dict) overrides; an algorithm lacking the collective falls back
    to mesh and says so.
    """
    op = _normalize_op(op)
    thresholds = DEFAULT_THRESHOLDS if thresholds is None else thresholds
    if nodes < 1 or world_size % nodes:
        raise HcclError(HcclResult.HCCL_E_PARA,
                        f"choose({op}): world_size {world_size} is not a multiple of nodes={nodes}")
    per_node = world_size // nodes
    cfg = parse_hccl_algo(hccl_algo) if isinstance(hccl_algo, str) else (hccl_algo or {})
    levels = cfg.get(op) or cfg.get("all") or cfg.get("other") or {}
    level0, level1 = levels.get("level0", "NA"), levels.get("level1", "NA")
    impl0, note0 = _IMPL[level0]
    impl1, note1 = _IMPL[level1]
    notes = []

    if nodes > 1 and per_node > 0:
        if impl1 is None:
            pow2 = nodes & (nodes - 1) == 0
            impl1 = "hd" if pow2 else "ring"
            reason = f"{nodes} nodes ({'a' if pow2 else 'not a'} power of two) → level1 {impl1}"
        else:
            reason = f"HCCL_ALGO level1:{level1}"
            notes += [note1] if note1 else []
        if impl0 not in (None, "mesh"):
            notes.append(f"level0 {level0} is not implemented for hierarchical algorithms; using fullmesh")
        if impl1 == "mesh":
            algo, params = "mesh", {}
            reason += " → one mesh over every rank"
        else:
            algo, params = "hierarchical", {"ranks_per_node": per_node, "level1": impl1}
    else:
        threshold = thresholds.get(op)
        if impl0 is not None:
            algo, params, reason = impl0, {}, f"HCCL_ALGO level0:{level0}"
            notes += [note0] if note0 else []
        elif topology == "2x4" and world_size > 4 and world_size % 4 == 0:
            groups = world_size // 4
            algo = "hierarchical"
            params = {"ranks_per_node": 4, "level1": "hd" if groups & (groups - 1) == 0 else "ring"}
            reason = "2x4 topology: mesh inside each HCCS group of 4, level1 across groups (PCIe)"
        elif topology == "2x4" and world_size > 4:
            algo, params, reason = "ring", {}, "2x4 topology without whole groups of 4: ring"
        elif threshold is not None and nbytes > threshold:
            algo, params, reason = "ring", {}, f"{nbytes} bytes > mesh threshold {threshold} for {op}"
        else:
            algo, params, reason = "mesh", {}, "one node, full mesh, one-shot"
    if not supports(algo, op):
        reason = f"{algo} has no {op}; falling back to the direct mesh exchange"
        algo, params = "mesh", {}
    params["reason"] = reason
    if notes:
        params["note"] = "; ".join(notes)
    return algo, params


def build(op: str, algo: str, world_size: int, count: int, **kw) -> Schedule:
    """The schedule of collective ``op`` by algorithm ``algo`` (mesh, ring, hd or H-D_R,
    hierarchical); ``kw`` takes root, ranks_per_node and level1.
    Text-only keys of ``choose``'s params (reason, note) are ignored."""
    op = _normalize_op(op)
    algo = {"H-D_R": "hd", "fullmesh": "mesh"}.get(algo, algo)
    if algo not in ALGORITHMS:
        raise HcclError(HcclResult.HCCL_E_PARA,
                        f"build({op}): unknown algorithm {algo!r} (expected one of {sorted(ALGORITHMS)})")
    if not supports(algo, op):
        have = [o for o in OPS if hasattr(ALGORITHMS[algo], o)]
        raise HcclError(HcclResult.HCCL_E_NOT_SUPPORT,
                        f"build: algorithm {algo} has no {op} (it implements {have}); use choose() to fall back")
    kw = {k: v for k, v in kw.items() if k not in ("reason", "note")}
    if algo != "hierarchical":
        kw.pop("level1", None)
    return _build_cached(op, algo, world_size, count, tuple(sorted(kw.items())))


@functools.lru_cache(maxsize=512)
def _build_cached(op: str, algo: str, world_size: int, count: int, kw: tuple) -> Schedule:
    # Schedules are immutable, so a communicator repeating a collective reuses the same one.
    return getattr(ALGORITHMS[algo], op)(world_size, count, **dict(kw))


def for_call(op: str, n: int, p: dict, nodes: int, topology: str, ring_threshold: int) -> Schedule:
    """The schedule of collective ``op`` (any but all_to_all_v) with a call's parameters ``p`` (count, dtype,
    root, algo) on ``n`` ranks over ``nodes`` nodes, under a card's ``topology`` and ``ring_threshold_bytes``:
    what a card runs, and what the rank's own process runs in its place (``hccl/hostsched.py``) — one choice."""
    nbytes = p["count"] * hccl_np_dtype(p["dtype"]).itemsize
    return _for_call(op, n, p["count"], p.get("root"), p.get("algo") or "", nodes, nbytes, topology, ring_threshold)


@functools.lru_cache(maxsize=256)
def _for_call(op, n, count, root, algo_text, nodes, nbytes, topology, ring_threshold):
    thresholds = {k: ring_threshold for k in ("all_reduce", "all_gather", "reduce_scatter")} if ring_threshold else {}
    algo, params = choose(op, n, nbytes, nodes=nodes, topology=topology, hccl_algo=algo_text or None,
                          thresholds=thresholds)
    kw = dict(params)
    if root is not None:
        kw["root"] = root
    if nodes == 1 and algo in ("mesh", "fullmesh") and _normalize_op(op) in PUSH_OPS:
        kw["push"] = True         # every rank maps every peer's memory: one rank reads a chunk once for all
    return build(op, algo, n, count, **kw)
