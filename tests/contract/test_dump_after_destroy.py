"""rt.trace_dump after contexts were destroyed: their closed channels are not asked for task logs again (each
try waited for a card that could not answer: the contract sweep's trace_dump calls ran past the deadline)."""

from rt.diag.recorder import RECORDER


def test_trace_dump_does_not_ask_destroyed_contexts(dev0, tmp_path):
    rt = dev0
    clients = []
    for _ in range(3):
        ctx = rt.create_context(0)
        rt.launch_callback(lambda _: None, None, True, None)
        rt.synchronize_device()
        clients.append(ctx.client)
        assert id(ctx.client) in RECORDER.clients                   # the recorder knew it: it could ask it
        rt.destroy_context(ctx)
    asked = []
    for client in clients:
        client.call = lambda *a, _c=client, **kw: asked.append(_c) or (0, {})
    rt.set_device(0)
    assert rt.trace_dump(str(tmp_path / "dump.json"), "sweep").endswith("dump.json")
    assert asked == [] and not any(id(c) in RECORDER.clients for c in clients)   # released: never asked again
