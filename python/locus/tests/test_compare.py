"""`locus compare`: every value with its unit (the comm volumes in each run's own)."""

from __future__ import annotations

import json

from locus.cli import main
from locus.synth_comm import SynthCommRun


def _comm_run(path: str, backend: str, count: int) -> str:
    """Two threads, `count` detections of false sharing (soft: 1 ms of CPU time each, exact:
    one cache line each)."""
    run = SynthCommRun(backend=backend)
    p = run.proc(pid=10)
    for i in range(2):
        p.thread(10 + i, 0.0, 1.0)
    run.comm(p).event(src=10, dst=11, line=0x601000, src_off=0, dst_off=8, count=count)
    return run.write(path)


def _row(out: str, metric: str) -> str:
    return next(ln for ln in out.splitlines() if ln.strip("| ").startswith(metric + " "))


def test_comm_volumes_carry_their_unit(tmp_path, capsys):
    """An exact run (lines) beside a soft one (seconds of CPU time) printed
    "comm.totals.all  2.24e+06  0.85": two bare numbers in different units."""
    x = _comm_run(str(tmp_path / "x"), "exact", 2_240_000)
    s = _comm_run(str(tmp_path / "s"), "soft", 850)
    assert main(["compare", x, s]) == 0
    out = capsys.readouterr().out
    for metric in ("comm.totals.all", "comm.totals.false"):
        row = _row(out, metric)
        assert "2.2 M lines" in row and "850 ms" in row, row
    assert "0 lines" in _row(out, "comm.totals.true")
    assert "KiB" in _row(out, "comm.totals.bytes") or "MiB" in _row(out, "comm.totals.bytes")
    assert main(["compare", s, x, "--format", "md"]) == 0
    row = _row(capsys.readouterr().out, "comm.totals.all")
    assert row.startswith("| comm.totals.all | 850 ms | 2.2 M lines |"), row


def test_same_unit_runs_keep_their_change(tmp_path, capsys):
    a = _comm_run(str(tmp_path / "a"), "exact", 100)
    b = _comm_run(str(tmp_path / "b"), "exact", 150)
    assert main(["compare", a, b]) == 0
    row = _row(capsys.readouterr().out, "comm.totals.all")
    assert "100 lines" in row and "150 lines (+50%)" in row, row
    assert main(["compare", a, b, "--format", "json"]) == 0
    rows = {r["metric"]: r for r in json.loads(capsys.readouterr().out)["metrics"]}
    assert rows["comm.totals.all"]["units"] == ["lines", "lines"]
    assert rows["comm.totals.all"]["values"] == [100.0, 150.0]  # raw, as before
    assert rows["run.duration_s"]["units"] == ["s", "s"]
    assert rows["comm.totals.detections"]["units"] == [None, None]


def test_cell_units():
    from locus.compare import _cell, metric_unit

    assert metric_unit("comm.totals.all", "s") == "s"
    assert metric_unit("comm.totals.false", "samples") == "samples"
    assert metric_unit("comm.totals.detections", "lines") is None
    assert metric_unit("locks.wait_s", None) == "s"
    assert _cell("comm.totals.all", 0.85, "s") == "850 ms"
    assert _cell("comm.totals.all", 12.0, "samples") == "12 samples"
    assert _cell("comm.totals.all", 1.5, "furlongs") == "1.5 furlongs"
    assert _cell("comm.totals.all", None, "s") == "n/a"
    assert _cell("comm.totals.bytes", 4096.0, "B") == "4.0 KiB"
