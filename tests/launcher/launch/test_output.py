"""Line splitting, console routing/filtering, log files and the failure summary (pure, no processes)."""

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.agent.ranks import MAX_LINE, STDERR, STDOUT, LineSplitter
from launcher.launch.output import OutputRouter, failure_box, traceback_tail


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab\n\u00e9", max_size=30), max_size=20), st.data())
def test_splitter_yields_exactly_the_lines_whatever_the_chunking(pieces, data):
    text = "".join(pieces)
    raw = text.encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    splitter, lines = LineSplitter(), []
    for start, end in zip([0] + cuts, cuts + [len(raw)]):
        lines += splitter.feed(raw[start:end])  # cuts may split a multi-byte character: must not matter
    lines += splitter.flush()
    expected = text.split("\n")
    if expected[-1] == "":
        expected.pop()
    assert lines == expected


def test_splitter_bounds_an_endless_line():
    splitter = LineSplitter()
    out = splitter.feed(b"x" * (MAX_LINE * 2 + 10))
    assert out == ["x" * MAX_LINE] * 2
    assert splitter.flush() == ["x" * 10]


def test_router_prefixes_filters_by_local_rank_and_logs_everything(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    router = OutputRouter(nproc=2, ranks_filter=frozenset({1}), log_dir=tmp_path, tee=3, stdout=out, stderr=err)
    router.lines([(0, STDOUT, "a"), (1, STDOUT, "b"), (3, STDERR, "c"), (2, STDERR, "d"), (1, STDOUT, "")])
    router.close()
    assert out.getvalue() == "[rank1]:b\n[rank1]:\n"
    assert err.getvalue() == "[rank3]:c\n"
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "rank0.log": "a\n", "rank1.log": "b\n\n", "rank2.log": "d\n", "rank3.log": "c\n"}


def test_traceback_tail_takes_the_last_traceback():
    lines = ["noise", "Traceback (most recent call last):", "  old", "E: first",
             "more noise", "Traceback (most recent call last):", '  File "x.py", line 3', "ValueError: boom"]
    assert traceback_tail(lines) == lines[5:]
    assert traceback_tail(["a", "b"]) == ["a", "b"]
    long = ["Traceback (most recent call last):"] + [f"  frame {i}" for i in range(100)] + ["E: x"]
    tail = traceback_tail(long, limit=10)
    assert len(tail) == 10 and tail[0] == long[0] and tail[-1] == "E: x" and "omitted" in tail[3]


def test_failure_box_puts_root_cause_last_with_signal_name():
    root = {"rank": 5, "local_rank": 1, "node": 2, "host": "10.0.0.3", "pid": 42, "returncode": -9,
            "time": 0.0, "stderr_tail": []}
    other = {"rank": 1, "local_rank": 1, "node": 0, "pid": 7, "returncode": 3, "time": 1.0,
             "stderr_tail": ["Traceback (most recent call last):", "KeyError: 'k'"]}
    box = failure_box("train.py", [root, other])
    assert box.splitlines()[1] == "train.py FAILED"
    failures, cause = box.split("Root Cause (first observed failure):")
    assert "rank      : 1 (local_rank: 1)" in failures and "KeyError: 'k'" in failures
    assert "rank      : 5 (local_rank: 1)" in cause and "node      : 2 (10.0.0.3)" in cause
    assert "Signal 9 (SIGKILL) received by PID 42" in cause and "<nothing on stderr>" in cause
