"""HCCL_ALGO parsing, automatic algorithm choice and the build entry point."""

import numpy as np
import pytest

from hccl.algos import buffer_sizes, build, choose, parse_hccl_algo, run_numpy, supports, validate
from hccl.errors import HcclError

HCCL_E_PARA, HCCL_E_NOT_SUPPORT = 1, 5


def test_parse_global():
    assert parse_hccl_algo("level0:NA;level1:H-D_R") == {"all": {"level0": "NA", "level1": "H-D_R"}}
    assert parse_hccl_algo(" level0:fullmesh ; level1:ring ; level2:NHR ") == {
        "all": {"level0": "fullmesh", "level1": "ring", "level2": "NHR"}}
    assert parse_hccl_algo("level0:NA;level1:fullmesh") == {"all": {"level0": "NA", "level1": "fullmesh"}}
    assert parse_hccl_algo("level3:ring") == {"all": {"level3": "ring"}}        # CANN knows four levels


@pytest.mark.parametrize("algo", ["NA", "null", "ring", "H-D_R", "fullmesh", "pipeline", "pairwise", "NHR",
                                  "NHR_V1", "NB", "AHC", "AHC_BROKE"])
def test_parse_takes_every_algorithm_cann_names(algo):
    assert parse_hccl_algo(f"level0:NA;level1:{algo}")["all"]["level1"] == algo


def test_parse_empty_means_automatic():
    assert parse_hccl_algo("") == parse_hccl_algo("   ") == {}


def test_parse_per_operator():
    parsed = parse_hccl_algo("allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R")
    assert parsed == {"all_reduce": {"level0": "NA", "level1": "ring"},
                      "all_gather": {"level0": "NA", "level1": "H-D_R"}}
    assert parse_hccl_algo("others=level0:NA;level1:NB")["other"] == {"level0": "NA", "level1": "NB"}
    assert parse_hccl_algo("other=level0:NA;level1:NB")["other"] == {"level0": "NA", "level1": "NB"}
    alltoall = parse_hccl_algo("alltoall=level0:NA;level1:pairwise")
    assert alltoall["all_to_all"] == alltoall["all_to_all_v"] == {"level0": "NA", "level1": "pairwise"}
    # a later setting of the same operator wins, as in CANN
    assert parse_hccl_algo("allreduce=level1:ring/allreduce=level1:H-D_R")["all_reduce"] == {"level1": "H-D_R"}
    for op in ("send", "receive", "sendrecv", "gather"):          # accepted; nothing to choose for them here
        parse_hccl_algo(f"{op}=level0:NA;level1:ring")


@pytest.mark.parametrize("text,bad_part", [
    ("level0:NA;level1:foo", "level1:foo"),
    ("level4:ring", "level4:ring"),
    ("level1ring", "level1ring"),
    ("level1:h-d_r", "level1:h-d_r"),                              # names are case-sensitive, as in CANN
    ("Level1:ring", "Level1:ring"),
    ("allreduce=level0:NA;level1:ring/barrier=level1:ring", "barrier=level1:ring"),
    ("AllReduce=level1:ring", "AllReduce=level1:ring"),
    ("level0:mesh", "level0:mesh"),
    ("level1:ring;level1:H-D_R", "level1:H-D_R"),
    ("allreduce=", "allreduce="),
    ("=level1:ring", "=level1:ring"),
    ("level0:NA;", ""),
    (";level1:ring", ""),
    ("level1:", "level1:"),
    (":ring", ":ring"),
    ("level0:NA;level1:ring;level2:ring;level3:ring;level0:NA",
     "level0:NA;level1:ring;level2:ring;level3:ring;level0:NA"),
    ("allreduce=level0:null;level1:ring", "allreduce=level0:null;level1:ring"),
])
def test_parse_rejects_bad_text_naming_the_part(text, bad_part):
    with pytest.raises(HcclError) as e:
        parse_hccl_algo(text)
    assert e.value.code == HCCL_E_PARA
    assert repr(bad_part) in str(e.value) and "EI0001" in str(e.value)
    assert "expected level0:NA;level1:<algo> or <op0>=level0:NA;level1:<algo0>/" in str(e.value)


def test_parse_rejects_mixed_and_repeated_global():
    with pytest.raises(HcclError, match="mixes a global setting"):
        parse_hccl_algo("level1:ring/allreduce=level1:H-D_R")
    with pytest.raises(HcclError, match="global setting is given twice"):
        parse_hccl_algo("level1:ring/level1:H-D_R")
    for bad in ("/level1:ring", "level1:ring/", "allreduce=level1:ring//allgather=level1:ring"):
        with pytest.raises(HcclError):
            parse_hccl_algo(bad)
    with pytest.raises(HcclError):
        parse_hccl_algo(None)


def test_choose_one_node_by_size():
    assert choose("all_reduce", 8, 1 << 30)[0] == "mesh"        # default: no switch (mesh measured fastest)
    limits = {"all_reduce": 1 << 20, "all_gather": 1 << 20}
    assert choose("all_reduce", 8, 1 << 20, thresholds=limits)[0] == "mesh"
    assert choose("all_reduce", 8, (1 << 20) + 1, thresholds=limits)[0] == "ring"
    assert choose("allgather", 8, 1 << 30, thresholds=limits)[0] == "ring"
    assert choose("broadcast", 8, 1 << 30, thresholds=limits)[0] == "mesh"  # not size-switched
    assert choose("all_reduce", 8, 4096, thresholds={"all_reduce": 1024})[0] == "ring"


def test_choose_multi_node_level1_follows_node_count():
    algo, params = choose("all_reduce", 32, 1 << 20, nodes=4)
    assert algo == "hierarchical" and params["ranks_per_node"] == 8 and params["level1"] == "hd"
    algo, params = choose("all_reduce", 24, 1 << 20, nodes=3)
    assert algo == "hierarchical" and params["level1"] == "ring"
    assert "3 nodes" in params["reason"]


def test_choose_hccl_algo_overrides():
    algo, params = choose("all_reduce", 16, 100, nodes=2, hccl_algo="level0:NA;level1:ring")
    assert (algo, params["level1"]) == ("hierarchical", "ring")
    per_op = "allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R"
    assert choose("all_gather", 24, 100, nodes=3, hccl_algo=per_op)[1]["level1"] == "hd"
    assert choose("all_reduce", 24, 100, nodes=3, hccl_algo=parse_hccl_algo(per_op))[1]["level1"] == "ring"
    assert choose("broadcast", 24, 100, nodes=3, hccl_algo=per_op)[1]["level1"] == "ring"  # automatic
    assert choose("all_reduce", 8, 100, hccl_algo="level0:ring;level1:NA")[0] == "ring"
    algo, params = choose("all_reduce", 16, 100, nodes=2, hccl_algo="level0:NA;level1:NHR")
    assert params["level1"] == "hd" and "NHR is not implemented" in params["note"]


def test_choose_maps_cann_names_onto_npusim_algorithms():
    # torch_npu's own tests set level1:fullmesh: on one node level1 has nothing to choose (automatic mesh) ...
    assert choose("all_reduce", 8, 100, hccl_algo="level0:NA;level1:fullmesh")[0] == "mesh"
    assert choose("all_reduce", 8, 100, topology="2x4", hccl_algo="level0:NA;level1:fullmesh")[0] == "hierarchical"
    # ... across nodes it is one mesh over every rank
    algo, params = choose("all_reduce", 16, 100, nodes=2, hccl_algo="level0:NA;level1:fullmesh")
    assert algo == "mesh" and "one mesh over every rank" in params["reason"]
    assert choose("all_reduce", 8, 100, hccl_algo="level0:H-D_R")[0] == "hd"
    algo, params = choose("all_gather", 8, 100, hccl_algo="level0:pipeline")
    assert algo == "ring" and "pipeline is not implemented" in params["note"]
    algo, params = choose("all_reduce", 16, 100, nodes=2, hccl_algo="level0:NA;level1:pipeline")
    assert (algo, params["level1"]) == ("hierarchical", "ring")
    assert choose("all_to_all", 16, 100, nodes=2, hccl_algo="alltoall=level0:NA;level1:pairwise")[0] == "mesh"
    assert choose("all_reduce", 16, 100, nodes=2, hccl_algo="level0:NA;level1:null")[1]["level1"] == "hd"
    assert choose("broadcast", 16, 100, nodes=2, hccl_algo="allreduce=level1:ring/others=level1:ring")[1][
        "level1"] == "ring"


def test_choose_falls_back_and_says_so():
    algo, params = choose("all_to_all", 16, 1 << 20, nodes=2)
    assert algo == "mesh" and "falling back" in params["reason"]
    assert not supports("hd", "all_to_all") and supports("mesh", "alltoall")


def test_choose_2x4_topology_uses_hcss_groups():
    algo, params = choose("all_reduce", 8, 100, topology="2x4")
    assert algo == "hierarchical" and params["ranks_per_node"] == 4
    assert choose("all_reduce", 4, 100, topology="2x4")[0] == "mesh"


def test_choose_rejects_bad_node_count():
    with pytest.raises(HcclError, match="not a multiple of nodes=3"):
        choose("all_reduce", 8, 100, nodes=3)


def test_build_dispatch_and_errors():
    assert build("allreduce", "H-D_R", 8, 10).algo == "hd"
    assert build("all_reduce", "fullmesh", 4, 10).algo == "mesh"
    with pytest.raises(HcclError) as e:
        build("all_to_all", "ring", 4, 10)
    assert e.value.code == HCCL_E_NOT_SUPPORT and "ring has no all_to_all" in str(e.value)
    with pytest.raises(HcclError) as e:
        build("all_reduce", "butterfly", 4, 10)
    assert e.value.code == HCCL_E_PARA and "'butterfly'" in str(e.value)
    with pytest.raises(HcclError, match="unknown collective 'gather'"):
        build("gather", "mesh", 4, 10)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "scatter",
                                "all_to_all", "barrier"])
@pytest.mark.parametrize("world_size,nodes,nbytes", [(8, 1, 64), (8, 1, 1 << 24), (12, 3, 64), (16, 2, 1 << 24)])
def test_chosen_schedules_are_valid_and_correct(op, world_size, nodes, nbytes):
    algo, params = choose(op, world_size, nbytes, nodes=nodes)
    count, root = (0, None) if op == "barrier" else (5, (world_size - 1 if op in ("broadcast", "reduce", "scatter")
                                                         else None))
    sched = build(op, algo, world_size, count, root=root, **params)
    sizes = buffer_sizes(op, world_size, count, root=root)
    validate(sched, sizes)
    rng = np.random.default_rng(0)
    sends = [rng.integers(-9, 9, s["send"]) for s in sizes]
    recvs = [np.zeros(s["recv"], np.int64) for s in sizes]
    if op == "broadcast":
        recvs[root][:] = rng.integers(-9, 9, count)
    before = [r.copy() for r in recvs]
    run_numpy(sched, sends, recvs, "sum")
    n, c = world_size, count
    expected = {
        "all_reduce": lambda r: np.sum(sends, axis=0),
        "all_gather": lambda r: np.concatenate(sends),
        "reduce_scatter": lambda r: np.sum(sends, axis=0)[r * c:(r + 1) * c],
        "broadcast": lambda r: before[root],
        "reduce": lambda r: np.sum(sends, axis=0) if r == root else before[r],
        "scatter": lambda r: sends[root][r * c:(r + 1) * c],
        "all_to_all": lambda r: np.concatenate([sends[j][r * c:(r + 1) * c] for j in range(n)]),
        "barrier": lambda r: before[r],
    }[op]
    for r in range(n):
        np.testing.assert_array_equal(recvs[r], expected(r), err_msg=f"{algo} {params} rank {r}")
    if op == "barrier" and world_size > 1:
        assert sched.num_steps >= 1 and all(t.count == 0 for s in sched.steps for t in s)
