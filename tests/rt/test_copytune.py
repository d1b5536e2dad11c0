"""rt/copytune.py: the environment that gives npusim's processes non-temporal copies of large buffers."""

import pytest

from rt import copytune
from rt.errors import AclError

needs_glibc = pytest.mark.skipif(not copytune.applies(), reason="the tunable is glibc's on x86-64")


@needs_glibc
def test_the_threshold_is_added_after_the_users_tunables():
    assert copytune.tuned({}) == {"GLIBC_TUNABLES": f"{copytune.TUNABLE}={copytune.DEFAULT:#x}"}
    assert copytune.tuned({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "NPUSIM_NT_COPY_BYTES": "1048576"}) == \
        {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{copytune.TUNABLE}=0x100000"}
    assert copytune.tuned({"NPUSIM_NT_COPY_BYTES": "0x40000"}) == {"GLIBC_TUNABLES": f"{copytune.TUNABLE}=0x40000"}


@needs_glibc
def test_a_threshold_the_user_set_and_zero_leave_glibc_alone():
    assert copytune.tuned({"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{copytune.TUNABLE}=0x200000"}) == {}
    assert copytune.tuned({"NPUSIM_NT_COPY_BYTES": "0"}) == {}


@pytest.mark.parametrize("bad", ["lots", "-1", "100", "1.5", "1e9", str(1 << 48)])
def test_a_bad_threshold_is_refused_with_the_variable_named(bad):
    with pytest.raises(AclError) as err:
        copytune.tuned({"NPUSIM_NT_COPY_BYTES": bad})
    assert err.value.code == 100000 and "NPUSIM_NT_COPY_BYTES" in str(err.value) and repr(bad) in str(err.value)


@needs_glibc
def test_ranks_and_their_fork_server_get_it_and_it_shapes_start_up():
    from launcher.forkserver import client
    from launcher.launch.config import common_rank_env

    class Rc:
        env = {"PATH": "/usr/bin"}
    assert common_rank_env(Rc())["GLIBC_TUNABLES"] == f"{copytune.TUNABLE}={copytune.DEFAULT:#x}"
    # a rank whose tunables differ from its fork server's must not be forked from it: glibc read them at exec
    assert "GLIBC_TUNABLES" in client.STARTUP_VARS


@needs_glibc
def test_active_reads_what_this_process_runs_with(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", f"glibc.malloc.arena_max=2:{copytune.TUNABLE}=0x80000")
    assert copytune.active() == 0x80000
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert copytune.active() == 0
    monkeypatch.setenv("GLIBC_TUNABLES", f"{copytune.TUNABLE}=junk")
    assert copytune.active() == 0
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert copytune.active() == 0
