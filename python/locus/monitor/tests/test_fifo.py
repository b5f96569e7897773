"""The control FIFO: all five commands written by another process-like writer against a
running engine, checked in the records written; bad lines; privacy; removal."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from locus.monitor import recordfile
from locus.monitor.engine import Monitor
from locus.monitor.fifo import ControlFifo, parse_command, private_dir
from locus.monitor.tests.fakes import Scripted, wait_for


def send(path: str, *lines: str) -> None:
    """Write like a script does (`echo ... > FIFO`): open, write, close."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, "".join(line + "\n" for line in lines).encode())
    finally:
        os.close(fd)


def records(path) -> list[dict]:
    return [json.loads(x) for x in open(path).read().splitlines()]


@pytest.mark.parametrize(
    "line,want",
    [
        ("label phase 2", ("label", "phase 2")),
        ("  label  two  words  ", ("label", "two  words")),
        ("record /tmp/x.jsonl", ("record", "/tmp/x.jsonl")),
        ("pause", ("pause", None)),
        ("resume", ("resume", None)),
        ("interval 20 ms", ("interval", 0.02)),
        ("interval 20ms", ("interval", 0.02)),
        ("interval 20", ("interval", 0.02)),
        ("interval 1s", ("interval", 1.0)),
        ("", ("", None)),
    ],
)
def test_parse_command(line, want):
    cmd, arg = parse_command(line)
    assert cmd == want[0]
    assert arg == pytest.approx(want[1]) if isinstance(want[1], float) else arg == want[1]


@pytest.mark.parametrize(
    "line", ["bogus", "label", "record", "pause now", "interval", "interval fast", "interval 0"]
)
def test_parse_command_refuses(line):
    with pytest.raises(ValueError):
        parse_command(line)


def test_all_five_commands_on_a_running_engine(tmp_path, capfd):
    m = Monitor(0.02, None, [Scripted()])
    fifo = ControlFifo(m, str(tmp_path / "ctl.fifo"))
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    got = []
    m.subscribe(got.append)
    m.start()
    try:
        send(fifo.path, f"record {one}")
        wait_for(lambda: fifo.handled == 1)
        wait_for(lambda: sum("v" in r for r in records(one)) >= 2)
        send(fifo.path, "label phase 2", "interval 50 ms")
        wait_for(lambda: fifo.handled == 3)
        send(fifo.path, "pause")
        wait_for(lambda: any(r.get("paused") is True for r in got))
        n = len(records(one))
        time.sleep(0.2)
        assert len(records(one)) == n  # paused: nothing written
        send(fifo.path, "resume", "interval 30ms", "label done", "bogus command")
        wait_for(lambda: fifo.handled == 7)
        wait_for(lambda: sum("v" in r for r in records(one)[n:]) >= 2)
        send(fifo.path, f"record {two}")
        wait_for(lambda: fifo.handled == 8)
        wait_for(lambda: sum("v" in r for r in records(two)) >= 1)
    finally:
        m.stop()
        fifo.close()
    recs = records(one)
    kinds = [recordfile.kind(r) for r in recs]
    assert kinds[0] == "header"
    control = [r for r in recs if recordfile.kind(r) not in ("sample", "header")]
    assert [{k: v for k, v in r.items() if k != "t"} for r in control] == [
        {"label": "phase 2"},
        {"interval_ms": 50},
        {"paused": True},
        {"paused": False},
        {"interval_ms": 30},
        {"label": "done"},
    ]
    # samples before the first interval change are ~20 ms apart, after it ~50 ms
    i50, i30 = recs.index(control[1]), recs.index(control[4])
    before = sorted(r["dt"] for r in recs[1:i50] if "v" in r)
    during = sorted(r["dt"] for r in recs[i50:i30] if "v" in r and r["t"] < control[2]["t"])
    assert before[len(before) // 2] < 0.035
    assert not during or during[len(during) // 2] > 0.04
    ts = [r["t"] for r in recs[1:]]
    assert ts == sorted(ts)
    h2 = records(two)[0]
    assert h2["format"] == "locus-monitor" and h2["interval_ms"] == 30
    err = capfd.readouterr().err
    assert "locus: warning: control FIFO: unknown command 'bogus'" in err
    assert not os.path.exists(fifo.path)  # removed at close


def test_record_refuses_a_foreign_file(tmp_path, capfd):
    precious = tmp_path / "notes.txt"
    precious.write_text("my notes\n")
    m = Monitor(1.0, None, [Scripted()])
    with ControlFifo(m, str(tmp_path / "ctl.fifo")) as fifo:
        fifo.handle(f"record {precious}")
        fifo.handle(f"record {tmp_path / 'nodir' / 'x.jsonl'}")
    assert precious.read_text() == "my notes\n"
    err = capfd.readouterr().err
    assert "is not a locus monitor recording" in err
    assert "no such directory" in err
    assert fifo.handled == 0


def test_fifo_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    m = Monitor(1.0, None, [Scripted()])
    fifo = ControlFifo(m)
    try:
        assert fifo.path == str(tmp_path / "locus" / f"monitor-{os.getpid()}.fifo")
        st = os.stat(fifo.path)
        assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "locus").st_mode) == 0o700
    finally:
        fifo.close()
    assert not os.path.exists(fifo.path)


def test_fallback_dir_and_foreign_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    d = private_dir()
    assert d == f"/tmp/locus-{os.getuid()}"
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/path")  # not absolute: ignored
    assert private_dir() == d


def test_long_lines_and_many_writers(tmp_path):
    m = Monitor(1.0, None, [Scripted()])
    got = []
    m.subscribe(got.append)
    with ControlFifo(m, str(tmp_path / "ctl.fifo")) as fifo:
        for i in range(50):
            send(fifo.path, f"label L{i}")
        wait_for(lambda: fifo.handled == 50)
    assert [r["label"] for r in got] == [f"L{i}" for i in range(50)]
