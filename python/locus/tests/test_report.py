"""`locus report` and `locus compare` on synthetic runs, through the CLI."""

import json

import pytest

from locus.cli import main
from locus.synth import SynthRun


def _write(tmp_path, name="r", scale=1.0, lenses=None):
    run = SynthRun(duration_s=1.0, lenses=lenses)
    p = run.proc(pid=5)
    p.thread(5, 0.0, 1.0)
    p.thread(6, 0.0, 1.0, parent=5)
    p.event("mutex", tid=5, lock=0x10, t_req=0.0, t_acq=0.0, t_rel=0.2 * scale)
    p.event("mutex", tid=6, lock=0x10, t_req=0.1, t_acq=0.2 * scale, t_rel=0.3 * scale, site=0x4010)
    p.self_ns = 2_000_000
    p.untimed_calls = 1000
    p.fastpath_ps = 5000
    for t in (0.0, 1.0):
        run.sample(t, 5, 5, t)
        run.sample(t, 5, 6, t / 2)
    return run.write(str(tmp_path / name))


def test_json_contract(tmp_path, capsys):
    path = _write(tmp_path)
    assert main(["report", path, "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for k in ("locus_version", "format_version", "run", "overhead", "lenses"):
        assert k in r
    for k in (
        "command",
        "start",
        "duration_s",
        "pids",
        "threads",
        "host",
        "complete",
        "exit_status",
    ):
        assert k in r["run"]
    assert r["overhead"]["runtime_s"] == pytest.approx(0.002 + 1000 * 5e-9)
    lk = r["lenses"]["locks"]
    s = lk["summary"]
    for k in (
        "acquisitions",
        "contended",
        "wait_s",
        "hold_s",
        "active_threads_avg",
        "dependency_loss_s",
        "lock_wait_loss_s",
        "unaccounted_loss_s",
    ):
        assert k in s
    assert set(s["critical_path"]) >= {"events", "wait_s", "hold_s"}
    assert set(lk["locks"][0]) >= {
        "id",
        "name",
        "address",
        "kind",
        "acquisitions",
        "contended",
        "wait_s",
        "max_wait_s",
        "hold_s",
        "max_hold_s",
        "critical_events",
        "critical_wait_s",
    }
    assert set(lk["sites"][0]) >= {
        "function",
        "file",
        "line",
        "lock",
        "acquisitions",
        "contended",
        "wait_s",
        "hold_s",
        "critical_wait_s",
    }
    assert set(lk["threads"][0]) >= {"tid", "acquisitions", "wait_s", "hold_s", "service_s"}
    assert "notes" in lk and "estimated" in lk


@pytest.mark.parametrize("fmt", ["text", "csv", "md"])
def test_formats(tmp_path, capsys, monkeypatch, fmt):
    monkeypatch.delenv("COLUMNS", raising=False)
    path = _write(tmp_path)
    assert main(["report", path, "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert "L1" in out
    if fmt == "text":
        assert max(len(line) for line in out.splitlines()) <= 80
        assert "ms" in out
    if fmt == "csv":
        assert out.startswith("# locks\nid,name,")
        assert "\n\n# sites\n" in out


def test_text_in_a_pipe_is_as_wide_as_columns_says(tmp_path, capsys, monkeypatch):
    """In a file or a pipe the text was 80 columns whatever COLUMNS said: long names and
    byte ranges were folded across lines."""
    path = _write(tmp_path)
    monkeypatch.setenv("COLUMNS", "150")
    assert main(["report", path]) == 0
    out = capsys.readouterr().out
    assert "wait%" in out  # a column kept from 100 columns on


def test_filters(tmp_path, capsys):
    path = _write(tmp_path)
    assert main(["report", path, "--format", "json", "--lock", "0x10"]) == 0
    r = json.loads(capsys.readouterr().out)["lenses"]["locks"]
    assert [x["address"] for x in r["locks"]] == ["0x10"]
    assert main(["report", path, "--format", "json", "--site", "0x4010"]) == 0
    r = json.loads(capsys.readouterr().out)["lenses"]["locks"]
    assert [x["address"] for x in r["sites"]] == ["0x4010"]
    assert main(["report", path, "--format", "json", "--min-wait", "5"]) == 0
    assert json.loads(capsys.readouterr().out)["lenses"]["locks"]["locks"] == []
    assert main(["report", path, "--lock", "nosuch"]) == 1
    assert "no lock matches" in capsys.readouterr().err


def test_lens_not_recorded(tmp_path, capsys):
    path = _write(tmp_path, lenses=["comm"])
    assert main(["report", path, "--lens", "locks"]) == 1
    err = capsys.readouterr().err
    assert "not recorded" in err and "comm" in err and "Traceback" not in err


def test_not_a_run_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert "not a locus run directory" in err and "\n" not in err


def test_compare_and_fail_if(tmp_path, capsys):
    a = _write(tmp_path, "a")
    b = _write(tmp_path, "b", scale=2.0)
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "locks.wait_s" in out and "%" in out
    assert main(["compare", a, b, "--fail-if", "locks.wait_s>+10%"]) == 1
    assert "locks.wait_s" in capsys.readouterr().err
    assert main(["compare", a, b, "--fail-if", "locks.contended>1000"]) == 0
    assert main(["compare", a, b, "--fail-if", "locks.hold_s<-5%"]) == 0
    capsys.readouterr()
    assert main(["compare", a, b, "--fail-if", "wait_s >> 3"]) == 2
    assert main(["compare", a, b, "--fail-if", "locks.nosuch>1"]) == 2
    assert main(["compare", a, b, "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    row = next(m for m in r["metrics"] if m["metric"] == "locks.wait_s")
    assert row["change_pct"][1] > 10


# (lens, run maker, file damaged): the records a lens sizes its tables by.
DAMAGED = [
    ("locks", "locks", "threads.bin"),
    ("locks", "locks", "locks.events.bin"),
    ("comm", "comm", "comm.events.bin"),
    ("comm", "comm", "comm.threads.bin"),
    ("numa", "numa", "comm.samples.bin"),
    ("numa", "numa", "numa.touch.bin"),
]


@pytest.mark.parametrize("lens,maker,name", DAMAGED)
def test_damaged_record_files_are_read_around(tmp_path, capsys, lens, maker, name):
    """A record file overwritten with 2 MB of noise: the report ran out of memory (a matrix
    sized by a random CPU, node or thread count: 941 GiB) or raised IndexError (a lock kind
    used as an index). Rows the runtime cannot have written are left out, with a note."""
    import glob
    import os

    import numpy as np

    from locus.synth_comm import false_sharing_run
    from locus.synth_numa import first_touch_run

    path = str(tmp_path / "r")
    if maker == "comm":
        false_sharing_run(path, threads=4, n=20)
    elif maker == "numa":
        first_touch_run(path, parallel_init=False)
    else:
        _write(tmp_path, "r")
    (pdir,) = glob.glob(os.path.join(path, "procs", "*"))
    noise = np.random.default_rng(7).integers(0, 256, 2_000_000, dtype=np.uint8).tobytes()
    with open(os.path.join(pdir, name), "wb") as f:
        f.write(noise)
    assert main(["report", path, "--lens", lens, "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)["lenses"][lens]
    if name != "threads.bin":  # threads.bin: its damaged slots are not threads
        assert any("damaged file" in n for n in r["notes"]), r["notes"]
    if lens == "comm":
        assert len(r["matrices"]["core"]["all"]) <= 64 and len(r["threads"]) <= 64


def test_handler_cost_says_its_sampling_error(tmp_path, capsys):
    """The samplers time one handler in 16 (runtime/comm/comm.c): the cost line gives the
    estimate's relative standard error, sqrt(2 x 15 / handlers), in the JSON and the text."""
    import math

    from locus.synth_comm import false_sharing_run

    path = str(tmp_path / "r")
    false_sharing_run(path, threads=4, n=20)  # 4 threads x 12 x 20 signals, no traps
    assert main(["report", path, "--lens", "comm", "--format", "json"]) == 0
    c = json.loads(capsys.readouterr().out)["lenses"]["comm"]
    assert c["counters"]["signals"] == 960
    assert c["overhead_rse"] == pytest.approx(math.sqrt(30 / 960))
    assert main(["report", path, "--lens", "comm"]) == 0
    assert "(±18 %) in the comm handlers" in capsys.readouterr().out


def test_comm_kind_counts_what_top_cuts_from():
    """--kind false --top 0 titled its table "(1 of 2; --top 0 for all)": the row --kind
    dropped was counted as one --top had cut."""
    from locus.report import Filters, filter_comm

    rows = [{"all": 5.0, "true": 5.0, "false": 0.0}, {"all": 3.0, "true": 0.0, "false": 3.0}]
    c = {"objects": rows, "lines": rows, "sites": rows, "notes": []}
    out = filter_comm(c, Filters(kind="false", top=0))
    assert out["shown"]["objects"] == out["total"]["objects"] == 1
    out = filter_comm(c, Filters(kind="all", top=1))
    assert out["shown"]["objects"] == 1 and out["total"]["objects"] == 2


def test_code_without_line_numbers_has_no_colon_zero():
    """A program built without -g: its sites read "work app.c:0"."""
    from locus.analysis.common import site_str

    assert site_str({"function": "work", "file": "/src/app.c", "line": 0}) == "work app.c"
    assert site_str({"function": "work", "file": "app.c", "line": 11}) == "work app.c:11"
    assert site_str({"function": "work", "file": "", "line": 0}) == "work"


def test_unknown_exit_status_reads_unknown():
    """A run whose end was never written (a full disk) said 'exit None'."""
    from locus.render.tables import summary_lines

    report = {
        "run": {"duration_s": 1.0, "command": ["app"], "complete": False, "threads": 1,
                "pids": [1], "exit_status": None, "signal": None},
        "overhead": {"runtime_s": 0.0, "thread_time_s": 1.0, "records": 0, "dropped": 0},
        "lenses": {},
    }  # fmt: skip
    assert "exit unknown" in summary_lines(report)[1]


def test_a_long_command_is_shortened():
    """`git grep PATTERN REV...` with 60 revisions took 60 lines of the header; it reads its
    first words and how many more there are."""
    from locus.render.tables import summary_lines
    from locus.render.units import command_line

    argv = ["git", "grep", "-c", "x", *[f"{i:040x}" for i in range(60)]]
    report = {
        "run": {"duration_s": 1.0, "command": argv, "complete": True, "threads": 1,
                "pids": [1], "exit_status": 0, "signal": None},
        "overhead": {"runtime_s": 0.0, "thread_time_s": 1.0, "records": 0, "dropped": 0},
        "lenses": {},
    }  # fmt: skip
    head = summary_lines(report)[0]
    assert head.startswith("command   git grep -c x 0000") and head.endswith("(+56 more arguments)")
    assert len(head) < 240, head
    assert command_line(["./app", "8"]) == "./app 8" and command_line([]) == ""
    assert command_line(["./app", "a" * 80], 70) == "./app … (+1 more argument)"


@pytest.mark.parametrize("width", [80, 100, 110, 120, 140, 200])
def test_text_tables_never_cut_a_number(monkeypatch, width):
    """A table wider than the terminal: numbers and addresses are whole, names and code
    fold, and a derived column (code) is left out while it cannot fit. At 100-125 columns
    rich squeezed the comm lens's line table into `0x55f463…` and `79.0…` (and `…` for
    its objects and volumes)."""
    from locus.render import formats
    from locus.render.tables import Table

    site = "lll_mutex_unlock_optimized pthread_mutex_unlock.c:43 ← sysbench+0x1ba9a"
    rows = [
        dict(
            address=f"0x55f463eb{i:04x}",
            object_at="heap block from sysbench+0x1bb27 @+832",
            all=79.0 + i,
            true=66.0,
            false=13.0 + i,
            ranges="t1:16-19,32-35 t2:16-19,24-27 t3:16-19 t4:16-19",
            code="\n".join([site] * 4),
        )
        for i in range(3)
    ]
    vols = [("all", "s", "all"), ("true", "s", "true"), ("false", "s", "false")]
    cols = [("line", "", "address"), ("object", "", "object_at"), *vols]
    cols += [("bytes by thread", "", "ranges"), ("code", "", "code")]
    monkeypatch.setattr(formats, "_tables", lambda r: [Table("t", "Lines", cols, rows)])
    monkeypatch.setattr(formats, "_summary", lambda r: [])
    monkeypatch.setattr(formats, "_pictures", lambda r: [])
    out = formats.to_text({"lenses": {}}, width=width)
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= width
    assert "…" not in out
    for r in rows:
        assert r["address"] in out
        assert f"{r['all']:.1f} s" in out and f"{r['false']:.1f} s" in out
    # The code sites: shown where they fit (folded), else the column is left out whole.
    (header,) = [x for x in lines if x.startswith(" line ")]
    if width <= 100 or width >= 120:
        assert header.rstrip().endswith(" code") == (width >= 120)
