"""Which collectives take the one-round staged path (``hccl.protocol.staged.fits_stage``), on one node and across
nodes, at the world sizes of large jobs: a reduction of up to 256 KiB a rank in one round at any size, a gather
only while every rank's input fits one frame."""

from __future__ import annotations

import pytest

import hccl
from hccl.protocol.staged import HUB_STAGE_BYTES, STAGE_BYTES, fits_stage

FP32 = hccl.HCCL_DATA_TYPE_FP32


def params(nbytes: int, **extra) -> dict:
    return {"count": nbytes // 4, "dtype": FP32, **extra}


@pytest.mark.parametrize("n", [8, 64, 256, 1024])
@pytest.mark.parametrize("op", ["all_reduce", "reduce", "broadcast"])
def test_a_rank_sized_collective_up_to_the_stage_takes_one_round_across_nodes_at_any_world(op, n):
    assert fits_stage(op, params(STAGE_BYTES, root=0), n, across_nodes=True)
    assert fits_stage(op, params(104_488, root=0), n, across_nodes=True)         # a DDP gradient bucket
    assert not fits_stage(op, params(STAGE_BYTES + 4, root=0), n, across_nodes=True)
    assert not fits_stage(op, params(STAGE_BYTES + 4, root=0), n)


@pytest.mark.parametrize("n", [16, 64])
def test_gathers_across_nodes_fit_only_while_every_input_fits_one_frame(n):
    per_rank = HUB_STAGE_BYTES // n
    assert fits_stage("all_gather", params(per_rank), n, across_nodes=True)
    assert not fits_stage("all_gather", params(per_rank + 4), n, across_nodes=True)
    assert fits_stage("all_gather", params(per_rank + 4), n)                   # one node: the rank's stage only
    # all_to_all stages n blocks a rank; across nodes the frame holds every rank's n blocks
    block = HUB_STAGE_BYTES // (n * n)
    assert fits_stage("all_to_all", params(block), n, across_nodes=True)
    assert not fits_stage("all_to_all", params(block + 4), n, across_nodes=True)


def test_reduce_scatter_and_scatter_stage_their_whole_input():
    n = 64
    block = STAGE_BYTES // n
    for op in ("reduce_scatter", "scatter"):
        assert fits_stage(op, params(block, root=0), n, across_nodes=True)
        assert not fits_stage(op, params(block + 4, root=0), n, across_nodes=True)


def test_an_algorithm_asked_for_or_an_unstaged_op_never_takes_the_staged_path():
    assert not fits_stage("all_reduce", params(1024, algo="level0:ring"), 8, across_nodes=True)
    assert not fits_stage("all_to_all_v", params(1024), 8)
    assert fits_stage("barrier", params(0), 1024, across_nodes=True)
