"""The command line: argument errors, exit codes, one-line errors, no tracebacks.

Most tests run `python -m locus` in a subprocess, as a user would. The ones that record a
real program need build/liblocus.so (`make build`) and are skipped without it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from locus import cli

PYDIR = Path(__file__).resolve().parents[2]
REPO = PYDIR.parent
RUNTIME = REPO / "build" / "liblocus.so"

needs_runtime = pytest.mark.skipif(
    not RUNTIME.exists(), reason="build/liblocus.so not built (make build)"
)


def run_locus(*args, env_extra=None, cwd=None, timeout=60, **kw):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PYDIR) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("LOCUS_RUNTIME", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "locus", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        **kw,
    )


def assert_one_error_line(p, code):
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("locus: error: ")
    assert "Traceback" not in p.stderr


# -- parsing (in process) ------------------------------------------------------------------


def test_help_is_as_wide_as_the_terminal_says(capsys, monkeypatch):
    """The parsers size their help as shutil would ($COLUMNS, else the terminal, else 80)
    without importing it: argparse's own formatter imports shutil (and its bz2 and lzma) at
    every add_argument, ~1.6 ms of every `locus record`."""
    widths = {}
    for columns in ("50", "120"):
        monkeypatch.setenv("COLUMNS", columns)
        with pytest.raises(SystemExit):
            cli.main(["record", "--help"])
        widths[columns] = max(len(ln) for ln in capsys.readouterr().out.splitlines())
    assert widths["50"] <= 48 < widths["120"] <= 118, widths
    code = "import sys; from locus import cli; cli.build_parser('record')\n"
    code += "print('shutil' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout


def test_unknown_option_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["record", "--bogus", "--", "true"])
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["record", "--lens", "comm", "--bogus", "--", "true"], "record"),
        (["report", "RUN", "--bogus"], "report"),
        (["compare", "A", "B", "--bogus"], "compare"),
        (["doctor", "--bogus"], "doctor"),
    ],
)
def test_unknown_option_is_the_commands_error(capsys, argv, command):
    """docs/cli.md: the command's usage line, then `locus COMMAND: error: ...`; it was the
    top-level `usage: locus [-h] [--version] COMMAND ...` and `locus: error: ...`."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: locus {command} "), err
    assert err.rstrip().endswith(f"locus {command}: error: unrecognized arguments: --bogus"), err


def test_unknown_option_before_the_command_is_the_top_levels(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--bogus", "report", "RUN"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: locus [-h]") and "locus: error: unrecognized arguments" in err


def test_unknown_monitor_option_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["monitor", "stat", "--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "locus: error: locus monitor stat: unrecognized arguments: --bogus\n", err


@pytest.mark.parametrize("value", ["-5ms", "-3", "-0.5ms", "-.5us", "0ms"])
@pytest.mark.parametrize("joined", [False, True])
def test_negative_period_must_be_positive(capsys, value, joined):
    """`--period -5ms` was "expected one argument": argparse took -5ms for an option."""
    opts = [f"--period={value}"] if joined else ["--period", value]
    with pytest.raises(SystemExit) as e:
        cli.main(["record", "--lens", "comm", *opts, "--", "true"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: locus record ")
    assert f"locus record: error: argument --period: must be positive: '{value}'" in err, err


def test_negative_values_still_reach_the_program():
    """After the command (or --), a word like -5ms is the program's."""
    ns = cli.build_parser().parse_args(["record", "--lens", "comm", "prog", "--period", "-5ms"])
    assert ns.cmd == ["prog", "--period", "-5ms"] and ns.period is None
    ns = cli.build_parser().parse_args(["record", "--", "prog", "-5ms"])
    assert ns.cmd == ["--", "prog", "-5ms"]


def test_unknown_subcommand_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["frobnicate"])
    assert e.value.code == 2


def test_unknown_lens_lists_known(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["record", "--lens", "locks,bogus", "--", "true"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "known lenses: locks" in err


def test_planned_lens_says_planned(capsys):
    with pytest.raises(SystemExit):
        cli.main(["record", "--lens", "memtrace", "--", "true"])
    assert "planned" in capsys.readouterr().err


def test_record_without_command_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["record"])
    assert e.value.code == 2


def test_bad_sample_interval(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["record", "--sample-interval", "0", "--", "true"])
    assert e.value.code == 2


def test_report_namespace_attributes():
    ns = cli.build_parser().parse_args(
        ["report", "R", "--format", "json", "--top", "5", "--min-wait", "0.1", "--lock", "x"]
    )
    for attr in ("run", "lens", "format", "top", "min_wait", "min_hold", "lock", "site"):
        assert hasattr(ns, attr)
    assert (ns.run, ns.lens, ns.format, ns.top, ns.min_wait) == ("R", None, "json", 5, 0.1)


def test_compare_namespace_attributes():
    ns = cli.build_parser().parse_args(
        ["compare", "A", "B", "--fail-if", "x > 1", "--fail-if", "y < 2"]
    )
    assert ns.runs == ["A", "B"] and ns.fail_if == ["x > 1", "y < 2"] and ns.format == "text"


def test_compare_needs_two_runs(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", str(tmp_path)])
    assert e.value.code == 2


def test_report_missing_dir_is_one_line(capsys, tmp_path):
    assert cli.main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("locus: error: ") and err.count("\n") == 1


def test_record_options_reach_launcher(monkeypatch):
    from locus import launcher

    seen = {}

    def fake_record(cmd, **kw):
        seen.update(kw, cmd=cmd)
        return 7

    monkeypatch.setattr(launcher, "record", fake_record)
    rc = cli.main(
        ["record", "-o", "D", "--call-stack", "--sample-interval", "2.5", "--time-all",
         "--", "prog", "-x", "--y"]
    )  # fmt: skip
    assert rc == 7
    assert seen == {
        "cmd": ["prog", "-x", "--y"],
        "out": "D",
        "lenses": ["locks"],
        "call_stack": True,
        "sample_interval_ms": 2.5,
        "time_all": True,
    }


# -- the launcher's refusals (subprocess) ---------------------------------------------------


def test_missing_command_127():
    p = run_locus("record", "--", "locus-no-such-command-xyz")
    assert_one_error_line(p, 127)
    assert "locus-no-such-command-xyz: command not found" in p.stderr


def test_not_executable_126(tmp_path):
    f = tmp_path / "data.txt"
    f.write_text("hello\n")
    p = run_locus("record", "--", str(f))
    assert_one_error_line(p, 126)


def test_missing_runtime_is_clear(tmp_path):
    p = run_locus(
        "record", "-o", str(tmp_path / "run"), "--", "true",
        env_extra={"LOCUS_RUNTIME": str(tmp_path / "missing.so")},
    )  # fmt: skip
    assert_one_error_line(p, 1)
    assert "make build" in p.stderr
    assert not (tmp_path / "run").exists()


def test_static_binary_refused(tmp_path):
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("gcc not installed")
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "s"
    c = subprocess.run([gcc, "-static", "-o", str(exe), str(src)], capture_output=True)
    if c.returncode != 0:
        pytest.skip("gcc -static does not work here (no static libc)")
    p = run_locus("record", "-o", str(tmp_path / "run"), "--", str(exe))
    assert_one_error_line(p, 2)
    assert "statically linked" in p.stderr and "relink it dynamically" in p.stderr


def test_nonempty_foreign_dir_refused(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    p = run_locus("record", "-o", str(d), "--", "true")
    assert_one_error_line(p, 2)
    assert (d / "thesis.tex").read_text() == "precious"


# -- real recordings (need the runtime) ----------------------------------------------------


@needs_runtime
def test_record_writes_complete_meta(tmp_path):
    run = tmp_path / "run"
    p = run_locus("record", "-o", str(run), "--", "sh", "-c", "echo out; exit 3")
    assert p.returncode == 3
    assert p.stdout == "out\n"  # the program's stdout is untouched
    assert p.stderr.strip().splitlines()[-1].startswith(f"locus: run written to {run}")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["complete"] is True
    assert meta["exit_status"] == 3 and meta["signal"] is None
    assert meta["command"] == ["sh", "-c", "echo out; exit 3"]
    assert meta["lenses"] == ["locks"] and meta["backends"] == {"locks": "interpose"}
    assert meta["end_ns"] >= meta["start_ns"] and meta["duration_s"] >= 0
    assert meta["env"]["LOCUS_LENSES"] == "locks" and "PATH" not in meta["env"]
    assert meta["host"]["cpus"] >= 1 and meta["host"]["kernel"]
    assert meta["sampler"]["cpu_s"] >= 0 and meta["sampler"]["error"] is None
    assert (run / "procs").is_dir() and os.listdir(run / "procs")
    assert (run / "sched.bin").stat().st_size % 32 == 0


@needs_runtime
def test_rerecord_replaces_a_run(tmp_path):
    run = tmp_path / "run"
    assert run_locus("record", "-o", str(run), "--", "true").returncode == 0
    (run / "stale").write_text("x")
    assert run_locus("record", "-o", str(run), "--", "true").returncode == 0
    assert not (run / "stale").exists()


@needs_runtime
def test_default_dir_name_and_suffix(tmp_path):
    for _ in range(2):
        p = run_locus("record", "--", "true", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2 and all(n.startswith("locus-true-") for n in names)


@needs_runtime
def test_child_killed_by_signal(tmp_path):
    run = tmp_path / "run"
    p = run_locus("record", "-o", str(run), "--", "sh", "-c", "kill -TERM $$")
    assert p.returncode == 128 + 15
    meta = json.loads((run / "meta.json").read_text())
    assert meta["exit_status"] == 143 and meta["signal"] == "SIGTERM"
    # sh sets SIGTERM to SIG_DFL itself: that keeps the runtime's finishing handler (it is
    # the default action, records finished first), so the run is complete. It was cut, and
    # the run incomplete, while the runtime let SIG_DFL replace its handler.
    assert meta["complete"] is True


@needs_runtime
def test_child_sigkill_leaves_meta(tmp_path):
    run = tmp_path / "run"
    p = run_locus("record", "-o", str(run), "--", "sh", "-c", "kill -KILL $$")
    assert p.returncode == 137
    meta = json.loads((run / "meta.json").read_text())
    assert meta["signal"] == "SIGKILL" and meta["complete"] is False


@needs_runtime
@pytest.mark.parametrize("sig,name", [(15, "SIGTERM"), (2, "SIGINT"), (1, "SIGHUP")])
def test_signals_are_forwarded(tmp_path, sig, name):
    run = tmp_path / "run"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PYDIR)
    # The child traps the signal and exits 42: proof it got it, and the launcher survived.
    script = f"trap 'exit 42' {name[3:]}; touch {tmp_path}/ready; while :; do sleep 0.05; done"
    proc = subprocess.Popen(
        [sys.executable, "-m", "locus", "record", "-o", str(run), "--", "sh", "-c", script],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its group is killed if the test fails
    )
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline, "child never started"
            time.sleep(0.02)
        time.sleep(0.1)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=20)
    finally:
        # A launcher that timed out (a loaded machine) left the looping child behind, and
        # it disturbed the tests after it (the runtime check's spin read 46 % of its
        # samples on the word for its 50 %).
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 42, err
    meta = json.loads((run / "meta.json").read_text())
    assert meta["exit_status"] == 42 and meta["signals_forwarded"] == [name]
    assert "Traceback" not in err


@needs_runtime
def test_terminal_ctrl_c_reaches_child_once(tmp_path):
    """^C on a terminal signals the whole foreground group: no second copy from locus."""
    import pty

    if not shutil.which("setsid"):
        pytest.skip("setsid (util-linux) not installed")
    master, slave = pty.openpty()
    script = (
        f"n=0; trap 'n=$((n+1))' INT; touch {tmp_path}/ready; i=0; "
        f"while [ $i -lt 20 ]; do sleep 0.05; i=$((i+1)); done; echo $n > {tmp_path}/count"
    )
    env = dict(os.environ, PYTHONPATH=str(PYDIR))
    argv = [sys.executable, "-m", "locus", "record", "-o", str(tmp_path / "run"), "--"]
    # setsid -c makes the pty the controlling terminal of a new session, in the foreground.
    p = subprocess.Popen(
        ["setsid", "-w", "-c", *argv, "sh", "-c", script],
        stdin=slave, stdout=slave, stderr=slave, env=env,
    )  # fmt: skip
    os.close(slave)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline and p.poll() is None, "child never started"
            time.sleep(0.02)
        time.sleep(0.1)
        os.write(master, b"\x03")
        p.wait(timeout=30)
    finally:
        if p.poll() is None:  # setsid made the launcher a group leader: the child too
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        os.close(master)
    assert (tmp_path / "count").read_text().strip() == "1"
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["signals_received"] == ["SIGINT"] and meta["signals_forwarded"] == []


@needs_runtime
def test_a_program_exec_d_without_the_preload_is_named(tmp_path):
    """`env -u LD_PRELOAD prog`: only env was recorded, silently, and its 1.9 ms of runtime
    start-up read '200 % of thread time' (the start-up counted twice, and before the
    process's start). Now a warning names the exec, and the share is at most the whole."""
    run = tmp_path / "run"
    p = run_locus("record", "-o", str(run), "--", "env", "-u", "LD_PRELOAD", "true")
    assert p.returncode == 0
    assert "exec'd a program the runtime did not record" in p.stderr, p.stderr
    q = run_locus("record", "-o", str(tmp_path / "ok"), "--", "env", "true")
    assert "did not record" not in q.stderr, q.stderr
    from locus.report import overhead
    from locus.rundir import RunDir

    for r in (run, tmp_path / "ok"):
        ov = overhead(RunDir.open(str(r)))
        assert 0 < ov["runtime_s"] <= 1.02 * ov["thread_time_s"], ov


def test_bind_to_a_cpu_that_is_not_here(capsys):
    """`--bind 7` on 2 CPUs was accepted and bound nothing."""
    cpus = sorted(os.sched_getaffinity(0))
    assert cli.main(["record", "--lens", "comm", "--bind", str(cpus[-1] + 1), "--", "true"]) == 2
    assert f"CPU {cpus[-1] + 1} is not available here" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--period", "9" * 400 + "s", "at most 60s"),  # was a traceback (float infinity)
        ("--period", "1" + "0" * 30 + "ns", "at most 60s"),  # was taken modulo 2^64
        ("--period", str(1 << 41), "events per sample"),
        ("--bulletin-size", str(1 << 30), "at most 4194304 entries"),  # could not be mapped
        ("--bind", "1-0", "empty range of CPUs"),
        ("--bind", "0-999999999", "CPU numbers go up to"),  # was a list of a billion
    ],
)
def test_sampling_options_out_of_range(capsys, option, value, says):
    with pytest.raises(SystemExit) as e:
        cli.main(["record", "--lens", "comm", option, value, "--", "true"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


@needs_runtime
def test_output_that_cannot_be_written(tmp_path):
    """`locus report RUN > /dev/full` and with stdout closed were tracebacks."""
    run = tmp_path / "run"
    assert run_locus("record", "-o", str(run), "--", "true").returncode == 0
    env = dict(os.environ, PYTHONPATH=str(PYDIR))
    argv = [sys.executable, "-m", "locus", "report", str(run)]
    with open("/dev/full", "w") as full:
        p = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env)
    assert p.returncode == 1 and p.stderr.strip() == (
        "locus: error: cannot write the output: No space left on device"
    ), p.stderr
    closed = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", *argv], capture_output=True, text=True, env=env
    )
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr


@needs_runtime
def test_report_plot_to_an_empty_name_and_singular_counts(tmp_path):
    """`--plot ""` exited 0 and wrote nothing; the header said "1 threads in 1 process(es)"."""
    run = tmp_path / "run"
    assert run_locus("record", "-o", str(run), "--", "true").returncode == 0
    p = run_locus("report", str(run), "--plot", "")
    assert p.returncode == 2 and "--plot needs a directory" in p.stderr, p.stderr
    text = run_locus("report", str(run)).stdout
    assert "1 thread in 1 process," in text, text


@pytest.mark.parametrize(
    "argv",
    [
        ["record", "--lens", "comm", "--period", "2ms", "--", "prog", "-x"],
        ["record", "-o", "d", "--lens", "numa", "--", "prog"],
        ["report", "run", "--lens", "comm", "--by", "core", "--top", "3"],
        ["compare", "a", "b", "--fail-if", "wait > 1"],
        ["monitor", "stat", "--interval", "100ms", "--count", "2"],
        ["doctor", "--format", "json"],
    ],
)
def test_a_command_alone_parses_as_with_every_command(argv):
    """`locus CMD ...` builds CMD's parser alone (the others cost ~5 ms of every record's
    start): the same options, defaults and handler as with every command's parser."""

    def plain(ns):
        return {k: v for k, v in vars(ns).items() if k != "parser"}

    assert plain(cli.build_parser(argv[0]).parse_args(argv)) == plain(
        cli.build_parser().parse_args(argv)
    )
    with pytest.raises(SystemExit):
        cli.build_parser(argv[0]).parse_args([argv[0], "--no-such-option"])
