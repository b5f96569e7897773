"""The numa lens on constructed runs: NUMAPROF's classes, first touches, pinning, mbind,
emulation, allocations, advice, and `locus report` in every format."""

import json

import numpy as np
import pytest

from locus.analysis.numa import Options, analyze, last_at_or_before, latest_covering
from locus.cli import main
from locus.errors import LocusError
from locus.render import render
from locus.report import Filters, build
from locus.rundir import RunDir
from locus.symbolize import CodeLoc
from locus.synth import SynthRun
from locus.synth_numa import PAGE, SynthNumaRun, first_touch_run

ARR = 0x7F00_0000_0000
STATIC = 0x601000  # not in any allocation nor touch record: a static variable


class FakeSym:
    """Every instruction is in worker() numa.c:LINE with LINE = ip & 0xfff."""

    def data(self, addrs):
        return {a: None for a in addrs}

    def code(self, addrs, return_addresses=True):
        return {a: CodeLoc("worker", "/src/numa.c", a & 0xFFF) for a in addrs}


FAKE = Options(symbolizer=lambda proc: FakeSym())


def _run(threads=2, **kw):
    run = SynthNumaRun(**kw)
    p = run.proc(pid=10)
    for i in range(threads):
        p.thread(10 + i, 0.0, 1.0, parent=0 if i == 0 else 10)
    return run, p, run.numa(p)


def _res(tmp_path, run, name="run"):
    return analyze(RunDir.open(run.write(str(tmp_path / name))), FAKE)


def _classes(res):
    t = res["totals"]
    keys = ("local", "remote", "unpinned_page", "unpinned_thread", "unpinned_both",
            "memory_only_local", "memory_only_remote", "unknown")  # fmt: skip
    return {k: t[k] for k in keys if t[k]}


def test_serial_first_touch_remote_and_advice(tmp_path):
    """The textbook case: the main thread initialises the whole array, the threads of
    node 1 then access remote pages; with a parallel initialisation all is local."""
    bad = analyze(RunDir.open(first_touch_run(str(tmp_path / "bad"), False)), FAKE)
    t = bad["totals"]
    assert (t["first_touch"], t["unpinned_first_touch"]) == (64, 0)
    assert _classes(bad) == {"local": 128, "remote": 128}
    assert t["accesses"] == 256 and t["unit"] == "samples" and t["touch_unit"] == "pages"
    m = bad["access_matrix"]
    assert m["rows"] == ["unpinned", 0, 1] and m["columns"] == [0, 1]
    assert m["values"] == [[0, 0], [128, 0], [128, 0]]
    assert bad["cpu_matrix"]["values"] == [[128, 0], [128, 0]]
    (a,) = bad["allocations"]
    assert (a["site"], a["size"], a["pages"]) == ("worker numa.c:16", 64 * PAGE, 64)
    assert a["pages_per_node"] == {"0": 64}
    assert a["first_touch_threads"] == [
        {"index": 0, "tid": 300, "pages": 64, "site": "worker numa.c:32"}
    ]
    assert a["accesses_from_nodes"] == {"0": 128, "1": 128}
    assert [x["accessor"] for x in a["mismatched"]] == [2, 3]
    assert [x["kind"] for x in bad["advice"]] == ["serial_first_touch", "remote_site"]
    assert bad["advice"][0]["site"] == "worker numa.c:32"
    assert "initialise it in parallel at worker numa.c:32 (the first-touch site), with the same " \
        "schedule as the compute loop" in bad["advice"][0]["text"]  # fmt: skip
    assert "threads on node 1 accessing pages on node 0" in bad["advice"][1]["text"]
    sites = {s["line"]: s for s in bad["sites"]}
    assert (sites[48]["local"], sites[48]["remote"], sites[48]["accesses"]) == (128, 128, 256)
    assert (sites[32]["first_touch"], sites[32]["accesses"]) == (64, 0)
    assert bad["sites"][0]["line"] == 48  # sorted by accesses

    good = analyze(RunDir.open(first_touch_run(str(tmp_path / "good"), True)), FAKE)
    assert _classes(good) == {"local": 256}
    assert good["allocations"][0]["pages_per_node"] == {"0": 32, "1": 32}
    assert [x["pages"] for x in good["allocations"][0]["first_touch_threads"]] == [16] * 4
    assert good["advice"] == []


def test_unpinned_threads_and_pages(tmp_path):
    run, _p, n = _run()
    n.start(10, nodes=[0])
    n.start(11, nodes=[0, 1])  # unpinned
    p1, p2 = ARR, ARR + PAGE
    n.mmap(ARR, 2 * PAGE, site=0x401100, t=0.01)
    n.touch(11, p1, node=1, t=0.1)  # by an unpinned thread: unpinned page
    n.touch(10, p2, node=0, t=0.1)
    n.sample(10, p1 + 8, node=1, count=3)  # pinned thread, unpinned page
    n.sample(11, p2 + 8, node=0, count=2)  # unpinned thread, pinned page
    n.sample(11, p1 + 16, node=1, count=4)  # both unpinned
    n.sample(10, p2 + 16, node=0, count=5)  # local
    n.sample(10, STATIC, node=1, count=1)  # no touch record: a pinned page, remote
    res = _res(tmp_path, run)
    assert _classes(res) == {
        "local": 5,
        "remote": 1,
        "unpinned_page": 3,
        "unpinned_thread": 2,
        "unpinned_both": 4,
    }
    t = res["totals"]
    assert (t["first_touch"], t["unpinned_first_touch"], t["accesses"]) == (1, 1, 15)
    assert res["access_matrix"]["values"] == [[2, 4], [5, 4], [0, 0]]
    th = {r["tid"]: r for r in res["threads"]}
    assert (th[10]["pinned"], th[10]["nodes_allowed"], th[10]["node"]) == (True, [0], 0)
    assert (th[11]["pinned"], th[11]["nodes_allowed"], th[11]["node"]) == (False, [0, 1], None)
    assert (th[11]["unpinned_both"], th[11]["unpinned_first_touch"]) == (4, 1)
    assert any("1 samples hit pages without a first-touch record" in x for x in res["notes"])
    kinds = [a["kind"] for a in res["advice"]]
    assert kinds[0] == "unpinned_threads"
    assert res["advice"][0]["text"].startswith("threads 1 may run on several nodes (40 % of")
    assert "OMP_PROC_BIND" in res["advice"][0]["text"]


def test_tick_samples_count_their_periods(tmp_path):
    # A thread sampled at the scheduler's tick (it switched context often) has samples that
    # stand for several periods each: the matrix and totals count periods, not records.
    run, _p, n = _run()
    n.start(10, nodes=[0])
    n.start(11, nodes=[1])
    n.mmap(ARR, 2 * PAGE, site=0x401100, t=0.01)
    n.touch(10, ARR, node=0, t=0.1)
    n.sample(10, ARR + 8, node=0, count=6)  # the task clock: one period each
    n.sample(11, ARR + 16, node=0, count=2, periods=4)  # the tick: four periods each
    res = _res(tmp_path, run)
    assert _classes(res) == {"local": 6, "remote": 8}
    assert res["totals"]["accesses"] == 14


def test_memory_only_nodes_by_distance(tmp_path):
    dist = [[10, 20, 17, 28], [20, 10, 28, 17], [17, 28, 10, 28], [28, 17, 28, 10]]
    run, _p, n = _run(threads=3, nodes=[[0, 1], [2, 3], [], []], distances=dist)
    n.start(10, nodes=[0])
    n.start(11, nodes=[1])
    n.start(12, nodes=[0, 1])
    n.sample(10, STATIC, node=2, count=3)  # node 2 is node 0's nearest memory-only node
    n.sample(10, STATIC + 64, node=3, count=2)
    n.sample(11, STATIC, node=3, count=4)
    n.sample(11, STATIC + 64, node=2, count=1)
    n.sample(12, STATIC, node=2, count=1)  # unpinned thread: not a memory-only class
    res = _res(tmp_path, run)
    assert _classes(res) == {"memory_only_local": 7, "memory_only_remote": 3,
                             "unpinned_thread": 1}  # fmt: skip
    assert [x["memory_only"] for x in res["nodes"]] == [False, False, True, True]
    assert res["nodes"][2]["cpus"] == [] and res["nodes"][0]["distances"] == dist[0]
    # Rows: unpinned and the CPU nodes only (no thread runs on a memory-only node).
    assert res["access_matrix"]["rows"] == ["unpinned", 0, 1]
    assert res["access_matrix"]["values"] == [[0, 0, 1, 0], [0, 0, 3, 2],
                                              [0, 0, 1, 4]]  # fmt: skip
    text = render(build(RunDir.open(str(tmp_path / "run")), ["numa"], Filters()), "text")
    assert "memory_only_local" in text and "no CPU (memory only)" in text


def test_one_cxl_node_is_local_to_its_socket_only(tmp_path):
    """One memory-only node (a CXL expander behind socket 1): local from node 1, remote
    from node 0, although it is node 0's nearest (only) memory-only node."""
    dist = [[10, 20, 30], [20, 10, 14], [30, 14, 10]]
    run, _p, n = _run(threads=2, nodes=[[0, 1], [2, 3], []], distances=dist)
    n.start(10, nodes=[0])
    n.start(11, nodes=[1])
    n.sample(10, STATIC, node=2, count=3)
    n.sample(11, STATIC, node=2, count=5)
    res = _res(tmp_path, run)
    assert _classes(res) == {"memory_only_local": 5, "memory_only_remote": 3}


def test_thread_repinned_mid_run(tmp_path):
    """Allowed on both nodes until 0.5 s, then pinned to node 1: accesses and touches are
    classified with the binding at their time."""
    run, _p, n = _run()
    n.start(10, nodes=[0])
    n.start(11, nodes=[0, 1])
    n.pin(11, nodes=[1], t=0.5, what="pthread_setaffinity_np", caller=10, ip=0x401ABC)
    early, late, late2 = ARR, ARR + PAGE, ARR + 2 * PAGE
    n.touch(11, early, node=0, t=0.2)  # unpinned at the time
    n.touch(11, late, node=1, t=0.6)  # pinned (mask from the log)
    n.touch(11, late2, node=1, t=0.6, nodes=[])  # runtime left the mask out: from the log
    n.sample(11, early, node=0, t=0.3, count=2)  # unpinned thread, unpinned page
    n.sample(11, late, node=1, t=0.7, count=3)  # local
    n.sample(11, late2, node=1, t=0.7, count=1)  # local
    n.sample(11, early, node=0, t=0.7, count=4)  # pinned thread, unpinned page
    res = _res(tmp_path, run)
    assert _classes(res) == {"unpinned_both": 2, "local": 4, "unpinned_page": 4}
    t = res["totals"]
    assert (t["first_touch"], t["unpinned_first_touch"]) == (2, 1)
    th = res["threads"][1]
    assert (th["tid"], th["pinned"], th["nodes_allowed"], th["binding_changes"]) == (
        11, True, [1], 1,
    )  # fmt: skip
    log = [(e["tid"], e["what"], e["nodes"], e["caller"]) for e in res["pinning_log"]]
    assert log == [(10, "start", [0], 10), (11, "start", [0, 1], 11),
                   (11, "pthread_setaffinity_np", [1], 10)]  # fmt: skip
    assert res["pinning_log"][2]["t"] == pytest.approx(0.5)
    assert res["pinning_log"][2]["site"] == "worker numa.c:2748"  # 0xabc


def test_mbind_and_move_pages_pin_pages(tmp_path):
    run, _p, n = _run()
    n.start(10, nodes=[0, 1])  # unpinned: its touches make unpinned pages
    n.start(11, nodes=[1])
    n.mmap(ARR, 4 * PAGE, t=0.01)
    n.mbind(ARR, 2 * PAGE, "bind", [1], t=0.05, tid=10, ip=0x401050)
    n.touch(10, ARR, node=1, pages=2, t=0.1)
    n.touch(10, ARR + 2 * PAGE, node=0, pages=2, t=0.1)
    n.sample(11, ARR + 8, node=1, t=0.5, count=3)  # bound by mbind: local
    n.sample(11, ARR + 2 * PAGE, node=0, t=0.5, count=2)  # unpinned page
    n.mbind(ARR, PAGE, "default", [], t=0.6, tid=10)
    n.sample(11, ARR + 8, node=1, t=0.7, count=1)  # no longer bound: unpinned page
    n.move_pages(ARR + 3 * PAGE, 1, 1, t=0.8, tid=10)
    n.sample(11, ARR + 3 * PAGE, node=-1, t=0.9, count=1)  # moved to node 1: local
    n.sample(11, ARR + 2 * PAGE, node=-1, t=0.9, count=1)  # node from its touch: 0
    res = _res(tmp_path, run)
    assert _classes(res) == {"local": 4, "unpinned_page": 4}
    assert res["totals"]["unpinned_first_touch"] == 4
    assert any("2 samples had no node from move_pages" in x for x in res["notes"])
    mb = [e for e in res["pinning_log"] if e["what"] == "mbind"]
    assert (mb[0]["mode"], mb[0]["policy_nodes"], mb[0]["addr"], mb[0]["len"]) == (
        "bind", [1], hex(ARR), 2 * PAGE,
    )  # fmt: skip
    assert mb[0]["site"] == "worker numa.c:80" and mb[1]["mode"] == "default"
    mv = [e for e in res["pinning_log"] if e["what"] == "move_pages"][0]
    assert (mv["policy_nodes"], mv["len"], mv["cpus"]) == ([1], 1, None)


def test_memory_policy_bound_touches_are_pinned(tmp_path):
    """NUMAPROF counts a touch by a thread whose memory policy binds it to one node as a
    pinned first touch, wherever the thread runs."""
    run, _p, n = _run()
    n.start(10, nodes=[0, 1])
    n.start(11, nodes=[0, 1])
    n.mempolicy(10, "bind", [0], t=0.01)
    n.mempolicy(11, "interleave", [0, 1], t=0.01)
    n.touch(10, ARR, node=0, pages=3, t=0.1)
    n.touch(11, ARR + 3 * PAGE, node=1, pages=2, t=0.1)
    res = _res(tmp_path, run)
    t = res["totals"]
    assert (t["first_touch"], t["unpinned_first_touch"]) == (3, 2)
    pol = [e for e in res["pinning_log"] if e["what"] == "set_mempolicy"]
    assert [(e["mode"], e["policy_nodes"]) for e in pol] == [("bind", [0]),
                                                              ("interleave", [0, 1])]  # fmt: skip


def test_emulated_run(tmp_path, capsys):
    """Under --fake-numa the samples carry no node: a page is on the emulated node its
    first toucher placed it on, unknown without a touch record."""
    run, _p, n = _run(emulated=True)
    n.start(10, nodes=[0])
    n.start(11, nodes=[1])
    n.touch(10, ARR, node=0, t=0.1)
    n.touch(11, ARR + PAGE, node=1, t=0.1)
    n.sample(10, ARR, node=-1, count=2)
    n.sample(10, ARR + 8, node=1, count=1)  # a real node under emulation is ignored
    n.sample(10, ARR + PAGE, node=-1, count=3)
    n.sample(11, STATIC, node=-1, count=1)  # no touch record: unknown
    path = run.write(str(tmp_path / "emu"))
    res = analyze(RunDir.open(path), FAKE)
    assert res["emulated"] is True and res["fake"] == 2
    assert _classes(res) == {"local": 3, "remote": 3, "unknown": 1}
    assert res["notes"][0].startswith("EMULATED topology (--fake-numa 2)")
    assert any("under emulation a page's node is known only" in x for x in res["notes"])
    assert main(["report", path, "--lens", "numa"]) == 0
    out = capsys.readouterr().out
    assert "numa      EMULATED topology (--fake-numa 2)" in out.splitlines()[3]


def test_stack_and_unknown_nodes(tmp_path):
    run, _p, n = _run()
    n.start(10, nodes=[0])
    n.sample(10, 0x7FFF_0000_1000, stack=True, count=4)
    n.sample(10, STATIC, node=-2, count=2)  # page not present at the sample
    n.sample(10, STATIC, node=0, count=1)
    res = _res(tmp_path, run)
    t = res["totals"]
    assert (t["stack"], t["unknown"], t["local"], t["accesses"]) == (4, 2, 1, 3)
    assert res["samples"] == 7
    assert sum(map(sum, res["access_matrix"]["values"])) == 1
    assert any("stack accesses (4 samples) are left out" in x for x in res["notes"])
    assert any("2 samples on pages not present" in x for x in res["notes"])


def test_allocation_sites_touch_order_and_serial_touch(tmp_path):
    run, _p, n = _run(threads=4)
    for i, node in enumerate((0, 0, 1, 1)):
        n.start(10 + i, nodes=[node])
    A, B = ARR, ARR + 0x100000
    n.mmap(A, 8 * PAGE, site=0x401100, t=0.01)
    n.mmap(B, 4 * PAGE, site=0x401200, t=0.01)
    n.touch(10, A, node=0, pages=4, t=0.1, ip=0x401300)
    n.touch(12, A + 4 * PAGE, node=1, pages=4, t=0.1, ip=0x401300)
    n.touch(11, B, node=0, pages=4, t=0.1, ip=0x401400, region=B)
    for pg in range(4):  # crosswise: each half read by a thread of the other node
        n.sample(12, A + pg * PAGE, node=0, ip=0x401500, count=2)
        n.sample(10, A + (4 + pg) * PAGE, node=1, ip=0x401500, count=2)
    n.sample(11, B, node=0, ip=0x401600, count=6)
    n.sample(13, B + PAGE, node=0, ip=0x401600, count=6)
    res = _res(tmp_path, run)
    assert _classes(res) == {"local": 6, "remote": 22}
    asites = {r["line"]: r for r in res["alloc_sites"]}
    assert (asites[0x100]["accesses"], asites[0x100]["first_touch"]) == (16, 8)
    assert (asites[0x200]["accesses"], asites[0x200]["remote"], asites[0x200]["blocks"]) == (
        12, 6, 1,
    )  # fmt: skip
    a, b = res["allocations"]
    assert (a["address"], a["pages_per_node"]) == (hex(A), {"0": 4, "1": 4})
    assert [(x["tid"], x["pages"], x["site"]) for x in a["first_touch_threads"]] == [
        (10, 4, "worker numa.c:768"), (12, 4, "worker numa.c:768"),
    ]  # fmt: skip
    assert sorted((x["toucher"], x["accessor"], x["accesses"]) for x in a["mismatched"]) == [
        (0, 2, 8), (2, 0, 8),
    ]  # fmt: skip
    assert a["mismatched_accesses"] == 16 and b["mismatched_accesses"] == 6
    assert [(x["tid"], x["accesses"]) for x in b["accessed_by"]] == [(11, 6), (13, 6)]
    assert b["accesses_from_nodes"] == {"0": 6, "1": 6}
    kinds = [x["kind"] for x in res["advice"]]
    assert kinds == ["touch_order", "serial_first_touch", "remote_site", "remote_site"]
    text = [x["text"] for x in res["advice"]]
    assert (
        "pages first-touched by thread 0 (tid 10) are accessed mostly by thread 2 (tid 12)"
        in (text[0])
    )
    assert (
        "the 16.0 KiB block at 0x7f0000100000 allocated at worker numa.c:512 was first-touched "
        "by thread 1 (tid 11) alone (100 % of its 4 pages, on node 0) but is accessed from "
        "nodes 0-1" in text[1]
    )
    assert res["advice"][2]["site"] == "worker numa.c:1280"


def test_block_reused_at_the_same_address(tmp_path):
    run, _p, n = _run()
    n.start(10, nodes=[0])
    n.start(11, nodes=[1])
    n.mmap(ARR, 2 * PAGE, site=0x401100, t=0.01)
    n.touch(10, ARR, node=0, t=0.1)
    n.sample(10, ARR, node=0, t=0.2, count=2)
    n.free(ARR, t=0.3)
    n.mmap(ARR, 2 * PAGE, site=0x401200, t=0.4)
    n.touch(11, ARR, node=1, t=0.5)  # a new first touch of the new mapping
    n.sample(11, ARR, node=1, t=0.6, count=3)
    res = _res(tmp_path, run)
    assert _classes(res) == {"local": 5}
    rows = {r["line"]: r for r in res["allocations"]}
    assert (rows[0x100]["accesses"], rows[0x100]["pages_per_node"]) == (2, {"0": 1})
    assert (rows[0x200]["accesses"], rows[0x200]["pages_per_node"]) == (3, {"1": 1})
    assert rows[0x200]["first_touch_threads"][0]["tid"] == 11


def test_range_touches(tmp_path):
    run, _p, n = _run()
    n.start(10, nodes=[0, 1])
    n.start(11, nodes=[0])
    n.touch(10, ARR, node=0, pages=8, t=0.1, as_range=True)
    n.sample(11, ARR + 5 * PAGE + 8, node=0, count=2)  # inside the range: unpinned page
    n.sample(11, ARR + 8 * PAGE, node=0, count=1)  # past it: no touch record
    res = _res(tmp_path, run)
    assert res["totals"]["unpinned_first_touch"] == 8
    assert _classes(res) == {"unpinned_page": 2, "local": 1}
    assert any("8 pages were opened in ranges" in x for x in res["notes"])


def test_thread_without_binding_record_inherits_main(tmp_path):
    run, _p, n = _run(threads=3)
    n.start(10, nodes=[1])  # 11 and 12 have no record: as the main thread, node 1
    n.sample(11, STATIC, node=1, count=2)
    res = _res(tmp_path, run)
    assert _classes(res) == {"local": 2}
    assert res["threads"][1]["recorded_binding"] is False
    assert any("2 thread(s) have no binding record" in x for x in res["notes"])

    run, _p, n = _run()
    n.sample(10, STATIC, node=1, count=2)  # no record at all: every node, unpinned
    res = _res(tmp_path, run, name="r2")
    assert _classes(res) == {"unpinned_thread": 2}


def test_count_based_hw_scaling(tmp_path):
    run, _p, n = _run(backend="hw", period_n=1000)
    n.start(10, nodes=[0])
    n.sample(10, STATIC, node=0, count=3)
    res = _res(tmp_path, run)
    assert (res["unit"], res["period"], res["period_unit"], res["scale"]) == (
        "accesses", 1000, "accesses", 1000.0,
    )  # fmt: skip
    assert res["totals"]["local"] == 3000 and res["samples"] == 3
    assert any("each sample stands for 1000 accesses" in x for x in res["notes"])


def test_config_from_records_without_meta(tmp_path):
    run, _p, n = _run(meta_numa=False, period_ns=500_000)
    n.start(10, nodes=[0])
    n.counters(10, samples=10, skipped=2, self_ns=3_000_000, signals=12, dropped=1)
    n.sample(10, STATIC, node=0, count=10)
    res = _res(tmp_path, run)
    assert (res["backend"], res["period"]) == ("soft", 500_000)
    assert (res["skipped"], res["dropped"], res["overhead_s"]) == (2, 1, pytest.approx(3e-3))
    assert [x["id"] for x in res["nodes"]] == [0]
    assert any("no numa configuration" in x for x in res["notes"])


def test_lookups_match_brute_force():
    rng = np.random.default_rng(7)
    for trial in range(300):
        n, m = int(rng.integers(0, 25)), int(rng.integers(0, 25))
        kr = (4, 3000, 1 << 40)[trial % 3]
        rk = rng.integers(0, kr, n)
        if trial % 2:  # one record per key
            rk = rng.permutation(np.unique(rk))
            n = len(rk)
        rt = rng.integers(0, 10, n).astype(np.uint64)
        qk = np.concatenate([rk[: m // 2], rng.integers(0, kr, m - len(rk[: m // 2]))])
        qt = rng.integers(0, 10, len(qk)).astype(np.uint64)
        got = last_at_or_before(rk, rt, qk, qt)
        for q in range(len(qk)):
            c = [i for i in range(n) if rk[i] == qk[q] and rt[i] <= qt[q]]
            assert got[q] == (max(c, key=lambda i: (rt[i], i)) if c else -1)
        for nrec in (3, 40):  # both the per-record pass and the sorted path
            lo = rng.integers(0, 100, nrec).astype(np.uint64)
            hi = lo + rng.integers(1, 30, nrec).astype(np.uint64)
            t = rng.integers(0, 10, nrec).astype(np.uint64)
            qa = rng.integers(0, 130, 40).astype(np.uint64)
            qt2 = rng.integers(0, 10, 40).astype(np.uint64)
            got = latest_covering(lo, hi, t, qa, qt2)
            for q in range(40):
                c = [r for r in range(nrec) if lo[r] <= qa[q] < hi[r] and t[r] <= qt2[q]]
                assert got[q] == (max(c, key=lambda r: (t[r], r)) if c else -1)


def test_report_all_formats_and_plot(tmp_path, capsys):
    path = first_touch_run(str(tmp_path / "bad"), False)
    argv = ["report", path, "--lens", "numa"]
    assert main(argv + ["--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)["lenses"]["numa"]
    for k in ("backend", "nodes", "emulated", "totals", "access_matrix", "sites", "alloc_sites",
              "threads", "pinning_log", "allocations", "period", "samples", "skipped", "notes",
              "advice"):  # fmt: skip
        assert k in r, k
    for k in ("first_touch", "unpinned_first_touch", "local", "remote", "unpinned_page",
              "unpinned_thread", "unpinned_both", "memory_only_local", "memory_only_remote",
              "unknown", "stack", "unit"):  # fmt: skip
        assert k in r["totals"], k
    assert set(r["nodes"][0]) >= {"id", "cpus", "mem_kb", "memory_only"}
    assert set(r["access_matrix"]) == {"rows", "columns", "values"}
    assert set(r["sites"][0]) >= {"function", "file", "line", "local", "first_touch"}
    assert set(r["threads"][0]) >= {"tid", "nodes_allowed", "pinned", "index", "name", "local"}
    assert set(r["allocations"][0]) >= {"site", "size", "pages_per_node", "first_touch_threads"}
    assert set(r["pinning_log"][0]) >= {"t", "tid", "what", "cpus", "nodes", "mode", "site"}
    assert set(r["advice"][0]) == {"kind", "site", "text"}
    assert r["view"] == {"by": "site"} and len(r["pinning_log"]) == 4  # json: every row

    assert main(argv + ["--plot", str(tmp_path / "plots")]) == 0
    cap = capsys.readouterr()
    out = cap.out
    for s in ("numa      soft, 1 sample/1.00 ms of a thread's CPU time: counts are samples",
              "Access classes and first touches", "Code sites by accesses",
              "Allocations: page placement", "Pinning log", "Access matrix (rows", "█  50 %",
              "advice    the 256.0 KiB block", "samples   256 (0.0 % stack)"):  # fmt: skip
        assert s in out, s
    assert "numa-matrix.png" in cap.err
    for ext in ("png", "svg"):
        p = tmp_path / "plots" / f"numa-matrix.{ext}"
        assert p.exists() and p.stat().st_size > 1000
    assert max(len(x) for x in out.splitlines()) <= 80

    assert main(argv + ["--by", "thread"]) == 0
    assert "Threads by accesses" in capsys.readouterr().out
    assert main(argv + ["--by", "alloc"]) == 0
    assert "Allocation sites by accesses" in capsys.readouterr().out
    assert main(argv + ["--format", "csv", "--by", "alloc"]) == 0
    csv = capsys.readouterr().out
    for s in ("# numa_totals", "# numa_alloc_sites", "# numa_allocations", "# numa_pinning",
              "# numa_matrix", "# numa_cpu_matrix"):  # fmt: skip
        assert s in csv, s
    assert "\nunpinned,0,0\n" in csv  # the access matrix's first row
    assert main(argv + ["--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "## Code sites by accesses" in md and "numa_matrix" not in md
    assert "## Access matrix (rows" in md
    assert main(argv + ["--site", "nosuch"]) == 1
    assert "no code or allocation site matches" in capsys.readouterr().err


def test_top_keeps_binding_changes_in_the_log(tmp_path):
    run, _p, n = _run(threads=6)
    for i in range(6):
        n.start(10 + i, nodes=[0, 1], t=0.01 * i)
    n.pin(15, nodes=[1], t=0.5)
    n.mbind(ARR, PAGE, "bind", [0], t=0.6)
    path = run.write(str(tmp_path / "r"))
    rep = build(RunDir.open(path), ["numa"], Filters(top=3))
    log = rep["lenses"]["numa"]["pinning_log"]
    assert [e["what"] for e in log] == ["start", "sched_setaffinity", "mbind"]
    assert rep["lenses"]["numa"]["total"]["pinning_log"] == 8
    # A view only comm has: refused when numa is the only lens, a note beside comm.
    with pytest.raises(LocusError, match="--by core applies to no lens of this report"):
        build(RunDir.open(path), ["numa"], Filters(top=3, by="core"))


def test_empty_numa_run_renders(tmp_path):
    run, _p, n = _run()
    res = _res(tmp_path, run)
    assert res["totals"]["accesses"] == 0 and res["sites"] == [] and res["allocations"] == []
    assert any("no access was sampled or counted" in x for x in res["notes"])
    rep = build(RunDir.open(str(tmp_path / "run")), ["numa"], Filters())
    for fmt in ("text", "json", "csv", "md"):
        assert render(rep, fmt)
    assert "Access matrix (rows: thread's node or unpinned; columns: page's node): none" in (
        render(rep, "text")
    )  # fmt: skip


def test_run_without_numa(tmp_path, capsys):
    run = SynthRun(lenses=["locks"])
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    path = run.write(str(tmp_path / "r"))
    with pytest.raises(LocusError, match="lens 'numa' was not recorded"):
        analyze(RunDir.open(path), FAKE)
    assert main(["report", path, "--lens", "numa"]) == 1
    err = capsys.readouterr().err
    assert "lens 'numa' was not recorded" in err and "Traceback" not in err


def test_samples_inside_the_runtime_are_left_out(tmp_path):
    run, p, n = _run()
    p.maps = "7f1000000000-7f1000100000 r-xp 00000000 08:01 42 /opt/locus/build/liblocus.so\n"
    n.start(10, nodes=[0])
    n.sample(10, STATIC, node=0, ip=0x7F1000000100, count=3)  # in the fault handler
    n.sample(10, STATIC, node=0, count=2)
    res = _res(tmp_path, run)
    assert _classes(res) == {"local": 2} and res["samples"] == 2
    assert any("3 sample(s) taken inside locus's runtime" in x for x in res["notes"])


def test_site_filter(tmp_path, capsys):
    path = first_touch_run(str(tmp_path / "bad"), False)
    # Without debug information (the CLI's symbolizer on a synthetic run) sites match by
    # address.
    argv = ["report", path, "--lens", "numa", "--format", "json", "--site", "0x401030"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)["lenses"]["numa"]
    assert [s["address"] for s in r["sites"]] == ["0x401030"] and r["alloc_sites"] == []
    assert r["total"]["sites"] == 2


def test_exact_backend_counts(tmp_path):
    """`locus cc` programs: every access counted per (thread, instruction, page, node), with
    the thread's mask and the page's pinned state as the runtime saw them."""
    run, _p, n = _run(backend="exact")
    n.start(10, nodes=[0, 1])  # the log says unpinned; the count records know better
    n.start(11, nodes=[1])
    blk = ARR + 16  # a malloc'd chunk: its first page starts before the block
    n.malloc(blk, 2 * PAGE, site=0x401100, t=0.01)
    n.touch(10, ARR, node=0, t=0.1, nodes=[0], exact=True, ip=0x401200)
    n.count(10, ARR, 1000, node=0, nodes=[0], ip=0x401300)  # local
    n.count(11, ARR + PAGE, 500, node=0, ip=0x401300, unpinned_page=True)
    n.count(11, ARR, 40, node=0, ip=0x401300)  # pinned page (its toucher was pinned): remote
    n.count(10, 0x7FFF_0000_0000, 200, nodes=[0], stack=True)
    n.count(10, ARR + 2 * PAGE, 7, node=-2, nodes=[0])  # read of a page not placed yet
    res = _res(tmp_path, run)
    assert (res["backend"], res["unit"], res["scale"], res["period"]) == (
        "exact",
        "accesses",
        1.0,
        None,
    )
    assert _classes(res) == {"local": 1000, "remote": 40, "unpinned_page": 500, "unknown": 7}
    t = res["totals"]
    assert (t["stack"], t["accesses"], t["first_touch"], res["samples"]) == (200, 1547, 1, 5)
    (row,) = [r for r in res["alloc_sites"] if r["line"] == 0x100]
    assert (row["accesses"], row["local"], row["first_touch"]) == (1547, 1000, 1)
    assert not any("sampled non-stack accesses" in x for x in res["notes"])


def test_read_first_touch_placement_and_census(tmp_path):
    """A page first touched by a read is placed by its first write (LOCUS_NT_PLACE): the
    writer is the page's toucher afterwards; the runtime's census at free (LOCUS_NT_FINAL)
    gives the allocation's placement."""
    run, _p, n = _run()
    n.start(10, nodes=[0])
    n.start(11, nodes=[1])
    n.mmap(ARR, 4 * PAGE, site=0x401100, t=0.01)
    n.touch(10, ARR, node=-2, t=0.1, write=False)  # a read: the zero page, not placed
    n.touch(10, ARR + PAGE, node=0, pages=3, t=0.1)
    n.touch(11, ARR, node=1, t=0.2, place=True)  # the first write places it on node 1
    n.sample(11, ARR + 8, node=1, t=0.5, count=2)  # local: 11 placed it
    n.sample(10, ARR + 8, node=1, t=0.5, count=3)  # remote
    n.free(ARR, t=0.9)
    n.final(ARR, node=0, pages=3, t=0.9)
    n.final(ARR, node=1, pages=1, t=0.9)
    res = _res(tmp_path, run)
    assert _classes(res) == {"local": 2, "remote": 3}
    assert res["totals"]["first_touch"] == 4  # the placement is not a first touch
    (a,) = res["allocations"]
    assert (a["placement"], a["pages_per_node"], a["unplaced_pages"]) == (
        "final",
        {"0": 3, "1": 1},
        0,
    )
    assert a["touched_pages_per_node"] == {"0": 3, "1": 1}
    assert [(x["tid"], x["pages"]) for x in a["first_touch_threads"]] == [(10, 4)]
    assert [(x["toucher"], x["accessor"]) for x in a["mismatched"]] == [(1, 0)]
    assert any("placed by a later write" in x for x in res["notes"])
    assert any("census" in x for x in res["notes"])


def test_sites_in_a_library_list_the_programs_calls(tmp_path):
    """Sampled accesses in the C library (memcpy into remote pages) with the program's call
    recorded (the soft handler's stack scan): the site lists its callers, named by the call
    instruction, with their shares of its accesses, and the callers of its first touches
    (the fault handler's scan) with their shares of its touched pages."""
    run, _p, n = _run()
    n.start(10, nodes=[0])
    n.sample(10, ARR, node=1, ip=0x401040, count=6)
    n.add_samples(tid=np.full(3, 10), addr=ARR, node=1, ip=0x401040, caller=0x401101, t=0.5)
    n.add_samples(tid=np.full(1, 10), addr=ARR, node=1, ip=0x401040, caller=0x401201, t=0.5)
    n.sample(10, ARR, node=1, ip=0x401050, count=2)
    n.touch(10, ARR, node=1, pages=4, ip=0x401040, caller=0x401301)  # memset's first touches
    res = _res(tmp_path, run)
    site = {s["line"]: s for s in res["sites"]}
    assert site[0x50]["callers"] == [] and site[0x50]["touch_callers"] == []
    (k,) = site[0x40]["touch_callers"]
    assert (k["line"], k["share"]) == (0x300, 1.0)
    got = [(k["line"], k["address"], k["share"]) for k in site[0x40]["callers"]]
    assert got == [(0x100, "0x401101", pytest.approx(0.3)), (0x200, "0x401201", pytest.approx(0.1))]
    # The CLI (no symbols for a synthetic run): callers by address, under their site.
    text = render(build(RunDir.open(str(tmp_path / "run")), ["numa"], Filters()), "text")
    rows = [ln.strip() for ln in text.splitlines()]
    i = next(k for k, ln in enumerate(rows) if ln.startswith("0x401040"))
    assert rows[i + 1 : i + 3] == ["← 0x401100 (30 %)", "← 0x401200 (10 %)"], text
    assert rows[i + 3].startswith("← 0x401300 (100 % of its"), text
