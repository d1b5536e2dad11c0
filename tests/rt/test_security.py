"""Isolation (issue #21 items 6 and 14): directories npusim reuses in $TMPDIR must be its own and private, and a
card admits only connections presenting its job's key."""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from rt import slog
from rt.card.card import Card
from rt.config import load_config
from rt.errors import AclError
from rt.files import FileRefused, private_dir
from rt.host import backends
from rt.ray import session
from rt.wire.channel import KEY_FILE, SocketTransport, card_key, socket_path
from rt.wire.client import CardClient
from rt.wire.protocol import CALL, pack
from rt.wire.server import CardServer

NOBODY = 65534
NO_PERMISSION, DEV_SETUP = 207006, 507033


@pytest.fixture
def tmpdir_root(monkeypatch):
    """$TMPDIR (as tempfile sees it) is a fresh short directory: the per-user directory is ``<it>/npusim-<uid>``.
    (pytest's ``tmp_path`` can be longer than a per-user directory may be: see the next test.)"""
    short = tempfile.mkdtemp(prefix="ns", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", short)
    yield pathlib.Path(short) / f"npusim-{os.getuid()}"
    shutil.rmtree(short, ignore_errors=True)


def test_a_tmpdir_too_long_for_socket_paths_moves_the_per_user_directory_to_tmp(monkeypatch, tmp_path):
    long_dir = tmp_path / ("x" * 100)
    long_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_dir))
    root = session.socket_root(create=False)
    assert root == f"/tmp/npusim-{os.getuid()}"
    assert len(socket_path(os.path.join(root, "ray-0123456789ab"), 999, 9999)) < 108


def squat(path, mode=0o777):
    """What another local user does first: make the directory, theirs, open to all."""
    os.mkdir(path)
    os.chmod(path, mode)
    os.chown(path, NOBODY, NOBODY)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another user needs root")


# ---------------------------------------------------------------- item 6: squattable directories
@needs_root
def test_a_squatted_per_user_directory_is_refused_and_named(tmpdir_root):
    squat(tmpdir_root)
    with pytest.raises(AclError) as info:
        session.socket_root()
    msg = info.value.message
    assert info.value.code == DEV_SETUP
    assert str(tmpdir_root) in msg and f"uid {NOBODY}" in msg and "mode 0777" in msg
    assert "0700" in msg and "TMPDIR" in msg
    assert os.listdir(tmpdir_root) == []                     # nothing of ours was put inside


def test_a_symlink_in_place_of_the_per_user_directory_is_refused(tmpdir_root, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    os.symlink(target, tmpdir_root)
    with pytest.raises(AclError) as info:
        session.socket_root()
    assert info.value.code == DEV_SETUP
    assert "symbolic link" in info.value.message and str(tmpdir_root) in info.value.message
    assert os.listdir(target) == []


def test_our_own_directory_is_reused_and_narrowed_to_0700(tmpdir_root):
    os.mkdir(tmpdir_root, 0o755)
    os.chmod(tmpdir_root, 0o755)
    assert session.socket_root() == str(tmpdir_root)
    assert os.stat(tmpdir_root).st_mode & 0o777 == 0o700
    os.chmod(tmpdir_root, 0o777)                              # ours, but anyone could have put things inside
    with pytest.raises(AclError, match="mode 0777"):
        session.socket_root()


def test_a_fresh_per_user_directory_is_made_private(tmpdir_root):
    assert session.socket_root() == str(tmpdir_root)
    st = os.lstat(tmpdir_root)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700


def test_a_lookup_without_create_leaves_nothing_behind(tmpdir_root):
    assert session.socket_root(create=False) == str(tmpdir_root)
    assert not os.path.lexists(tmpdir_root)


@needs_root
def test_launch_names_a_squatted_directory_in_one_line(tmpdir_root):
    squat(tmpdir_root)
    env = {**os.environ, "TMPDIR": str(tmpdir_root.parent), "NPUSIM_CLUSTER": "1"}
    done = subprocess.run([sys.executable, "-m", "launcher", "--status"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"uid {NOBODY}" in lines[0] and "mode 0777" in lines[0]


@needs_root
def test_card_creation_refuses_a_squatted_job_directory_before_any_card_starts(tmp_path):
    job_dir = tmp_path / "job"
    squat(job_dir)
    with pytest.raises(AclError) as info:
        session.create_cards("squatted", 0, None, load_config(), count=1, socket_dir=str(job_dir))
    assert info.value.code == DEV_SETUP and str(job_dir) in info.value.message
    assert os.listdir(job_dir) == []


@needs_root
def test_a_card_server_refuses_a_squatted_socket_directory(tmp_path):
    squat(tmp_path / "cards")
    card = Card(capacity=8 << 20)
    try:
        with pytest.raises(AclError) as info:
            CardServer(card, socket_path(str(tmp_path / "cards"), 0, 0))
        assert info.value.code == DEV_SETUP and f"uid {NOBODY}" in info.value.message
    finally:
        card.close()


def test_a_rank_refuses_a_socket_directory_that_is_a_symlink(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUSIM_CARD_WAIT", "1")
    real = tmp_path / "real"
    card = Card(capacity=8 << 20)
    server = CardServer(card, socket_path(str(real), 0, 0))
    os.symlink(real, tmp_path / "link")
    try:
        with pytest.raises(AclError) as info:
            backends.SocketDirCards(load_config(), str(tmp_path / "link"), 0).connect(0, lambda m, f: None, None)
        assert info.value.code == DEV_SETUP and "symbolic link" in info.value.message
    finally:
        server.close()
        card.close()


def test_private_dir_refuses_a_file_in_its_place(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileRefused) as info:
        private_dir(str(tmp_path / "f"), "test dir")
    assert info.value.reason == "unsafe" and "is a regular file" in info.value.message


# ---------------------------------------------------------------- item 14: a key per card set
@pytest.fixture
def card_at(tmp_path):
    """``card_at(name)``: a card serving ``tmp_path/name/npu0_0.sock`` (its set's own key beside it)."""
    made = []

    def start(name):
        card = Card(capacity=8 << 20)
        server = CardServer(card, socket_path(str(tmp_path / name), 0, 0))
        made.append((server, card))
        return server, card
    yield start
    for server, card in made:
        server.close()
        card.close()


def client(path, key=None):
    return CardClient(lambda m, c: SocketTransport(path, m, c, key=key), name="card 0 (node 0)")


def test_each_card_set_has_its_own_private_key(card_at, tmp_path):
    card_at("a"), card_at("b")
    a, b = card_key(str(tmp_path / "a")), card_key(str(tmp_path / "b"))
    assert len(a) == 32 and a != b
    assert os.stat(tmp_path / "a" / KEY_FILE).st_mode & 0o777 == 0o600


def test_another_jobs_key_is_refused_and_the_card_serves_its_own_job(card_at, tmp_path, monkeypatch):
    logged = []
    monkeypatch.setattr(slog, "error", lambda module, msg, *args: logged.append(msg % args))
    server, card = card_at("a")
    card_at("b")
    path = socket_path(str(tmp_path / "a"), 0, 0)
    for _ in range(2):                     # job b's process, holding job b's key, at job a's card
        with pytest.raises(AclError) as info:
            client(path, key=card_key(str(tmp_path / "b")))
        assert info.value.code == NO_PERMISSION and "refused" in info.value.message
    assert server.refused == 2 and len(logged) == 1 and "did not present the key" in logged[0]
    mine = client(path)
    assert mine.call("ping") is True
    assert [c.label for c in card.conns.values()] == ["host"]   # the refused ones never became connections
    mine.close()


def test_a_raw_client_without_the_key_is_closed_unanswered(card_at, tmp_path):
    server, card = card_at("a")
    path = socket_path(str(tmp_path / "a"), 0, 0)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    s.sendall(pack([CALL, 1, "hello", [os.getpid(), "intruder"]]) + pack([CALL, 2, "mem_info", []]))
    data = b""
    while chunk := s.recv(1 << 16):
        data += chunk
    s.close()
    assert b"refused" in data and b"mem_info" not in data            # told why, nothing else answered
    assert server.refused == 1 and not card.conns
    assert client(path).call("ping") is True


def test_a_probe_that_sends_nothing_is_not_a_refusal(card_at, tmp_path):
    server, _ = card_at("a")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(socket_path(str(tmp_path / "a"), 0, 0))        # npu-smi's liveness check
    s.close()
    mine = client(socket_path(str(tmp_path / "a"), 0, 0))
    assert mine.call("ping") is True and server.refused == 0
    mine.close()


def test_npu_smi_presents_the_key_and_names_a_refusal(card_at, tmp_path):
    from launcher.tools import smi
    card_at("a")
    path = socket_path(str(tmp_path / "a"), 0, 0)
    assert smi.query_card(path)["total"] == 8 << 20
    os.unlink(tmp_path / "a" / KEY_FILE)                  # the key beside the sockets is not the card's
    card_key(str(tmp_path / "a"), create=True)
    with pytest.raises(smi.CardError, match="refused"):
        smi.query_card(path)


def test_a_key_file_that_is_not_private_is_refused(tmp_path):
    d = tmp_path / "cards"
    d.mkdir(mode=0o700)
    (d / KEY_FILE).write_bytes(os.urandom(32))
    os.chmod(d / KEY_FILE, 0o644)
    with pytest.raises(AclError) as info:
        card_key(str(d))
    assert info.value.code == NO_PERMISSION and "mode 0644" in info.value.message
    os.unlink(d / KEY_FILE)
    os.symlink(tmp_path / "elsewhere", d / KEY_FILE)
    with pytest.raises(AclError, match="symbolic link"):
        card_key(str(d))
    with pytest.raises(AclError, match="does not exist"):
        card_key(str(tmp_path))


def test_a_set_created_in_steps_keeps_its_first_key(tmp_path):
    first = card_key(str(tmp_path), create=True)
    assert card_key(str(tmp_path), create=True) == first
    assert [e for e in os.listdir(tmp_path) if e.endswith(".tmp")] == []


def test_ray_cards_refuse_another_jobs_key(ray_session):
    import ray
    cfg = load_config()
    node = ray.get_runtime_context().get_node_id()
    a = session.create_cards("sec-a", 0, node, cfg, count=1)
    try:
        key_a = card_key(a.socket_dir)
        path = socket_path(a.socket_dir, 0, 0)
        with pytest.raises(AclError) as info:
            client(path, key=bytes(32))
        assert info.value.code == NO_PERMISSION
        mine = client(path, key=key_a)
        assert mine.call("ping") is True
        mine.close()
    finally:
        session.destroy_cards(a)
