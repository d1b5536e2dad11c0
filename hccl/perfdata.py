"""What ``hccl-test`` measures and checks, as pure functions: the collectives and their size layouts, the
nccl-tests bus-bandwidth factors, size sweeps, and the numpy oracle (each rank's input and the exact output
every rank must hold)."""

from __future__ import annotations

import argparse

import numpy as np

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "scatter", "all_to_all",
               "send_recv", "barrier")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce", "scatter")
BLOCKED = ("all_gather", "reduce_scatter", "scatter", "all_to_all")   # size = per-rank block × ranks
NO_OUT_OF_PLACE = ("broadcast",)
NO_IN_PLACE = ("all_to_all", "send_recv", "barrier")
NCCL_TYPE_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double"}
MAX_BYTES = 1 << 40      # a size bigger than any card's HBM; bounds what -b / -e / -i can ask for
MAX_SIZES = 4096         # sizes one run walks (nccl-tests' 1 byte .. 1 TiB by -f 2 is 41)
TIMING = "max over ranks of the per-rank median (enqueue + stream synchronize, host clock)"


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio for n ranks."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in BLOCKED:
        return (n - 1) / n
    return 1.0


def parse_size(text: str) -> int:
    """'1K' → 1024, '4M', '1G', '64MiB', '512' (bytes)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    mult = units.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in units else t
    try:
        value = float(digits) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text[:40]!r}: expected a number of bytes such as 512, 1K, 4M "
                                         "or 1G") from None
    # float() takes 'inf', 'nan' and '1e400' (= inf): none is a size, and int(inf) would raise OverflowError
    if not np.isfinite(value) or value < 0 or value > MAX_BYTES or value != int(value):
        raise argparse.ArgumentTypeError(f"size {text[:40]!r}: expected a whole number of bytes in 0..{MAX_BYTES} "
                                         "(1 TiB)")
    return int(value)


def sweep(minbytes: int, maxbytes: int, factor: int, step: int) -> list[int]:
    """Sizes as nccl-tests walks them: ×factor when given, else +step."""
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        if factor > 1:
            size = size * factor if size else 1
        else:
            size += step
    return sizes


def layout(collective: str, nbytes: int, n: int, isz: int) -> dict:
    """Element counts for one size: the HCCL count argument, send/recv buffer lengths, reported size."""
    if collective == "barrier":
        return {"count": 0, "send": 0, "recv": 0, "size": 0, "elements": 0}
    if collective in BLOCKED:
        per = nbytes // isz // n
        total = per * n
        send, recv = {"all_gather": (per, total), "reduce_scatter": (total, per),
                      "scatter": (total, per), "all_to_all": (total, total)}[collective]
        return {"count": per, "send": send, "recv": recv, "size": total * isz, "elements": total}
    count = nbytes // isz
    return {"count": count, "send": count, "recv": count, "size": count * isz, "elements": count}


# ---- the numpy oracle ----------------------------------------------------------------------------

PERIOD = {"prod": 2, "other": 13}


def reduce_input(k: np.ndarray, rank: int, op: str) -> np.ndarray:
    """Input of reducing collectives: small integers (≥ 1), exact in every dtype, so any summation order agrees."""
    if op == "prod":
        return (k + rank) % 2 + 1          # products of 1s and 2s stay ≤ 2^n
    return (k + 3 * rank) % 13 + 1


def move_input(k: np.ndarray, rank: int) -> np.ndarray:
    """Input of data-movement collectives: 1..101, different per rank and position (0 never occurs)."""
    return (7 * k + 31 * rank) % 101 + 1


def cast(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    """int64 values → dt, wrapping integers modulo 2^bits exactly as integer arithmetic on the card does."""
    if dt.kind in "iu":
        return values.astype(np.int64).astype(dt)
    return values.astype(np.float64).astype(dt)


def reduced_table(op: str, n: int) -> np.ndarray:
    """One period of the elementwise reduction over ranks, computed with numpy in int64."""
    period = PERIOD["prod" if op == "prod" else "other"]
    k = np.arange(period)
    stack = np.stack([reduce_input(k, r, op) for r in range(n)])
    return {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](stack, axis=0)


def rank_input(collective: str, rank: int, lay: dict, op: str) -> np.ndarray:
    """What this rank puts in its send buffer (int64, cast later)."""
    k = np.arange(lay["send"])
    return reduce_input(k, rank, op) if collective in REDUCING else move_input(k, rank)


def expected_output(collective: str, rank: int, n: int, lay: dict, op: str, root: int):
    """What this rank's recv buffer must hold (int64), or None where it is not defined."""
    per, r = lay["count"], rank
    if collective in REDUCING:
        table = reduced_table(op, n)
        if collective == "reduce" and rank != root:
            return None
        first = r * per if collective == "reduce_scatter" else 0
        return table[(first + np.arange(lay["recv"])) % len(table)]
    if collective == "broadcast":
        return move_input(np.arange(lay["recv"]), root)
    if collective == "scatter":
        return move_input(r * per + np.arange(per), root)
    idx = np.arange(lay["recv"])
    if collective == "all_gather":
        return move_input(idx % per, idx // per)
    if collective == "all_to_all":
        return move_input(r * per + idx % per, idx // per)
    if collective == "send_recv":
        return move_input(idx, (r - 1) % n)
    return None
