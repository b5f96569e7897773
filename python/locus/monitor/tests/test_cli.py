"""`locus monitor stat|record|live` and `locus record --lens monitor` as a user runs them:
output shape, exit statuses, one-line errors, the files written; the stat columns in
process with a scripted sensor (exact numbers)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from locus import cli
from locus.monitor import recordfile
from locus.monitor.engine import Monitor
from locus.monitor.stat import StatPrinter, fmt_value
from locus.monitor.tests import fakes
from locus.monitor.tests.fakes import Scripted

PYDIR = Path(__file__).resolve().parents[3]
RUNTIME = PYDIR.parent / "build" / "liblocus.so"
needs_runtime = pytest.mark.skipif(not RUNTIME.exists(), reason="no build/liblocus.so")


def env(**extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(PYDIR) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


def locus(*args, timeout=60, **kw):
    return subprocess.run(
        [sys.executable, "-m", "locus", *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
        **kw,
    )


def one_error(p, code=2, starts="locus: error: "):
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


def fifo_path(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("locus: control FIFO: "):
            return line.split(": ", 2)[2]
    raise AssertionError(f"no FIFO line in:\n{stderr}")


def wait_for(cond, timeout=20.0):
    fakes.wait_for(cond, timeout, poll=0.02)


# -- stat, in process ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "v,width,text",
    [(0, 5, "0"), (0.5, 5, "0.50"), (42.25, 5, "42.2"), (100.0, 5, "100"), (12345, 5, "12345"),
     (123456, 5, "123k"), (1.5e6, 5, "1.5M"), (-34122.0, 5, "-34k"), (-4.0, 5, "-4")],
)  # fmt: skip
def test_fmt_value(v, width, text):
    assert fmt_value(v, width) == text


def stat_lines(discrete: bool, n: int) -> list[str]:
    m = Monitor(0.5, ["fake:*"], [Scripted()])
    out = io.StringIO()
    p = StatPrinter(m, out=out, discrete=discrete)
    m.subscribe(p.on_record)
    m._prime()
    for _ in range(n):
        time.sleep(0.01)
        m.sample_once()
    m.label("half way")
    return out.getvalue().splitlines()


def test_stat_columns_discrete():
    lines = stat_lines(True, 3)
    assert lines[0].strip("- ") == "fake"
    assert lines[1].split() == ["up", "down", "level"]
    # --discrete: the change over each interval (+10, -4 per read); the gauge as read
    assert [x.split() for x in lines[2:5]] == [["10", "-4", "1"], ["10", "-4", "2"],
                                               ["10", "-4", "3"]]  # fmt: skip
    assert lines[5] == "# label half way"


def test_stat_rates_and_repeated_headings():
    lines = stat_lines(False, 21)
    rows = [x for x in lines if x and x[0] != "#" and not x.strip().startswith(("-", "up"))]
    assert len(rows) == 21
    up = float(rows[0].split()[0])
    assert 10 / 0.5 < up < 10 / 0.005  # a rate per second over ~10 ms, not a count
    assert sum(1 for x in lines if x.split() == ["up", "down", "level"]) == 2  # every 20


# -- stat and record as commands -------------------------------------------------------------


def test_stat_count_prints_headings_and_rows():
    p = locus("monitor", "stat", "--count", "3", "--interval", "50ms")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 5
    assert "vmstat" in lines[0] and "cpu" in lines[0]
    assert lines[1].split()[:2] == ["hit", "miss"]
    assert len(lines[2].split()) == len(lines[1].split())
    assert not os.path.exists(fifo_path(p.stderr))


def test_stat_list():
    p = locus("monitor", "stat", "--list")
    assert p.returncode == 0, p.stderr
    assert " *vmstat::numa_miss" in p.stdout
    assert "cpu:cpu0:user" in p.stdout and "psi::" in p.stdout
    assert "* = enabled by default" in p.stdout
    for name in ("vmstat", "numastat", "cpu", "psi", "perf", "pmu"):
        assert f"\n{name}: " in "\n" + p.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["monitor", "stat", "--events", "vmstat::bogus"], "unknown event 'vmstat::bogus'"),
        (["monitor", "stat", "--interval", "fast"], "bad interval 'fast'"),
        (["monitor", "stat", "--interval", "0"], "out of range"),
        (["monitor", "stat", "--count", "0"], "must be positive"),
        (["monitor"], "the following arguments are required"),
        (["monitor", "record"], "-o/--output"),
        (["monitor", "record", "-o", "x.jsonl", "--"], "no command after --"),
        (["monitor", "record", "-o", "/no/such/dir/x.jsonl"], "no such directory"),
        (["monitor", "bogus"], "invalid choice"),
    ],
)
def test_bad_input_is_one_error_line(args, message):
    assert message in one_error(locus(*args))


def test_record_refuses_to_overwrite_a_foreign_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("precious\n")
    assert "not a locus monitor recording" in one_error(
        locus("monitor", "record", "-o", str(f), "--", "true")
    )
    assert f.read_text() == "precious\n"


def test_record_command_not_found(tmp_path):
    p = locus("monitor", "record", "-o", str(tmp_path / "m.jsonl"), "--", "no-such-cmd-xyz")
    one_error(p, 127)


def test_record_runs_the_command_and_takes_its_status(tmp_path):
    out = tmp_path / "m.jsonl"
    script = 'echo "label from the command" > "$LOCUS_MONITOR_FIFO"; sleep 0.4; exit 3'
    p = locus("monitor", "record", "-o", str(out), "--interval", "50ms", "--", "sh", "-c", script)
    assert p.returncode == 3, p.stderr
    header, recs = recordfile.load(str(out))
    assert header["interval_ms"] == 50
    assert any(r.get("label") == "from the command" for r in recs)
    samples = [r for r in recs if "v" in r]
    assert len(samples) >= 4
    assert set(samples[0]["v"]) <= {e["id"] for e in header["events"]}
    assert not os.path.exists(fifo_path(p.stderr))


def test_record_command_killed_by_a_signal(tmp_path):
    p = locus("monitor", "record", "-o", str(tmp_path / "m.jsonl"), "--", "sh", "-c",
              "kill -TERM $$")  # fmt: skip
    assert p.returncode == 128 + signal.SIGTERM, p.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_record_until_signal(tmp_path, sig):
    out = tmp_path / "m.jsonl"
    p = subprocess.Popen(
        [sys.executable, "-m", "locus", "monitor", "record", "-o", str(out), "--interval",
         "20ms", "--events", "vmstat::numa_*,cpu::ctxt"],
        env=env(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: out.exists() and out.read_text().count('"v"') >= 3)
        p.send_signal(sig)
        _, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    header, recs = recordfile.load(str(out))
    assert [e["id"] for e in header["events"]][-1] == "cpu::ctxt"
    assert "samples written to" in err
    assert not os.path.exists(fifo_path(err))


def test_live_options_parse():
    ns = cli.build_parser().parse_args(["monitor", "live"])
    assert (ns.bind, ns.port, ns.interval, ns.events) == ("127.0.0.1", 0, 0.1, None)
    assert ns.handler is cli.cmd_monitor_live
    ns = cli.build_parser().parse_args(
        ["monitor", "live", "--bind", "0.0.0.0", "--port", "8080", "--interval", "1s",
         "--events", "vmstat,psi::cpu_*"]
    )  # fmt: skip
    assert (ns.bind, ns.port, ns.interval, ns.events) == (
        "0.0.0.0", 8080, 1.0, ["vmstat", "psi::cpu_*"]
    )  # fmt: skip


# -- locus record --lens monitor --------------------------------------------------------------


@needs_runtime
def test_record_lens_monitor(tmp_path):
    run = tmp_path / "run"
    script = 'echo "label phase 2" > "$LOCUS_MONITOR_FIFO"; sleep 0.3'
    p = locus("record", "--lens", "locks,monitor", "--monitor-interval", "50ms", "-o",
              str(run), "--", "sh", "-c", script)  # fmt: skip
    assert p.returncode == 0, p.stderr
    meta = json.loads((run / "meta.json").read_text())
    mo = meta["monitor"]
    assert mo["interval_ms"] == 50 and mo["file"] == "monitor.jsonl"
    assert "vmstat::numa_hit" in mo["events"] and mo["samples"] >= 3
    assert meta["lenses"] == ["locks", "monitor"]
    assert meta["env"]["LOCUS_MONITOR_FIFO"] == mo["fifo"] == fifo_path(p.stderr)
    header, recs = recordfile.load(str(run / "monitor.jsonl"))
    assert [e["id"] for e in header["events"]] == mo["events"]
    assert [r["label"] for r in recs if "label" in r] == ["phase 2"]
    rep = locus("report", str(run), "--lens", "monitor", "--format", "json")
    assert rep.returncode == 0, rep.stderr
    m = json.loads(rep.stdout)["lenses"]["monitor"]
    assert m["labels"][0]["label"] == "phase 2" and 0 <= m["labels"][0]["t_s"] < 5
    ev = {r["id"]: r for r in m["events"]}
    assert ev["cpu::user"]["samples"] == mo["samples"]
    assert 0 <= ev["cpu::idle"]["mean"] <= 100
    text = locus("report", str(run))
    assert text.returncode == 0 and "monitor   " in text.stdout


def test_monitor_options_need_the_lens(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["record", "--monitor-interval", "10ms", "--", "true"])
    assert e.value.code == 2
    assert "add --lens monitor" in capsys.readouterr().err


@needs_runtime
def test_record_lens_monitor_bad_event_leaves_no_run(tmp_path):
    run = tmp_path / "run"
    p = locus("record", "--lens", "monitor", "--monitor-events", "nope::x", "-o", str(run),
              "--", "true")  # fmt: skip
    assert "unknown event 'nope::x'" in one_error(p)
    assert not run.exists()


@needs_runtime
def test_record_lens_monitor_refused_run_dir_leaves_no_fifo(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    p = subprocess.run(
        [sys.executable, "-m", "locus", "record", "--lens", "monitor", "-o", str(busy), "--",
         "true"],
        capture_output=True, text=True, timeout=60, env=env(XDG_RUNTIME_DIR=str(tmp_path)),
    )  # fmt: skip
    assert "not a locus run" in one_error(p)
    assert os.listdir(tmp_path / "locus") == []  # the FIFO was made, then removed
