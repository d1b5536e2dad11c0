"""Algorithm choice: ``HCCL_ALGO`` parsing, the automatic selection, and ``build`` — the single
entry point from (collective, algorithm, world size, count) to a Schedule.

``HCCL_ALGO`` has the real syntax, globally ``"level0:NA;level1:H-D_R"`` or per operator
``"allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R"`` (``other=`` covers the
operators not named). Level1 values implemented here are ``ring`` and ``H-D_R``; the other real
names (NHR, NHR_V1, NB, AHC, pipeline, pairwise) are accepted and mapped to the closest
implemented algorithm, and the choice says so in ``params["note"]``. Level0 accepts NA (automatic),
fullmesh and ring.
"""

from __future__ import annotations

import functools


from ..errors import HcclError
from ..types import HcclResult
from . import hd, hierarchical, mesh, ring
from .schedule import OPS, Schedule

ALGORITHMS = {"mesh": mesh, "ring": ring, "hd": hd, "hierarchical": hierarchical}

# Per collective, the largest message (bytes) one full-mesh node runs as the one-shot mesh; above it, the
# bandwidth-optimal ring. None by default: measured on the 2-core laptop (docs/performance.md), mesh wins at
# every size (16 MiB all_reduce: mesh 1.41 GB/s busbw, ring 0.73). A config's [hccl] ring_threshold_bytes sets
# one for all_reduce, all_gather and reduce_scatter (the card's HCCL extension passes it as ``thresholds``).
DEFAULT_THRESHOLDS: dict[str, int] = {}

# HCCL_ALGO operator keys → our collective names ("other" = every collective not named).
_OP_KEYS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "broadcast": "broadcast", "reduce": "reduce", "scatter": "scatter",
            "alltoall": "all_to_all", "alltoallv": "all_to_all_v", "alltoallvc": "all_to_all_v",
            "barrier": "barrier", "other": "other"}
_LEVEL0 = {"na": "NA", "fullmesh": "fullmesh", "ring": "ring"}
_LEVEL1 = {"na": "NA", "ring": "ring", "h-d_r": "H-D_R", "nhr": "NHR", "nhr_v1": "NHR_V1", "nb": "NB",
           "ahc": "AHC", "pipeline": "pipeline", "pairwise": "pairwise"}
# Real level1 name → (implemented level1, note when it is a stand-in).
_LEVEL1_IMPL = {"ring": ("ring", None), "H-D_R": ("hd", None),
                "NHR": ("hd", "NHR is not implemented; using H-D_R (also log-step)"),
                "NHR_V1": ("hd", "NHR_V1 is not implemented; using H-D_R"),
                "NB": ("hd", "NB is not implemented; using H-D_R (also log-step)"),
                "AHC": ("hd", "AHC is not implemented; using H-D_R"),
                "pipeline": ("ring", "pipeline is not implemented; using ring"),
                "pairwise": (None, "pairwise applies to all_to_all only; using the direct mesh exchange")}


def _bad(text: str, part: str, why: str) -> HcclError:
    return HcclError(HcclResult.HCCL_E_PARA, f"HCCL_ALGO={text!r}: bad part {part!r}: {why}")


def parse_hccl_algo(text: str) -> dict[str, dict[str, str]]:
    """Parse HCCL_ALGO into {collective or "all" or "other": {"level0": ..., "level1": ..., ...}}."""
    if not isinstance(text, str) or not text.strip():
        raise HcclError(HcclResult.HCCL_E_PARA, f"HCCL_ALGO must be a non-empty string, got {text!r}")
    out: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for block in text.strip().split("/"):
        key = "all"
        body = block.strip()
        if "=" in body:
            name, body = (x.strip() for x in body.split("=", 1))
            if name.lower() not in _OP_KEYS:
                raise _bad(text, block, f"unknown operator {name!r} (expected one of {sorted(_OP_KEYS)})")
            key = _OP_KEYS[name.lower()]
            if name.lower() in seen:
                raise _bad(text, block, f"operator {name} configured twice")
            seen.add(name.lower())
        elif key in out:
            raise _bad(text, block, "the global setting is given twice")
        levels: dict[str, str] = {}
        for item in body.split(";"):
            item = item.strip()
            if not item:
                continue
            level, sep, value = (x.strip() for x in item.partition(":"))
            table = {"level0": _LEVEL0, "level1": _LEVEL1, "level2": _LEVEL1}.get(level.lower())
            if not sep or table is None:
                raise _bad(text, item, "expected levelN:<algo> with N in 0, 1, 2")
            if value.lower() not in table:
                raise _bad(text, item, f"unknown {level} algorithm {value!r} "
                                       f"(expected one of {sorted(set(table.values()))})")
            if level.lower() in levels:
                raise _bad(text, item, f"{level} given twice")
            levels[level.lower()] = table[value.lower()]
        if not levels:
            raise _bad(text, block, "no levelN:<algo> entries")
        out[key] = levels
    if "all" in out and len(out) > 1:
        raise _bad(text, text, "mixes a global setting with per-operator settings")
    return out


def _normalize_op(op: str) -> str:
    key = op.lower().replace("_", "")
    name = _OP_KEYS.get(key, op)
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
    notes = []

    if nodes > 1 and per_node > 0:
        if level1 == "NA":
            pow2 = nodes & (nodes - 1) == 0
            impl = "hd" if pow2 else "ring"
            reason = f"{nodes} nodes ({'a' if pow2 else 'not a'} power of two) → level1 {impl}"
        else:
            impl, note = _LEVEL1_IMPL[level1]
            reason = f"HCCL_ALGO level1:{level1}"
            if note:
                notes.append(note)
        if level0 == "ring":
            notes.append("level0 ring is not implemented for hierarchical algorithms; using fullmesh")
        algo, params = "hierarchical", {"ranks_per_node": per_node, "level1": impl or "ring"}
        if impl is None:
            algo, params = "mesh", {}
    else:
        threshold = thresholds.get(op)
        if level0 == "ring":
            algo, params, reason = "ring", {}, "HCCL_ALGO level0:ring"
        elif level0 == "fullmesh":
            algo, params, reason = "mesh", {}, "HCCL_ALGO level0:fullmesh"
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
