"""Per-lock, per-site and per-thread numbers of the locks lens on constructed runs."""

import pytest

from locus.analysis.locks import Options, analyze, max_concurrency
from locus.rundir import RunDir
from locus.synth import EV_FAILED, EV_TRY, EV_UNRELEASED, SynthRun, many_events

L, M = 0x1000, 0x2000
NOSYM = Options(symbols=False)


def _res(tmp_path, run, opts=NOSYM):
    return analyze(RunDir.open(run.write(str(tmp_path / "run"))), opts)


def _lock(res, addr):
    return next(r for r in res["locks"] if r["address"] == hex(addr))


def test_waits_holds_and_sites(tmp_path):
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    p.thread(2, 0.0, 1.0, parent=1)
    p.event("mutex", tid=1, lock=L, t_req=0.0, t_acq=0.0, t_rel=0.2, site=0x10)
    p.event("mutex", tid=2, lock=L, t_req=0.1, t_acq=0.2, t_rel=0.3, site=0x20)
    p.event("mutex", tid=2, lock=L, t_req=0.5, t_acq=0.5, t_rel=0.55, site=0x20)
    p.event("cond_wait", tid=1, lock=0xC, obj=L, t_req=0.3, t_acq=0.6)
    res = _res(tmp_path, run)
    lk = _lock(res, L)
    assert (lk["acquisitions"], lk["contended"], lk["kind"]) == (3, 1, "mutex")
    assert lk["wait_s"] == pytest.approx(0.1)
    assert lk["max_wait_s"] == pytest.approx(0.1)
    assert lk["hold_s"] == pytest.approx(0.35)
    assert lk["max_hold_s"] == pytest.approx(0.2)
    assert lk["wait_share"] == pytest.approx(0.1)
    assert res["locks"][0]["kind"] == "cond"  # 300 ms wait sorts first
    assert res["locks"][0]["hold_s"] == 0
    site = next(s for s in res["sites"] if s["address"] == "0x20")
    assert (site["acquisitions"], site["contended"]) == (2, 1)
    assert site["hold_s"] == pytest.approx(0.15)
    s = res["summary"]
    assert s["acquisitions"] == 3 and s["contended"] == 1 and s["waits"] == 1
    assert s["wait_s"] == pytest.approx(0.4)
    assert s["lock_wait_s"] == pytest.approx(0.1)


def test_nested_holds_overlap_once(tmp_path):
    # Venter Table 4.9: L held [0, 0.4], M nested inside [0.1, 0.2], then M alone [0.5, 0.6].
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    p.event("mutex", tid=1, lock=M, t_req=0.1, t_acq=0.1, t_rel=0.2)
    p.event("mutex", tid=1, lock=L, t_req=0.0, t_acq=0.0, t_rel=0.4)
    p.event("mutex", tid=1, lock=M, t_req=0.5, t_acq=0.5, t_rel=0.6)
    res = _res(tmp_path, run)
    assert _lock(res, L)["hold_s"] == pytest.approx(0.4)
    assert _lock(res, M)["hold_s"] == pytest.approx(0.2)
    (t,) = res["threads"]
    assert t["hold_combined_s"] == pytest.approx(0.6)
    assert t["hold_s"] == pytest.approx(0.5)


def test_failed_trylock_and_unreleased(tmp_path):
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    p.event("mutex", tid=1, lock=L, t_req=0.1, t_acq=0.3, flags=EV_FAILED)  # timed out
    p.event("mutex", tid=1, lock=L, t_req=0.4, t_acq=0.4, t_rel=0.5, flags=EV_TRY)
    p.event("mutex", tid=1, lock=M, t_req=0.6, t_acq=0.6, t_rel=1.0, flags=EV_UNRELEASED)
    res = _res(tmp_path, run)
    lk = _lock(res, L)
    assert (lk["acquisitions"], lk["failed"]) == (1, 1)
    assert lk["hold_s"] == pytest.approx(0.1)
    assert lk["wait_s"] == pytest.approx(0.2)  # it did wait before timing out
    assert _lock(res, M)["unreleased"] == 1
    assert any("still held" in n for n in res["notes"])


def test_sampling_weights_estimate_times_counts_exact(tmp_path):
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    p.event("mutex", tid=1, lock=L, t_req=0.1, t_acq=0.1, t_rel=0.11, weight=8)
    p.count(1, L, 0x401000, "mutex", acquisitions=13, contended=0, timed=1)
    res = _res(tmp_path, run)
    lk = _lock(res, L)
    assert lk["acquisitions"] == 13  # from the counts table, not 8
    assert lk["hold_s"] == pytest.approx(0.13)  # 13 acquisitions x the timed 10 ms
    assert lk["estimated"] and res["estimated"]
    assert any("sampling active" in n for n in res["notes"])


def test_sampled_wait_ratio_estimator_and_its_error(tmp_path):
    """Sampled waits: exact contended count x mean timed contended wait, not weight x wait;
    the relative standard error comes from the spread of the timed waits."""
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    for i, wait in enumerate((0.01, 0.03, 0.0, 0.0)):
        t = 0.1 + 0.2 * i
        p.event("mutex", tid=1, lock=L, t_req=t, t_acq=t + wait, t_rel=t + wait + 0.001, weight=25)
    p.count(1, L, 0x401000, "mutex", acquisitions=100, contended=10, timed=4)
    lk = _lock(_res(tmp_path, run), L)
    assert lk["wait_s"] == pytest.approx(10 * 0.02)  # weight x wait would say 25 x 0.04 = 1.0
    assert lk["hold_s"] == pytest.approx(100 * 0.001)
    # s^2 of (0.01, 0.03) = 2e-4; SE = sqrt(10^2 x 2e-4 / 2) = 0.1, i.e. 50 % of 0.2 s.
    assert lk["wait_rse"] == pytest.approx(0.5)


def test_unsampled_times_stay_exact(tmp_path):
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    p.event("mutex", tid=1, lock=L, t_req=0.1, t_acq=0.3, t_rel=0.4)
    p.event("mutex", tid=1, lock=L, t_req=0.5, t_acq=0.5, t_rel=0.55)
    p.count(1, L, 0x401000, "mutex", acquisitions=2, contended=1, timed=2)
    lk = _lock(_res(tmp_path, run), L)
    assert (lk["wait_s"], lk["wait_rse"]) == (pytest.approx(0.2), 0.0)
    assert lk["hold_s"] == pytest.approx(0.15)


def test_dependency_loss(tmp_path):
    run = SynthRun(duration_s=1.0, cpus=4)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    p.thread(2, 0.0, 1.0, parent=1)
    p.event("mutex", tid=2, lock=L, t_req=0.2, t_acq=0.5, t_rel=0.6)
    for t in (0.0, 1.0):
        run.sample(t, 1, 1, t * 1.0)  # main: always on cpu
        run.sample(t, 1, 2, t * 0.5)  # worker: half
    s = _res(tmp_path, run)["summary"]
    assert s["max_threads"] == 2
    assert s["active_threads_avg"] == pytest.approx(1.5)
    assert s["dependency_loss_s"] == pytest.approx(0.5)
    assert s["lock_wait_loss_s"] == pytest.approx(0.3)
    assert s["unaccounted_loss_s"] == pytest.approx(0.2)


def test_no_sched_samples_gives_null_not_numbers(tmp_path):
    run = SynthRun(duration_s=1.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    res = _res(tmp_path, run)
    assert res["summary"]["dependency_loss_s"] is None
    assert any("no scheduler samples" in n for n in res["notes"])


def test_max_concurrency_caps_and_ties():
    import numpy as np

    assert max_concurrency(np.array([0.0, 1.0]), np.array([1.0, 2.0])) == 1
    assert max_concurrency(np.array([0.0, 0.5, 0.6]), np.array([1.0, 2.0, 0.7])) == 3


def test_million_events_runs(tmp_path):
    # Correctness at scale only; the speed is measured by bench, not asserted here.
    path = many_events(str(tmp_path / "m"), n_events=200_000, threads=4, locks=4)
    res = analyze(RunDir.open(path), NOSYM)
    assert res["summary"]["acquisitions"] == 200_000
    assert 0 < res["summary"]["critical_path"]["events"] < 200_000


def test_group_with_few_timed_waits_borrows_the_lock_mean(tmp_path):
    run = SynthRun(duration_s=10.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 10.0)
    p.thread(2, 0.0, 10.0)
    for i in range(20):
        t = 0.1 + 0.01 * i
        p.event("mutex", tid=1, lock=L, t_req=t, t_acq=t + 0.001, t_rel=t + 0.002, weight=10)
    p.event("mutex", tid=2, lock=L, t_req=1.0, t_acq=1.01, t_rel=1.011, weight=10)
    p.count(1, L, 0x401000, "mutex", acquisitions=200, contended=200, timed=20)
    p.count(2, L, 0x401000, "mutex", acquisitions=1000, contended=1000, timed=1)
    res = _res(tmp_path, run)
    by_tid = {t["tid"]: t for t in res["threads"]}
    assert by_tid[1]["wait_s"] == pytest.approx(200 * 0.001)  # its own 20 samples
    pooled = (20 * 0.001 + 0.01) / 21
    assert by_tid[2]["wait_s"] == pytest.approx(1000 * pooled)  # not 1000 x 10 ms
    assert _lock(res, L)["wait_s"] == pytest.approx(0.2 + 1000 * pooled)


def test_contended_means_weighted_by_sampling_period(tmp_path):
    """After a contended acquisition the runtime times with a shorter period: each timed
    wait stands for its event's weight, so the mean is a weighted one."""
    run = SynthRun(duration_s=2.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 2.0)
    for i in range(20):
        wait, weight = (0.001, 1) if i < 10 else (0.003, 4)
        t = 0.05 + 0.05 * i
        p.event("mutex", tid=1, lock=L, t_req=t, t_acq=t + wait, t_rel=t + wait, weight=weight)
    p.count(1, L, 0x401000, "mutex", acquisitions=100, contended=100, timed=20)
    lk = _lock(_res(tmp_path, run), L)
    mean = (10 * 1 * 0.001 + 10 * 4 * 0.003) / (10 * 1 + 10 * 4)
    assert lk["wait_s"] == pytest.approx(100 * mean)


def test_holds_weighted_by_sampling_period(tmp_path):
    """The runtime's period shrinks when timed sections are far apart, so long sections (a
    holder that yields) are timed more often than short ones. The hold estimate was
    acquisitions x the unweighted mean timed hold: a lock's hold came out above the run
    (43 s in 30). Each timed hold stands for its event's weight."""
    run = SynthRun(duration_s=2.0)
    p = run.proc(pid=1)
    p.thread(1, 0.0, 2.0)
    for i in range(20):
        hold, weight = (0.000001, 64) if i < 10 else (0.001, 1)
        t = 0.05 + 0.05 * i
        p.event("mutex", tid=1, lock=L, t_req=t, t_acq=t, t_rel=t + hold, weight=weight)
    acq = 10 * 64 + 10
    p.count(1, L, 0x401000, "mutex", acquisitions=acq, contended=0, timed=20)
    lk = _lock(_res(tmp_path, run), L)
    true_hold = 10 * 64 * 0.000001 + 10 * 0.001  # 10.6 ms; unweighted: 650 x 0.5 ms = 325 ms
    assert lk["hold_s"] == pytest.approx(true_hold, rel=1e-6)
