"""The rank table: real v1.0 layout, contiguous ranks per server, and a strict loader — the one module the
launcher writes with and comm_init_cluster_info reads with."""

import json

import pytest

from hccl import ranktable
from hccl.errors import HcclError


@pytest.mark.parametrize("nnodes, nproc", [(1, 1), (1, 8), (2, 3), (4, 8)])
def test_build_matches_the_v1_layout(tmp_path, nnodes, nproc):
    path = ranktable.write(tmp_path / "t.json", ranktable.build(nnodes, nproc))
    doc = json.loads(open(path).read())
    assert doc["version"] == "1.0" and doc["status"] == "completed" and doc["server_count"] == str(nnodes)
    flat = []
    for s, server in enumerate(doc["server_list"]):
        assert server["server_id"] == f"node_{s}"
        for card, dev in enumerate(server["device"]):
            assert dev == {"device_id": str(card), "device_ip": f"192.168.{s}.{card}",
                           "rank_id": str(s * nproc + card)}
            flat.append(int(dev["rank_id"]))
    assert flat == list(range(nnodes * nproc))
    table = ranktable.load_rank_table(path)
    loaded = {r: (s, table.servers[s], d) for r, (s, d) in table.devices.items()}
    assert loaded == {r: (r // nproc, f"node_{r // nproc}", r % nproc) for r in range(nnodes * nproc)}


def _mutated(tmp_path, mutate):
    doc = ranktable.build(2, 2)
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version="1.2"), "version"),
    (lambda d: d.update(status="initializing"), "status"),
    (lambda d: d.update(server_count=2), "server_count"),
    (lambda d: d["server_list"][1]["device"][0].update(rank_id=1), "decimal-string"),
    (lambda d: d["server_list"][1]["device"][0].update(rank_id="1"), "appears twice"),
    (lambda d: d["server_list"][1]["device"][1].update(rank_id="9"), "without gaps"),
])
def test_load_rejects_malformed_tables(tmp_path, mutate, message):
    with pytest.raises(HcclError) as info:
        ranktable.load_rank_table(_mutated(tmp_path, mutate))
    assert message in str(info.value)


def test_load_rejects_non_json_and_huge_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(HcclError, match="not valid JSON"):
        ranktable.load_rank_table(bad)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (ranktable.MAX_BYTES + 1))
    with pytest.raises(HcclError, match="limit"):
        ranktable.load_rank_table(huge)


# ---------------------------------------------------------------- hostile files (issue #21 item 5)
@pytest.mark.parametrize("text, why", [
    ("[" * 100_000 + "]" * 100_000, "RecursionError"),                  # json.loads recursion depth
    ('{"version": "1.0", "server_count": ' + "9" * 5000 + "}", "ValueError"),   # past int()'s digit limit
    (b"\xff\xfe{}", "UnicodeDecodeError"),
])
def test_load_turns_hostile_json_into_hccl_e_para(tmp_path, text, why):
    path = tmp_path / "hostile.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(HcclError) as info:
        ranktable.load_rank_table(path)
    assert info.value.code == 1 and "not valid JSON" in info.value.message and why in info.value.message


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "1" * 5000, "", "-1", " 1", "١٢"])
def test_load_refuses_ids_int_cannot_take_or_too_long(tmp_path, value):
    """'²'.isdigit() is True but int('²') raises ValueError; a 5000-digit id exceeds int()'s limit."""
    path = _mutated(tmp_path, lambda d: d["server_list"][0]["device"][0].update(rank_id=value))
    with pytest.raises(HcclError) as info:
        ranktable.load_rank_table(path)
    assert info.value.code == 1 and "rank_id" in info.value.message and "ASCII digits" in info.value.message


def test_messages_of_huge_values_stay_short(tmp_path):
    path = _mutated(tmp_path, lambda d: d.update(version=["x"] * 100_000))
    with pytest.raises(HcclError) as info:
        ranktable.load_rank_table(path)
    assert "version" in info.value.message and len(info.value.message) < 400


def test_comm_init_cluster_info_refuses_hostile_tables_and_ranks(tmp_path, rt_local):
    import hccl
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(HcclError) as info:
        hccl.comm_init_cluster_info(str(deep), 0)
    assert info.value.code == hccl.HCCL_E_PARA
    good = ranktable.write(tmp_path / "good.json", ranktable.build(1, 1))
    with pytest.raises(HcclError) as info:
        hccl.comm_init_cluster_info(good, 10 ** 5000)            # repr() of it raises ValueError
    assert info.value.code == hccl.HCCL_E_PARA and "bit int" in info.value.message
