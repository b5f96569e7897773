"""The run-directory reader: validation, truncation, counts tables, clocks."""

import json
import os

import numpy as np
import pytest

from locus.errors import LocusError
from locus.rundir import LOCK_COUNT_DTYPE, LOCK_EVENT_DTYPE, PROC_DTYPE, RunDir
from locus.synth import START_NS, SynthRun


def _run(tmp_path, **kw):
    run = SynthRun(duration_s=1.0, **kw)
    p = run.proc(pid=7)
    p.thread(7, 0.0, 1.0)
    p.thread(8, 0.1, 0.9, parent=7)
    p.event("mutex", tid=7, lock=0x10, t_req=0.1, t_acq=0.2, t_rel=0.3)
    p.event("mutex", tid=8, lock=0x10, t_req=0.3, t_acq=0.3, t_rel=0.4)
    return run, str(tmp_path / "r")


def test_not_a_run(tmp_path):
    with pytest.raises(LocusError, match="not a locus run directory"):
        RunDir.open(str(tmp_path))
    with pytest.raises(LocusError, match="not a locus run directory"):
        RunDir.open(str(tmp_path / "missing"))


def test_bad_meta_and_newer_version(tmp_path):
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(LocusError, match="cannot be parsed"):
        RunDir.open(str(tmp_path))
    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(LocusError, match="version 99.*upgrade locus"):
        RunDir.open(str(tmp_path))


def test_corrupted_proc(tmp_path, capsys):
    """A damaged proc.bin (a full disk, a process killed at start) is left out with a
    warning: it made the whole run unreportable ("proc.bin is corrupted")."""
    run, path = _run(tmp_path)
    run.write(path)
    pbin = os.path.join(path, "procs", "7", "proc.bin")
    with open(pbin, "r+b") as f:
        f.write(b"XXXXXXXX")
    assert RunDir.open(path).procs == []
    assert "is damaged (bad magic or size): process 7 is left out" in capsys.readouterr().err
    with open(pbin, "r+b") as f:
        f.truncate(100)
    assert RunDir.open(path).procs == []


def test_read_events_threads_and_times(tmp_path):
    run, path = _run(tmp_path)
    r = RunDir.open(run.write(path))
    assert r.complete and r.lenses == ["locks"] and r.duration_s == 1.0
    (p,) = r.procs
    assert p.pid == 7 and p.complete
    ev = p.lock_events()
    assert len(ev) == 2
    assert np.allclose(p.seconds(ev["t_acq"]), [0.2, 0.3])
    assert np.allclose(p.thread_start_s, [0.0, 0.1])
    assert np.allclose(p.thread_end_s, [1.0, 0.9])


def test_tsc_clock_conversion(tmp_path):
    run, path = _run(tmp_path)
    run.write(path)
    pbin = os.path.join(path, "procs", "7", "proc.bin")
    h = np.fromfile(pbin, dtype=PROC_DTYPE)
    h["clock"] = 1
    h["tsc0"], h["tsc1"] = 10_000_000_000, 10_000_000_000 + 3_000_000_000  # 3 GHz
    h["ns0"], h["ns1"] = START_NS, START_NS + 1_000_000_000
    h.tofile(pbin)
    r = RunDir.open(path)
    assert np.allclose(r.procs[0].seconds(np.array([10_000_000_000 + 1_500_000_000])), [0.5])


def test_truncated_and_unused_records(tmp_path):
    """Unused records (a chunk's tail) are skipped. A partial record is no kill's (the
    runtime extends its files in whole chunks): the file was cut, and its remaining records
    read as a run with fewer (tests/integration/test_damaged_runs.py)."""
    run, path = _run(tmp_path)
    run.write(path)
    evf = os.path.join(path, "procs", "7", "locks.events.bin")
    with open(evf, "ab") as f:
        f.write(np.zeros(3, dtype=LOCK_EVENT_DTYPE).tobytes())  # unused chunk tail
    assert len(RunDir.open(path).procs[0].lock_events()) == 2
    with open(evf, "ab") as f:
        f.write(b"\x01" * 40)  # a partial record: the file was cut
    with pytest.raises(LocusError, match=r"is damaged: procs/7/locks.events.bin is 360 bytes"):
        RunDir.open(path)
    os.unlink(evf)
    assert len(RunDir.open(path).procs[0].lock_events()) == 0


def test_counts_keep_newest_generation(tmp_path):
    run, path = _run(tmp_path)
    run.write(path)
    cf = os.path.join(path, "procs", "7", "locks.counts.bin")
    old = np.fromfile(cf, dtype=LOCK_COUNT_DTYPE)
    t1 = old[old["serial"] == 1].copy()  # thread 7's table, generation 1
    newer = t1.copy()
    newer[0]["site"] = 2
    newer[1:][newer[1:]["kind"] != 0]["acquisitions"] = 0
    body = newer[1:]
    body["acquisitions"][body["kind"] != 0] = 5
    newer[1:] = body
    np.concatenate([old, newer]).tofile(cf)
    c = RunDir.open(path).procs[0].lock_counts()
    mine = c[c["serial"] == 1]
    assert len(mine) == 1 and int(mine["acquisitions"][0]) == 5
    assert (c["kind"] != 0xFFFF).all()


def test_incomplete_run(tmp_path):
    run, path = _run(tmp_path, complete=False)
    run.procs[0].flags = 0
    run.procs[0].end_s = None
    r = RunDir.open(run.write(path))
    assert not r.complete and not r.procs[0].complete
