"""Hostile arguments to ``launcher.spawn``: each is AclError(ACL_ERROR_INVALID_PARAM) naming the argument, raised
before any rank starts — never a TypeError from deep inside, a job with absurd bounds, or silent acceptance."""

import os

import pytest

import launcher
from rt.constants import AclErrorCode
from rt.errors import AclError

pytestmark = pytest.mark.timeout(60)


def never_run(tag):
    raise AssertionError(f"a rank ran although spawn's arguments were bad: {tag}")


# (keyword arguments, what the message must contain)
CASES = [
    ({"nproc": None}, "nproc"),
    ({"nproc": True}, "nproc"),
    ({"nproc": 1.0}, "nproc"),
    ({"nproc": 0}, "nproc"),
    ({"nproc": 2 ** 63}, "nproc"),
    ({"nnodes": None}, "nnodes"),
    ({"nnodes": 2 ** 40}, "nnodes"),
    ({"max_restarts": 2 ** 63}, "max_restarts"),
    ({"max_restarts": -1}, "max_restarts"),
    ({"max_restarts": "1"}, "max_restarts"),
    ({"timeout": "x"}, "timeout"),
    ({"timeout": float("inf")}, "timeout"),
    ({"timeout": float("nan")}, "timeout"),
    ({"grace": "x"}, "grace"),
    ({"grace": float("inf")}, "grace"),
    ({"grace": 1e300}, "grace"),
    ({"env": ["A=1"]}, "env"),
    ({"env": "A=1"}, "env"),
    ({"env": {"A": 1}}, "A=1"),
    ({"env": {"A=B": "1"}}, "'A=B'"),
    ({"env": {"A": "x\0y"}}, "NUL"),
    ({"args": 5}, "args"),
    ({"address": 5}, "address"),
    ({"local_ranks_filter": [0]}, "--local-ranks-filter"),
    ({"local_ranks_filter": "²"}, "--local-ranks-filter"),
    ({"log_dir": 5}, "--log-dir"),
    ({"log_dir": "/proc/x"}, "--log-dir"),
    ({"profile": b"p.json"}, "--profile"),
    ({"profile": "/"}, "--profile"),
    ({"inject": 5}, "--inject"),
    ({"inject": "kill:rank=0:collective=" + "1" * 5000}, "--inject"),
    ({"config": 5}, "config"),
    ({"config": "x" * 5000}, "--config"),
]


@pytest.mark.parametrize("kwargs,needle", CASES, ids=[repr(c[0])[:40] for c in CASES])
def test_bad_spawn_argument_is_invalid_param_naming_it(kwargs, needle):
    call = {"nproc": 1, "args": ("x",), "_no_cards": True, **kwargs}
    with pytest.raises(AclError) as info:
        launcher.spawn(never_run, **call)
    assert info.value.code == AclErrorCode.ACL_ERROR_INVALID_PARAM, info.value
    assert needle in info.value.message and len(info.value.message) < 1000, info.value.message


def test_good_arguments_of_every_kind_are_accepted(tmp_path):
    """The checks refuse only bad values: ints, floats, path-likes, an env dict and a list of args all run."""
    got = launcher.spawn(os.getenv, nproc=1, args=["NPUSIM_TEST_VALUE"], timeout=60, grace=0.5, max_restarts=0,
                         env={"NPUSIM_TEST_VALUE": "v"}, log_dir=tmp_path / "logs", _no_cards=True)
    assert got == ["v"] and (tmp_path / "logs" / "rank0.log").exists()
