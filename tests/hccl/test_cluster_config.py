"""HcclCommInitClusterInfoConfig (``comm_init_cluster_info_config``) and HcclCreateSubCommConfig's config
(``create_sub_comm(..., config)``): the communicator's own settings override the environment's; a bad config is
HCCL_E_PARA naming it, before any rank waits for another."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import hccl
import rt

E_PARA = 1


def table(path, devices):
    path.write_text(json.dumps({"version": "1.0", "status": "completed", "server_count": "1", "server_list": [
        {"server_id": "127.0.0.1", "device": [{"device_id": str(d), "device_ip": f"192.168.1.{d}", "rank_id": str(r)}
                                              for r, d in enumerate(devices)]}]}))
    return str(path)


def in_threads(fn, n):
    out = [None] * n

    def one(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out[r] = e
    threads = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def all_reduce(c, value):
    t = rt.Tensor.from_numpy(np.full(8, value, np.float32))
    c.all_reduce(t)
    rt.synchronize_device()
    return t.numpy()


def test_cluster_info_config_overrides_the_environment_and_sub_comms_take_a_config(comms, tmp_path, monkeypatch):
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "600")
    path = table(tmp_path / "rank_table.json", [4, 5, 6, 7])

    def rank(r):
        c = hccl.comm_init_cluster_info_config(path, r, {"exec_timeout": 45, "deterministic": True})
        assert rt.get_device() == 4 + r and c.options["exec_timeout"] == 45 and c.options["deterministic"]
        got = all_reduce(c, r + 1)
        ids = [0, 1] if r < 2 else [2, 3]
        sub = hccl.create_sub_comm(c, ids, 1 + r // 2, ids.index(r), {"exec_timeout": 30})
        assert sub.options["exec_timeout"] == 30 and sub.id == f"{c.id}_sub_{1 + r // 2}"
        part = all_reduce(sub, r + 1)
        for x in (sub, c):
            hccl.comm_destroy(x)
        return got, part
    out = in_threads(rank, 4)
    for r, res in enumerate(out):
        assert not isinstance(res, Exception), res
        np.testing.assert_allclose(res[0], np.full(8, 10.0))
        np.testing.assert_allclose(res[1], np.full(8, 3.0 if r < 2 else 7.0))


@pytest.mark.parametrize("config, text", [({"exec_timout": 5}, "exec_timout"), ("fast", "'fast'"),
                                          ({"exec_timeout": -1}, "exec_timeout")])
def test_a_bad_config_is_refused_before_anyone_waits(comms, tmp_path, config, text):
    path = table(tmp_path / "rank_table.json", [0, 1])
    with pytest.raises(hccl.HcclError) as e:
        hccl.comm_init_cluster_info_config(path, 0, config)
    assert e.value.code == E_PARA and e.value.message.startswith("comm_init_cluster_info_config: ")
    assert text in e.value.message
