"""Regression tests for the reliability probe (issue 11): bounded host memory, a card that survives bad
commands and garbage, model files that are not regular files, and errors that stay inside the contract."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from rt.card.card import Card
from rt.card.memcmds import MemoryCommands
from rt.wire.protocol import CALL, TASK
from rt.wire.channel import SocketTransport
from rt.wire.server import CardServer
from rt.wire.client import CardClient


# ---------------------------------------------------------------- host memory is bounded, never OOM-killed
def test_malloc_host_beyond_the_machine_is_207001_not_an_oom_kill(dev0):
    rt = dev0
    with pytest.raises(rt.AclError) as e:
        rt.malloc_host(2 ** 40)
    assert e.value.code == rt.ACL_ERROR_RT_MEMORY_ALLOCATION
    assert "1099511627776 bytes" in e.value.message and "limit" in e.value.message
    buf = rt.malloc_host(1 << 20)                    # the process goes on
    rt.free_host(buf)


def test_pinned_limit_from_the_config_is_enforced_and_released(rt_factory, tmp_path):
    cfg = tmp_path / "pinned.toml"
    cfg.write_text("[host]\npinned_limit_bytes = 4194304\n")
    rt = rt_factory(str(cfg))
    from rt.host.hostmem import PINNED
    held = PINNED.in_use                             # what earlier tests of this process still hold
    a = rt.malloc_host(3 << 20)
    with pytest.raises(rt.AclError) as e:
        rt.malloc_host(2 << 20)
    assert e.value.code == 207001 and f"holds {held + (3 << 20)} of its 4194304-byte limit" in e.value.message
    rt.free_host(a)
    rt.free_host(rt.malloc_host(4 << 20))            # freed memory counts no more


def test_a_card_larger_than_the_host_fails_malloc_with_207001(rt_factory, tmp_path):
    import psutil
    cfg = tmp_path / "huge.toml"
    cfg.write_text(f"[card]\nhbm_bytes = {psutil.virtual_memory().total * 4 // 512 * 512}\n")
    rt = rt_factory(str(cfg))
    rt.set_device(0)
    with pytest.raises(rt.AclError) as e:
        rt.malloc(psutil.virtual_memory().total * 2)
    assert e.value.code == 207001 and "available" in e.value.message
    assert e.value.message.startswith("EL0004: Failed to allocate memory. malloc on card 0 (node 0): ")
    rt.free(rt.malloc(1024))


# ---------------------------------------------------------------- one bad command never drops a connection
class _Sink:
    def __init__(self):
        self.msgs = []

    def __call__(self, msg, fds=()):
        self.msgs.append(msg)


def test_a_task_for_a_destroyed_stream_fails_at_the_next_device_sync():
    card = Card(capacity=8 << 20)
    sink = _Sink()
    conn = card.connect(sink)
    try:
        card.handle(conn, [CALL, 1, "stream_create", []])
        sid = sink.msgs[-1][2]
        card.handle(conn, [CALL, 2, "stream_destroy", [sid]])
        card.handle(conn, [TASK, sid, "memset", [0, 0, 0]])          # raced with the destroy: must not raise
        card.handle(conn, [CALL, 3, "device_sync", [3]])
        deadline = time.monotonic() + 10
        while not any(m[0] == 3 for m in sink.msgs) and time.monotonic() < deadline:
            time.sleep(0.01)
        reply = next(m for m in sink.msgs if m[0] == 3)
        assert reply[1] is False and reply[2][1] == 107017 and f"stream {sid}" in reply[2][2]
        card.handle(conn, [CALL, 4, "malloc", [64]])                  # the connection still serves
        assert sink.msgs[-1][:2] == [4, True]
    finally:
        card.close()


@pytest.mark.parametrize("msg", [7, "x", [], [1], [0, "a", "b", []], [1, 2, 3, 4], [0, 1, "ping", "args"], None])
def test_messages_that_are_not_commands_are_dropped(msg):
    card = Card(capacity=8 << 20)
    sink = _Sink()
    conn = card.connect(sink)
    try:
        card.handle(conn, msg)
        card.handle(conn, [CALL, 1, "ping", []])
        assert sink.msgs == [[1, True, True]]
    finally:
        card.close()


def test_garbage_on_a_card_socket_prints_nothing_and_other_clients_go_on(tmp_path, capfd):
    card = Card(capacity=8 << 20)
    path = str(tmp_path / "npu0_0.sock")
    server = CardServer(card, path)
    try:
        for junk in (b"\xc1\xc1\xc1garbage\x00\xff" * 50, b"\x94\x00\x01\xa4ping\x90" + os.urandom(4096)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.sendall(junk)
            s.close()
        client = CardClient(lambda m, c: SocketTransport(path, m, c), name="card 0 (node 0)")
        assert client.call("ping") is True
        client.close()
        time.sleep(0.2)
        err = capfd.readouterr().err
        assert "Traceback" not in err and "Exception in thread" not in err
    finally:
        server.close()
        card.close()


def test_enqueue_racing_destroy_stream_fails_that_call_only(dev0):
    rt = dev0
    ptr = rt.malloc(1 << 16)
    failures, stop = [], threading.Event()
    for _ in range(20):
        s = rt.create_stream()

        def enqueue():
            while not stop.is_set():
                try:
                    rt.memset_async(ptr, 1 << 16, 1, 1 << 16, s)
                except rt.AclError as e:
                    failures.append(e.code)
                    return
        t = threading.Thread(target=enqueue)
        t.start()
        time.sleep(0.005)
        rt.destroy_stream(s)
        t.join(5)
        stop.clear()
    assert set(failures) <= {rt.ACL_ERROR_RT_INVALID_HANDLE}
    rt.synchronize_device()                  # nothing got lost on the way, the context still works
    rt.memset(ptr, 1 << 16, 7, 1 << 16)
    out = np.empty(1 << 16, np.uint8)
    rt.memcpy(out, out.nbytes, ptr, out.nbytes, rt.ACL_MEMCPY_DEVICE_TO_HOST)
    assert (out == 7).all()
    rt.free(ptr)


# ---------------------------------------------------------------- model files: regular files only, bounded
@pytest.mark.parametrize("path,code", [("/dev/zero", 100003), (None, 100000), (12, 100000), ("/", 100003)])
def test_load_from_file_refuses_what_is_not_a_regular_file(dev0, path, code):
    from rt import mdl
    start = time.monotonic()
    with pytest.raises(dev0.AclError) as e:
        mdl.load_from_file(path)
    assert e.value.code == code
    assert time.monotonic() - start < 5                    # /dev/zero used to read 4 GiB first


def test_load_from_file_on_a_fifo_does_not_block(dev0, tmp_path):
    from rt import mdl
    fifo = tmp_path / "model.om"
    os.mkfifo(fifo)
    with pytest.raises(dev0.AclError) as e:
        mdl.load_from_file(str(fifo))
    assert e.value.code == 100003 and "FIFO" in e.value.message


def test_a_config_that_is_a_fifo_is_refused(tmp_path):
    from rt.config import load_config
    from rt.errors import AclError
    fifo = tmp_path / "cfg.toml"
    os.mkfifo(fifo)
    with pytest.raises(AclError) as e:
        load_config(str(fifo))
    assert e.value.code == 100003 and "FIFO" in e.value.message


# ---------------------------------------------------------------- warnings raised on the card reach the host
def test_a_warning_inside_a_kernel_is_a_warning_of_the_enqueuing_process(dev0):
    from rt.card.queues import forward_warnings
    rt = dev0

    @rt.kernel
    def overflow(x, y):
        y[...] = np.exp(x * 1000)

    x = rt.Tensor.from_numpy(np.ones(4, np.float32))
    with pytest.warns(RuntimeWarning) as record:
        forward_warnings()                   # (pytest swaps showwarning per test; a card process keeps the hook)
        rt.launch_kernel(overflow, [x], [rt.empty(4)])
        rt.synchronize_device()
    assert [(str(w.message), w.filename) for w in record] == [
        ("overflow encountered in exp (in a kernel task)", "<card 0 (node 0)>")]


def test_descriptors_reach_the_message_they_were_sent_with():
    """A reply carrying an fd right behind one that does not (one recvmsg reads both), and a large reply whose
    fds arrive with its first bytes only: each message gets exactly its own descriptors."""
    import array
    import socket
    import threading
    from rt.wire import channel
    from rt.wire.protocol import pack

    def send(sock, msg, fds=()):
        if fds:
            sock.sendmsg([pack(msg)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            sock.sendall(pack(msg))

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    got, done = [], threading.Event()
    t = channel.SocketTransport.__new__(channel.SocketTransport)
    t.sock, t.closed, t.path = b, False, "test"
    t._on_message = lambda m, fds: (got.append((m[0], len(fds))), [os.close(f) for f in fds])
    t._on_close = done.set
    r, w = os.pipe()
    send(a, [1, "no fds"])
    send(a, [2, "one fd"], [r])                        # queued before the reader runs: read together with 1
    reader = threading.Thread(target=t._read, daemon=True)
    reader.start()
    send(a, [3, "x" * 3_000_000], [r, w])              # larger than one recvmsg
    send(a, [4, "no fds"])
    send(a, [5, "no fds"])
    send(a, [6, "one fd"], [w])
    a.close()
    assert done.wait(10)
    os.close(r)
    os.close(w)
    assert got == [(1, 0), (2, 1), (3, 2), (4, 0), (5, 0), (6, 1)]


def test_a_reply_the_wire_cannot_encode_fails_that_command_not_the_connection(tmp_path, monkeypatch):
    import rt
    monkeypatch.setattr(MemoryCommands, "c_mem_info", lambda self, conn: [2 ** 70, 1])     # past msgpack's 64 bits
    card = Card(capacity=8 << 20)
    path = str(tmp_path / "npu0_0.sock")
    server = CardServer(card, path)
    try:
        client = CardClient(lambda m, c: SocketTransport(path, m, c), name="card 0 (node 0)")
        with pytest.raises(rt.AclError) as e:
            client.call("mem_info")
        assert e.value.code == 507000 and "mem_info" in str(e.value) and "encoded" in str(e.value)
        assert client.call("ping") is True                 # the same connection still serves
        client.close()
    finally:
        server.close()
        card.close()
