"""Critical path on small constructed schedules whose critical sections are known."""

import numpy as np
import pytest

from locus.analysis.locks import analyze
from locus.rundir import RunDir
from locus.synth import SynthRun

L, M = 0x1000, 0x2000


def _analyze(tmp_path, run):
    res = analyze(RunDir.open(run.write(str(tmp_path / "run"))), _no_symbols())
    ev, cp = res["_events"], res["_critical_path"]
    return res, ev, cp


def _no_symbols():
    from locus.analysis.locks import Options

    return Options(symbols=False)


def _crit(ev, cp):
    """{(tid, t_acq rounded to ms)} of critical sections."""
    return {
        (int(t), round(float(a) * 1e3)) for t, a in zip(ev.tid[cp.critical], ev.t_acq[cp.critical])
    }


def test_chain_of_handoffs(tmp_path):
    # A holds L [0,100ms]; B requests at 10, gets it at 100, holds to 150; C requests at 20,
    # gets it at 150, holds to 160, then runs to 300 (the last to end). Main joins C.
    run = SynthRun(duration_s=0.31)
    p = run.proc(pid=10)
    p.thread(10, 0.0, 0.31)
    p.thread(11, 0.0, 0.2, parent=10)  # A
    p.thread(12, 0.0, 0.2, parent=10)  # B
    p.thread(13, 0.0, 0.3, parent=10)  # C
    p.event("mutex", tid=11, lock=L, t_req=0.0, t_acq=0.0, t_rel=0.1)
    p.event("mutex", tid=12, lock=L, t_req=0.01, t_acq=0.1, t_rel=0.15)
    p.event("mutex", tid=13, lock=L, t_req=0.02, t_acq=0.15, t_rel=0.16)
    p.event("mutex", tid=11, lock=M, t_req=0.12, t_acq=0.12, t_rel=0.13)  # off the path
    p.event("join", tid=10, obj=11, t_req=0.2, t_acq=0.2)
    p.event("join", tid=10, obj=13, t_req=0.2, t_acq=0.3)
    res, ev, cp = _analyze(tmp_path, run)
    assert _crit(ev, cp) == {(11, 0), (12, 100), (13, 150)}
    s = res["summary"]["critical_path"]
    assert s["events"] == 3
    assert abs(s["hold_s"] - 0.16) < 1e-9
    # Waits the path jumped through: C's 130 ms, B's 90 ms; main's join (100 ms) apart.
    assert abs(s["wait_s"] - (0.13 + 0.09)) < 1e-9
    assert abs(s["join_wait_s"] - 0.1) < 1e-9
    lock = next(r for r in res["locks"] if r["address"] == hex(L))
    assert lock["critical_events"] == 3
    assert abs(lock["critical_wait_s"] - 0.22) < 1e-9
    assert abs(lock["critical_hold_s"] - 0.16) < 1e-9
    assert abs(cp.length_s - 0.31) < 1e-9


def test_uncontended_lock_of_waiting_thread_is_not_critical(tmp_path):
    # Main waits on a join while a worker works; main's earlier section is not on the path
    # because the path goes from main's join to the worker, whose start is main's create.
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=20)
    p.thread(20, 0.0, 1.0)
    p.thread(21, 0.1, 0.9, parent=20)
    p.event("create", tid=20, obj=21, t_req=0.1)
    p.event("mutex", tid=20, lock=L, t_req=0.2, t_acq=0.2, t_rel=0.3)
    p.event("mutex", tid=21, lock=M, t_req=0.5, t_acq=0.5, t_rel=0.6)
    p.event("join", tid=20, obj=21, t_req=0.4, t_acq=0.9)
    res, ev, cp = _analyze(tmp_path, run)
    assert _crit(ev, cp) == {(21, 500)}
    tids = [s[1] for s in cp.segments]
    assert tids == [20, 21, 20]  # main's tail, the worker, main before the create


def test_rwlock_reader_waits_for_writer_not_reader(tmp_path):
    run = SynthRun(duration_s=0.5)
    p = run.proc(pid=30)
    p.thread(30, 0.0, 0.5)
    p.thread(31, 0.0, 0.5, parent=30)
    p.thread(32, 0.0, 0.5, parent=30)
    p.event("rwlock_wr", tid=31, lock=L, t_req=0.0, t_acq=0.0, t_rel=0.2)
    p.event("rwlock_rd", tid=32, lock=L, t_req=0.05, t_acq=0.25, t_rel=0.26)  # unrelated
    p.event("rwlock_rd", tid=30, lock=L, t_req=0.1, t_acq=0.2, t_rel=0.5)
    res, ev, cp = _analyze(tmp_path, run)
    crit = _crit(ev, cp)
    assert (31, 0) in crit and (30, 200) in crit
    assert (32, 250) not in crit


def test_cond_signal_barrier_and_sem(tmp_path):
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=40)
    p.thread(40, 0.0, 1.0)
    p.thread(41, 0.0, 1.0, parent=40)
    # barrier round: 41 arrives last at 0.3
    p.event("barrier", tid=40, lock=0xB, t_req=0.1, t_acq=0.3)
    p.event("barrier", tid=41, lock=0xB, t_req=0.3, t_acq=0.3)
    p.event("mutex", tid=41, lock=M, t_req=0.2, t_acq=0.2, t_rel=0.25)  # before arrival
    # sem: 40 waits 0.4..0.6, posted by 41 at 0.6 after a section 0.5..0.55
    p.event("mutex", tid=41, lock=L, t_req=0.5, t_acq=0.5, t_rel=0.55)
    p.event("sem_post", tid=41, lock=0x5, t_req=0.6)
    p.event("sem_wait", tid=40, lock=0x5, t_req=0.4, t_acq=0.6)
    # cond: 41 waits 0.7..0.9, signalled by 40 at 0.9 after a section 0.8..0.85
    p.event("mutex", tid=40, lock=0x7, t_req=0.8, t_acq=0.8, t_rel=0.85)
    p.event("cond_signal", tid=40, lock=0xC, t_req=0.9)
    p.event("cond_wait", tid=41, lock=0xC, obj=0x7, t_req=0.7, t_acq=0.9)
    res, ev, cp = _analyze(tmp_path, run)
    assert _crit(ev, cp) == {(41, 200), (41, 500), (40, 800)}


def test_no_cause_continues_on_same_thread(tmp_path):
    # A contended acquisition whose holder was not recorded (sampled out): the path stays.
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=50)
    p.thread(50, 0.0, 1.0)
    p.event("mutex", tid=50, lock=M, t_req=0.1, t_acq=0.1, t_rel=0.2)
    p.event("mutex", tid=50, lock=L, t_req=0.3, t_acq=0.5, t_rel=0.6)
    res, ev, cp = _analyze(tmp_path, run)
    assert _crit(ev, cp) == {(50, 100), (50, 500)}
    assert not cp.jumped.any()


def test_walk_is_iterative_on_long_chains(tmp_path):
    # 50k handoffs between two threads: a recursive walk would overflow the stack.
    n = 50_000
    run = SynthRun(duration_s=n * 2e-6 + 1e-3)
    p = run.proc(pid=60)
    p.thread(60, 0.0, run.duration_s)
    p.thread(61, 0.0, run.duration_s, parent=60)
    t = np.arange(n) * 2e-6 + 1e-6
    p.add_events(
        kind=1,
        tid=np.where(np.arange(n) % 2, 61, 60),
        lock=L,
        t_req=t - 1e-6,
        t_acq=t,
        t_rel=t + 2e-6,
        flags=1,
    )
    res, ev, cp = _analyze(tmp_path, run)
    # Both threads end together; the path starts on the main thread, so the other
    # thread's very last section (after main's last one) is the only one off the path.
    assert res["summary"]["critical_path"]["events"] == n - 1


def test_c_walk_matches_python_walk(tmp_path, monkeypatch):
    """The C walk (build/liblocus_walk.so) gives exactly the Python walk's path."""
    from locus.analysis import critical_path as cpm
    from locus.analysis.locks import Options, analyze
    from locus.rundir import RunDir
    from locus.synth import many_events

    if cpm._load_walk_c() is None:
        pytest.skip("build/liblocus_walk.so not built (make build)")
    run = str(tmp_path / "r")
    many_events(run, n_events=20000)
    out = {}
    for name, fn in (("py", cpm.walk_py), ("c", cpm.walk_c)):
        monkeypatch.setattr(cpm, "WALK", fn)
        res = analyze(RunDir.open(run), Options(symbols=False))
        cp = res["_critical_path"]
        out[name] = (cp.critical.copy(), cp.jumped.copy(), cp.segments, cp.length_s)
    assert (out["py"][0] == out["c"][0]).all() and (out["py"][1] == out["c"][1]).all()
    assert out["py"][2] == out["c"][2] and out["py"][3] == out["c"][3]
    assert out["py"][1].sum() > 100  # the path did jump: the comparison is not vacuous
