"""The card's dispatch (``rt/card/card.py``): every command and task is named in a part's table, a name no
table has fails with the same code and text as always, and extensions serve theirs through their own tables.
Plain in-process cards: no Ray, no sockets."""

from __future__ import annotations

import textwrap
import time

import pytest

from rt.card.card import Card
from rt.wire.protocol import CALL, TASK

PARAM_INVALID, FEATURE_NOT_SUPPORT = 107000, 207000


class _Sink:
    def __init__(self):
        self.msgs = []

    def __call__(self, msg, fds=()):
        self.msgs.append(msg)

    def reply(self, tag, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.msgs:
                if m[0] == tag:
                    return m
            time.sleep(0.01)
        raise AssertionError(f"no reply {tag}: {self.msgs}")


@pytest.fixture
def card():
    c = Card(capacity=8 << 20)
    yield c
    c.close()


def _handlers(obj) -> set[str]:
    return {n for n in dir(type(obj)) if n.startswith(("c_", "t_")) and callable(getattr(obj, n))}


def test_every_handler_of_every_part_is_named_in_its_tables(card):
    for part in (card, card.memcmds, card.streamcmds, card.execcmds):
        tables = (card.commands, card.tasks) if part is card else (part.commands, part.tasks)
        named = {fn.__name__ for table in tables for fn in table.values() if getattr(fn, "__self__", None) is part}
        assert _handlers(part) == named, type(part).__name__
    for part in (card.memcmds, card.streamcmds, card.execcmds):
        assert all(card.commands[k] == v for k, v in part.commands.items())
        assert all(card.tasks[k] == v for k, v in part.tasks.items())
    assert all(fn.__name__.startswith("c_") for fn in card.commands.values())
    assert all(fn.__name__.startswith("t_") for fn in card.tasks.values())


def test_the_tables_are_built_once_per_card(card):
    """Handling a message builds nothing: the same table and the same bound handlers serve every call."""
    commands, tasks = card.commands, card.tasks
    before = dict(commands), dict(tasks)
    conn = card.connect(_Sink())
    for tag in range(1, 4):
        card.handle(conn, [CALL, tag, "mem_info", []])
        card.handle(conn, [TASK, 0, "sleep", [0]])
    assert card.commands is commands and card.tasks is tasks
    assert all(commands[k] is v for k, v in before[0].items()) and all(tasks[k] is v for k, v in before[1].items())
    other = Card(capacity=8 << 20)
    try:
        assert card.commands["malloc"].__self__ is card.memcmds
        assert other.commands["malloc"].__self__ is other.memcmds      # per card: bound to its own parts
    finally:
        other.close()


def test_an_unknown_command_fails_that_command_only(card):
    sink = _Sink()
    conn = card.connect(sink)
    card.handle(conn, [CALL, 1, "no_such_command", []])
    card.handle(conn, [CALL, 2, "nosuch", []])
    card.handle(conn, [CALL, 3, "ping", []])
    assert sink.msgs == [[1, False, ["acl", PARAM_INVALID, "unknown card command 'no_such_command'"]],
                         [2, False, ["acl", PARAM_INVALID, "unknown card command 'nosuch'"]],
                         [3, True, True]]


def test_an_unknown_task_fails_at_the_next_synchronize(card):
    sink = _Sink()
    conn = card.connect(sink)
    card.handle(conn, [TASK, 0, "no_such_task", []])
    card.handle(conn, [CALL, 1, "stream_sync", [0, 1]])
    reply = sink.reply(1)
    assert reply[1] is False and reply[2][1] == PARAM_INVALID and "unknown card task 'no_such_task'" in reply[2][2]


def test_a_card_without_a_handler_answers_unknown():
    """A card whose class leaves a command out (``c_usage = None``: a card older than npu-smi) says so."""
    class OldCard(Card):
        c_usage = None

    card = OldCard(capacity=8 << 20)
    try:
        sink = _Sink()
        card.handle(card.connect(sink), [CALL, 1, "usage", []])
        assert sink.msgs == [[1, False, ["acl", PARAM_INVALID, "unknown card command 'usage'"]]]
    finally:
        card.close()


EXTENSION = '''
from rt.card.dispatch import DEFERRED
from rt.card.extension import Extension


class Echo(Extension):
    def __init__(self, card):
        super().__init__(card)
        self.commands = {"echo_say": self.c_say, "echo_later": self.c_later}
        self.tasks = {"echo_mark": self.t_mark}
        self.marks = []
        self.released = []

    def c_say(self, conn, text):
        return f"{self.card.where}: {text}"

    def c_later(self, conn, req):
        self.card.reply_later(conn, req, None, "later")
        return DEFERRED

    def t_mark(self, conn, stream, value):
        return lambda: self.marks.append(value)

    def release_owner(self, conn):
        self.released.append(conn.id)


class Stray(Echo):
    def __init__(self, card):
        super().__init__(card)
        self.commands = dict(self.commands, say=self.c_say)
'''


@pytest.fixture
def echo_module(tmp_path, monkeypatch):
    (tmp_path / "npusim_echo_ext.py").write_text(textwrap.dedent(EXTENSION))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "npusim_echo_ext"


def test_an_extension_serves_the_names_in_its_tables(card, echo_module):
    sink = _Sink()
    conn = card.connect(sink)
    card.handle(conn, [CALL, 1, "extensions", [{"echo": f"{echo_module}:Echo"}]])
    card.handle(conn, [CALL, 2, "echo_say", ["hi"]])
    card.handle(conn, [CALL, 3, "echo_later", [3]])
    card.handle(conn, [TASK, 0, "echo_mark", [7]])
    card.handle(conn, [CALL, 4, "stream_sync", [0, 4]])
    card.handle(conn, [CALL, 5, "echo_nosuch", []])                  # declared prefix, name not in its table
    card.handle(conn, [CALL, 6, "other_say", ["hi"]])                # a prefix nobody declared
    assert sink.reply(4)[:2] == [4, True]
    assert sink.msgs[:3] == [[1, True, None], [2, True, "card 0 (node 0): hi"], [3, True, "later"]]
    assert sink.reply(5) == [5, False, ["acl", PARAM_INVALID, "unknown card command 'echo_nosuch'"]]
    assert sink.reply(6) == [6, False, ["acl", PARAM_INVALID, "unknown card command 'other_say'"]]
    ext = card.extension("echo")
    assert ext.marks == [7]
    card.disconnect(conn)
    assert ext.released == [conn.id]


def test_an_extension_naming_commands_outside_its_prefix_is_refused(card, echo_module):
    sink = _Sink()
    conn = card.connect(sink)
    card.handle(conn, [CALL, 1, "extensions", [{"echo": f"{echo_module}:Stray"}]])
    card.handle(conn, [CALL, 2, "echo_say", ["hi"]])
    kind, code, text = sink.reply(2)[2]
    assert code == FEATURE_NOT_SUPPORT and "outside its prefix: ['say']" in text


def test_an_extension_that_cannot_be_loaded_says_so(card):
    sink = _Sink()
    conn = card.connect(sink)
    card.handle(conn, [CALL, 1, "extensions", [{"nope": "npusim_no_such_module:Ext"}]])
    card.handle(conn, [CALL, 2, "nope_x", []])
    kind, code, text = sink.reply(2)[2]
    assert code == FEATURE_NOT_SUPPORT and "card extension 'nope'" in text and "cannot be loaded" in text
