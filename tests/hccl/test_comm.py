"""Communicators: root info, init from threads, comm_init_all, sub-communicators, rank tables,
hccl.init() from the launcher's environment, destroy, and a 2x4 node where hierarchical runs."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import hccl
import rt

E_PARA, E_OPEN_FILE = 1, 10
ROOT = pathlib.Path(__file__).resolve().parents[2]


def in_threads(fn, args_list, timeout=60):
    """Run fn(*args) for each args in threads (every rank must be inside init at once)."""
    results, errors = [None] * len(args_list), [None] * len(args_list)

    def one(i, args):
        try:
            results[i] = fn(*args)
        except Exception as e:  # handed back to the test
            errors[i] = e

    threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results, errors


def all_reduce_check(C, cs, dtype=np.int32):
    data = [np.arange(11, dtype=dtype) * (c.rank + 2) for c in cs]
    ts = [C.upload(c, d) for c, d in zip(cs, data)]
    for c, t in zip(cs, ts):
        c.all_reduce(t)
    want = np.sum(data, axis=0, dtype=dtype)
    for t in ts:
        assert np.array_equal(t.numpy(), want)
    C.free(ts)


def test_root_info_round_trip():
    info = hccl.get_root_info()
    raw = info.to_bytes()
    assert len(raw) == hccl.HCCL_ROOT_INFO_BYTES
    assert hccl.RootInfo.from_bytes(raw) == info and hccl.RootInfo.from_bytes(bytes.fromhex(raw.hex())) == info
    assert hccl.get_root_info() != info
    with pytest.raises(hccl.HcclError) as e:
        hccl.RootInfo.from_bytes(b"\0" * 4108)
    assert e.value.code == E_PARA


def test_init_root_info_from_threads(comms):
    root = hccl.get_root_info()
    devices = [6, 2, 4]            # rank i on devices[i]: ranks need not follow card order

    def join(rank, dev):
        rt.set_device(dev)
        return hccl.comm_init_root_info(3, root.to_bytes() if rank == 1 else root, rank)

    cs, errs = in_threads(join, list(enumerate(devices)))
    assert errs == [None] * 3
    assert [hccl.get_rank_id(c) for c in cs] == [0, 1, 2]
    assert {hccl.get_rank_size(c) for c in cs} == {3} and [c.device for c in cs] == devices
    assert [m[1] for m in cs[0].members] == devices
    all_reduce_check(comms, cs)
    for c in cs:
        hccl.comm_destroy(c)
    with pytest.raises(hccl.HcclError):
        hccl.get_rank_size(cs[0])


def test_init_argument_errors(comms):
    rt.set_device(0)
    root = hccl.get_root_info()
    for nranks, rank in ((0, 0), (2, 2), (2, -1), (True, 0), (2, "0")):
        with pytest.raises(hccl.HcclError) as e:
            hccl.comm_init_root_info(nranks, root, rank)
        assert e.value.code == E_PARA
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_root_info(2, "not a root info", 0)
    assert e.value.code == E_PARA
    for devices in ([], [1, 1]):
        with pytest.raises(hccl.HcclError) as e:
            hccl.comm_init_all(devices)
        assert e.value.code == E_PARA
    with pytest.raises(rt.AclError):
        hccl.comm_init_all([0, 8])
    rt.reset_device(0)


def test_rank_joining_twice_and_two_ranks_on_one_card(comms):
    root = hccl.get_root_info()

    def join(rank, dev):
        rt.set_device(dev)
        return hccl.comm_init_root_info(2, root, rank)

    _, errs = in_threads(join, [(0, 3), (1, 3)])
    assert all(e is not None and e.code == E_PARA and "both on card 3" in e.message for e in errs), errs


def test_create_sub_comm(comms):
    world = comms.fresh(range(8))
    members = [1, 3, 6]

    def split(c):
        ids = members if c.rank in members else None
        return hccl.create_sub_comm(c, ids, 7, members.index(c.rank) if ids else 0)

    subs, errs = in_threads(split, [(c,) for c in world])
    assert errs == [None] * 8
    assert [s is None for s in subs] == [r not in members for r in range(8)]
    sub = [subs[r] for r in members]
    assert [s.rank for s in sub] == [0, 1, 2] and all(s.size == 3 for s in sub)
    assert [s.device for s in sub] == members and sub[0].id == f"{world[0].id}_sub_7"
    all_reduce_check(comms, sub, np.int64)

    # evens and odds at once, as two sub-communicators with their own ids
    def split2(c):
        ids = list(range(c.rank % 2, 8, 2))
        return hccl.create_sub_comm(c, ids, 10 + c.rank % 2, ids.index(c.rank))

    halves, errs = in_threads(split2, [(c,) for c in world])
    assert errs == [None] * 8
    evens, odds = halves[0::2], halves[1::2]
    data = [np.full(4, r, np.int32) for r in range(8)]
    ts = [comms.upload(h, data[r]) for r, h in enumerate(halves)]
    for h, t in zip(halves, ts):
        h.all_reduce(t)
    for r, t in enumerate(ts):
        assert np.array_equal(t.numpy(), np.full(4, sum(range(r % 2, 8, 2)), np.int32)), r
    comms.free(ts)
    all_reduce_check(comms, world)                   # the parent is unaffected

    for bad_ids, sub_rank, text in (([3, 1], 0, "ascending"), ([1, 9], 0, "ascending"), ([2, 3], 0, "not in"),
                                    ([1, 3], 0, "sub_rank 0")):
        with pytest.raises(hccl.HcclError) as e:
            hccl.create_sub_comm(world[1] if text != "sub_rank 0" else world[3], bad_ids, 99, sub_rank)
        assert e.value.code == E_PARA and text in e.value.message, e.value
    for c in [*sub, *evens, *odds, *world]:
        hccl.comm_destroy(c)


def rank_table(devices, path):
    doc = {"version": "1.0", "status": "completed", "server_count": "1",
           "server_list": [{"server_id": "127.0.0.1", "device": [
               {"device_id": str(d), "device_ip": f"192.168.1.{d}", "rank_id": str(r)}
               for r, d in enumerate(devices)]}]}
    path.write_text(json.dumps(doc))
    return doc


def test_comm_init_cluster_info_from_threads(comms, tmp_path):
    path = tmp_path / "rank_table.json"
    devices = [4, 5, 6, 7]
    rank_table(devices, path)

    def join(rank):
        c = hccl.comm_init_cluster_info(str(path), rank)
        assert rt.get_device() == devices[rank]          # the table bound the device
        return c

    for _ in range(2):                                   # the same table twice: two communicators
        cs, errs = in_threads(join, [(r,) for r in range(4)])
        assert errs == [None] * 4, errs
        assert [c.rank for c in cs] == [0, 1, 2, 3] and [c.device for c in cs] == devices
        all_reduce_check(comms, cs)
        for c in cs:
            hccl.comm_destroy(c)


@pytest.mark.parametrize("edit, code, text", [
    (lambda d: d.update(version="2.0"), E_PARA, "version"),
    (lambda d: d["server_list"][0]["device"][1].update(rank_id=1), E_PARA, "rank_id"),
    (lambda d: d["server_list"][0]["device"][1].pop("device_id"), E_PARA, "device_id"),
    (lambda d: d["server_list"][0]["device"][1].update(rank_id="0"), E_PARA, "appears twice"),
    (lambda d: d["server_list"][0]["device"][1].update(rank_id="5"), E_PARA, "rank_ids must be 0..1"),
    (lambda d: d.update(server_count="2"), E_PARA, "server_count"),
    (lambda d: d.pop("server_list"), E_PARA, "server_list"),
])
def test_bad_rank_tables(comms, tmp_path, edit, code, text):
    path = tmp_path / "rt.json"
    doc = rank_table([0, 1], path)
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_cluster_info(str(path), 0)
    assert e.value.code == code and text in e.value.message and str(path) in e.value.message, e.value


def test_rank_table_file_and_rank_errors(comms, tmp_path):
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_cluster_info(str(tmp_path / "missing.json"), 0)
    assert e.value.code == E_OPEN_FILE
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_cluster_info(str(tmp_path / "bad.json"), 0)
    assert e.value.code == E_PARA and "not valid JSON" in e.value.message
    rank_table([0, 1], tmp_path / "ok.json")
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_cluster_info(str(tmp_path / "ok.json"), 2)
    assert e.value.code == E_PARA and "rank 2 is not in" in e.value.message


def test_hccl_init_from_launcher_environment(comms, monkeypatch):
    import hccl.comm as comm_mod
    monkeypatch.setattr(comm_mod, "_world", None)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(hccl.HcclError) as e:
        hccl.init()
    assert e.value.code == E_PARA and "RANK and WORLD_SIZE" in e.value.message
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("DEVICE_ID", "2")
    monkeypatch.setenv("NPUSIM_JOB", "hinit-test")
    # a fresh thread has no current device, so hccl.init() sets DEVICE_ID itself
    results, errs = in_threads(lambda: (hccl.init(), hccl.init()), [()])
    assert errs == [None], errs
    world, again = results[0]
    assert world is again and world.size == 1 and world.rank == 0 and world.device == 2
    all_reduce_check(comms, [world])
    hccl.comm_destroy(world)


HIER_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import rt, hccl
    from hccl.algos import choose
    rt.init(sys.argv[1], backend="local")
    n = 8
    assert choose("all_reduce", n, 4000, topology="2x4")[0] == "hierarchical"
    cs = hccl.comm_init_all(list(range(n)))
    rng = np.random.default_rng(0)
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        for count in (1, 7, 1000):
            data = [rng.integers(-1000, 1000, count * n).astype(np.int64) for _ in range(n)]
            ts, outs = [], []
            for c, d in zip(cs, data):
                rt.set_context(c.ctx)
                ts.append(rt.Tensor.from_numpy(d))
                outs.append(rt.Tensor.from_numpy(np.zeros(count * n, np.int64)))
            for c, t, o in zip(cs, ts, outs):
                if name == "all_reduce":
                    hccl.all_reduce(t.ptr, o.ptr, count, "int64", "sum", c)
                elif name == "all_gather":
                    hccl.all_gather(t.ptr, o.ptr, count, "int64", c)
                elif name == "reduce_scatter":
                    hccl.reduce_scatter(t.ptr, o.ptr, count, "int64", "max", c)
                elif name == "broadcast":
                    hccl.broadcast(t.ptr, count, "int64", 5, c)
                else:
                    hccl.reduce(t.ptr, o.ptr, count, "int64", "min", 6, c)
            for r, (c, t, o) in enumerate(zip(cs, ts, outs)):
                c.synchronize()
                got, sent = o.numpy(), t.numpy()
                if name == "all_reduce":
                    ok = np.array_equal(got[:count], np.sum([d[:count] for d in data], axis=0))
                elif name == "all_gather":
                    ok = np.array_equal(got, np.concatenate([d[:count] for d in data]))
                elif name == "reduce_scatter":
                    ok = np.array_equal(got[:count], np.max(data, axis=0)[r * count:(r + 1) * count])
                elif name == "broadcast":
                    ok = np.array_equal(sent[:count], data[5][:count])
                else:
                    ok = r != 6 or np.array_equal(got[:count], np.min([d[:count] for d in data], axis=0))
                assert ok, (name, count, r)
    print("HIER OK")
""")


def test_two_by_four_node_runs_hierarchical(tmp_path):
    """A 910-style node (two HCCS groups of 4): hierarchical with H-D_R across the groups."""
    cfg = tmp_path / "2x4.toml"
    cfg.write_text('[node]\ntopology = "2x4"\n')
    out = subprocess.run([sys.executable, "-c", HIER_SCRIPT, str(cfg)], capture_output=True, text=True,
                         timeout=100, cwd=str(ROOT))
    assert out.returncode == 0 and "HIER OK" in out.stdout, out.stderr[-3000:]


def test_destroyed_communicators_release_their_control_blocks(hccl_rt):
    """Each card drops its control block once no endpoint of the communicator is left on it, and a
    card asking for a released block later is refused instead of getting a fresh, empty one."""
    from rt.host.runtime import RUNTIME
    cards = RUNTIME.backend.cards
    ids = []
    for _ in range(3):
        comms = hccl.comm_init_all([0, 1, 2])
        t = [None] * 3
        for i, c in enumerate(comms):
            hccl_rt.set_context(c.ctx)
            t[i] = hccl_rt.Tensor.from_numpy(np.full(4, i + 1, np.float32))
            c.all_reduce(t[i])
        for i, c in enumerate(comms):
            hccl_rt.set_context(c.ctx)
            hccl_rt.synchronize_stream(None)
            assert t[i].numpy().tolist() == [6.0] * 4
            t[i].free()
        ids.append(comms[0].id)
        for c in comms:
            hccl.comm_destroy(c)
    for card in cards.values():
        if "hccl" in card._extensions:
            assert not set(ids) & set(card.extension("hccl").ctrl), card.extension("hccl").ctrl
    with pytest.raises(hccl.HcclError) as e:
        cards[0].extension("hccl").ctrl_array(ids[0], 4096)
    assert "destroyed" in e.value.message
