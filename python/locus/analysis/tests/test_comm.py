"""The comm lens on constructed runs: matrices, scaling, objects, lines, advice, report."""

import json
import os
import re

import numpy as np
import pytest

from locus.analysis import comm
from locus.analysis.comm import Options, analyze
from locus.cli import main
from locus.errors import LocusError
from locus.render import render
from locus.render.comm import (
    MAX_CELLS,
    _short_site,
    comm_tables,
    heatmap_lines,
    summary_lines,
    thread_legend,
)
from locus.report import Filters, build
from locus.rundir import COMM_EVENT_DTYPE, RunDir
from locus.symbolize import CodeLoc
from locus.synth import SynthRun
from locus.synth_comm import SynthCommRun, false_sharing_run

STATS = 0x601000  # `stats`, 64 bytes, in the fake symbol table
COUNTER = 0x602000  # `counter`, 8 bytes


class FakeSym:
    """Data symbols `stats` and `counter`; every instruction is in worker() fs.c:LINE with
    LINE = ip & 0xfff."""

    def data(self, addrs):
        out = {}
        for a in addrs:
            if STATS <= a < STATS + 64:
                out[a] = "stats" if a == STATS else f"stats+{a - STATS}"
            elif COUNTER <= a < COUNTER + 8:
                out[a] = "counter" if a == COUNTER else f"counter+{a - COUNTER}"
            else:
                out[a] = None
        return out

    def code(self, addrs, return_addresses=True):
        return {a: CodeLoc("worker", "/src/fs.c", a & 0xFFF) for a in addrs}

    def data_size(self, name):
        return {"stats": 64, "counter": 8}.get(name)


FAKE = Options(symbolizer=lambda proc: FakeSym())


def _run(threads=4, **kw):
    run = SynthCommRun(**kw)
    p = run.proc(pid=10)
    for i in range(threads):
        p.thread(10 + i, 0.0, 1.0, parent=0 if i == 0 else 10)
    return run, p, run.comm(p)


def _res(tmp_path, run, opts=FAKE, name="run"):
    return analyze(RunDir.open(run.write(str(tmp_path / name))), opts)


def test_symmetric_zero_diagonal_true_false(tmp_path):
    run, _p, c = _run(period_ns=1_000_000)
    c.event(src=10, dst=11, line=COUNTER, count=3)  # same bytes: true
    c.event(src=11, dst=10, line=COUNTER, count=1)
    c.event(src=12, dst=13, line=STATS, src_off=0, dst_off=8, count=2)  # false
    c.event(src=13, dst=13, line=STATS, count=5)  # self: never on the matrix
    res = _res(tmp_path, run)
    m = {k: np.array(v) for k, v in res["matrices"]["thread"].items()}
    for k in ("all", "true", "false"):
        assert (m[k] == m[k].T).all() and (np.diag(m[k]) == 0).all()
    ms = 1e-3
    assert m["true"][0, 1] == pytest.approx(4 * ms)  # 3 + 1 detections, both directions
    assert m["false"][2, 3] == pytest.approx(2 * ms) and m["false"][0, 1] == 0
    assert m["all"] == pytest.approx(m["true"] + m["false"])
    assert [t["tid"] for t in res["threads"]] == [10, 11, 12, 13]
    assert res["threads"][0]["name"] == "main"
    assert res["totals"]["true"] == pytest.approx(4 * ms)
    assert res["totals"]["detections"] == 6
    assert any("to itself" in n for n in res["notes"])


def test_core_and_node_matrices(tmp_path):
    run, _p, c = _run(cpus=4)
    run.meta_extra["host"] = dict(run.meta()["host"], cpu_node=[0, 0, 1, 1], numa_nodes=2)
    c.event(src=10, dst=11, line=COUNTER, src_cpu=0, dst_cpu=1, count=2)
    c.event(src=10, dst=12, line=COUNTER, src_cpu=0, dst_cpu=2, count=3)
    c.event(src=11, dst=12, line=COUNTER, src_cpu=-1, dst_cpu=2)  # CPU unknown
    res = _res(tmp_path, run)
    core = np.array(res["matrices"]["core"]["all"])
    node = np.array(res["matrices"]["node"]["all"])
    ms = 1e-3
    assert core.shape == (4, 4) and core[0, 1] == pytest.approx(2 * ms)
    assert core[2, 0] == pytest.approx(3 * ms)
    assert node.shape == (2, 2) and node[0, 1] == pytest.approx(3 * ms)
    assert node[0, 0] == 0  # same node: diagonal
    assert res["cpu_node"] == [0, 0, 1, 1]
    assert any("no CPU recorded" in n for n in res["notes"])


def test_node_map_missing_from_an_older_run_is_said(tmp_path):
    """A run recorded on 2 nodes without the CPU-to-node map (before host.cpu_node) read on
    a machine with another topology: the node matrix cannot be right, and a note says so
    (it was silent when this machine has one node)."""
    run, _p, c = _run(cpus=2)
    host = {k: v for k, v in run.meta()["host"].items() if k != "cpu_node"}
    run.meta_extra["host"] = dict(host, numa_nodes=2)
    c.event(src=10, dst=11, line=COUNTER, src_cpu=0, dst_cpu=1, count=2)
    res = _res(tmp_path, run)
    here = len({int(x) for x in res["cpu_node"]})
    if here == 2:
        pytest.skip("this machine has the recorded topology")
    assert any("does not record which NUMA node" in n for n in res["notes"]), res["notes"]


@pytest.mark.parametrize("guessed", [1, 3])
def test_traps_whose_access_was_not_decoded_are_counted(tmp_path, guessed):
    """Traps marked LOCUS_CE_GUESSED (the decoder found no access on the watched bytes: the
    8 bytes, taken as a load) are counted in totals.traps_undecoded, and a note gives their
    share when it is over 10 % of at least 10 traps (3 of 20: a note; 1 of 20: none)."""
    run, _p, c = _run(backend="soft")
    c.event(src=10, dst=11, line=COUNTER, volume=2.0, trap=True, count=20 - guessed)
    c.event(src=10, dst=11, line=COUNTER, volume=2.0, trap=True, guessed=True, count=guessed)
    res = _res(tmp_path, run, name=f"g{guessed}")
    assert res["totals"]["traps_undecoded"] == guessed
    said = [n for n in res["notes"] if "watchpoint traps took an access" in n]
    assert len(said) == (guessed == 3), res["notes"]
    if said:
        assert said[0].startswith("3 of 20 watchpoint traps"), said


def test_scaling_soft_hw_exact(tmp_path):
    run, _p, c = _run(backend="soft", period_ns=2_000_000)
    c.event(src=10, dst=11, line=COUNTER, count=4)
    c.event(src=10, dst=11, line=COUNTER, volume=2.0, trap=True)  # trap: volume as recorded
    res = _res(tmp_path, run, name="soft")
    assert (res["unit"], res["period"], res["period_unit"]) == ("s", 2_000_000, "ns")
    assert res["totals"]["all"] == pytest.approx(6 * 2e-3)
    # Bytes: a lower bound, one line per sample's detection (the trap proves no transfer).
    assert (res["totals"]["bytes"], res["totals"]["bytes_method"]) == (4 * 64, "lower_bound")
    assert res["totals"]["rse"] == pytest.approx(1 / np.sqrt(5))
    assert any("time-based" in n for n in res["notes"])

    run, _p, c = _run(backend="hw", period_n=1000)
    c.event(src=10, dst=11, line=COUNTER, count=4)
    res = _res(tmp_path, run, name="hw")
    assert (res["unit"], res["period"], res["period_unit"]) == ("lines", 1000, "accesses")
    assert res["totals"]["all"] == 4000
    assert (res["totals"]["bytes"], res["totals"]["bytes_method"]) == (4000 * 64, "scaled")

    # hw at a rate (the default: no count given): the kernel adapts the count period and
    # samples do not carry it, so a detection is one sample, neither seconds nor lines.
    run, _p, c = _run(backend="hw", period_ns=1_000_000)
    c.event(src=10, dst=11, line=COUNTER, count=4)
    c.event(src=10, dst=11, line=COUNTER, volume=2.0, trap=True)
    res = _res(tmp_path, run, name="hw-rate")
    assert (res["unit"], res["period"], res["period_unit"]) == ("samples", 1_000_000, "ns")
    assert res["totals"]["all"] == 6 and res["totals"]["bytes"] == 4 * 64
    assert any("one sampled access" in n for n in res["notes"])

    run, _p, c = _run(backend="exact")
    c.event(src=10, dst=11, line=COUNTER, volume=7.0, count=2)
    res = _res(tmp_path, run, name="exact")
    assert res["backend"] == "exact" and res["unit"] == "lines" and res["period"] is None
    assert res["totals"]["all"] == 14 and res["totals"]["rse"] == 0.0
    assert (res["totals"]["bytes"], res["totals"]["bytes_method"]) == (14 * 64, "counted")
    # No handler runs under exact: the summary says where its cost is, not "0 s".
    text = "\n".join(summary_lines({"run": {"duration_s": 1.0}, "lenses": {"comm": res}}))
    assert "comm cost in the program itself" in text and "in the comm handlers" not in text


def test_detections_by_how_they_were_made(tmp_path):
    """Lookups (step 1), traps on published stores (step 2) and traps on stores to lines
    another thread loaded (--watch-loads) are counted apart; a store to a load's bytes is
    true sharing, to other bytes of its chunk false; the writer is the src."""
    run, _p, c = _run(period_ns=1_000_000)
    c.event(src=10, dst=11, line=COUNTER, count=2)
    c.event(src=10, dst=11, line=COUNTER, volume=2.0, trap=True)
    c.event(src=12, dst=13, line=STATS, loaded=True, count=3, store=False)
    c.event(src=12, dst=13, line=STATS, src_off=4, src_len=4, dst_len=4, loaded=True)
    res = _res(tmp_path, run)
    t = res["totals"]
    assert (t["detections_lookup"], t["detections_trap"], t["detections_loaded"]) == (2, 1, 4)
    assert t["detections"] == 7 and res["watch_loads"] is True
    ms = 1e-3
    assert t["all"] == pytest.approx(8 * ms) and t["false"] == pytest.approx(1 * ms)
    # Traps prove no transfer: the lower bound counts the two lookups only.
    assert t["bytes"] == 2 * 64
    text = "\n".join(summary_lines({"run": {"duration_s": 1.0}, "lenses": {"comm": res}}))
    assert "4 watchpoints (and on loads)" in text, text
    assert "from 7 detections (2 by lookup, 1 by trap, 4 on loads)" in text, text
    # The scaling note says what a trap stands for, as it does when a run has traps.
    scaling = next(n for n in res["notes"] if n.startswith("time-based sampling"))
    assert "watchpoint trap stands for 64/(8 M) periods" in scaling, scaling
    assert "times k" in scaling, scaling


@pytest.mark.parametrize("running,noted", [(5, True), (3, False)])
def test_a_crowded_machine_is_noted(tmp_path, running, noted):
    """Threads that take turns on the CPUs (more runnable tasks than CPUs in the launcher's
    samples; procs_running counts the launcher's sampling thread) get the note on what a
    time sample cannot tell; a machine with a CPU per runnable thread does not."""
    run, _p, c = _run(period_ns=1_000_000)
    run.cpus = 2
    c.event(src=10, dst=11, line=COUNTER, count=3)
    for i in range(50):
        run.sample(i * 0.02, 0, 0, running if i % 4 else 1)  # 3 samples in 4 crowded
    res = _res(tmp_path, run)
    notes = [n for n in res["notes"] if "took turns" in n]
    assert bool(notes) is noted, res["notes"]
    if noted:
        assert "the machine's 2 CPUs in 74%" in notes[0], notes[0]


def test_config_without_meta_from_thread_records(tmp_path):
    run, _p, c = _run(period_ns=500_000, meta_comm=False, watchpoints=2)
    c.event(src=10, dst=11, line=COUNTER)
    c.counters(10, samples=100, skipped=5, self_ns=2_000_000, dropped=3)
    c.counters(11, samples=50, skipped=5, self_ns=1_000_000)
    res = _res(tmp_path, run)
    assert res["backend"] == "soft" and res["period"] == 500_000
    assert res["watchpoints"] == 2 and res["samples"] == 150 and res["skipped"] == 10
    assert res["overhead_s"] == pytest.approx(3e-3)
    assert any("no comm configuration" in n for n in res["notes"])
    assert any("dropped" in n for n in res["notes"])


def test_objects_static_heap_stack(tmp_path):
    run, _p, c = _run()
    heap, stack = 0x7000_0000, 0x7F00_0000
    c.malloc(heap, 256, site=0x401234, t=0.1)
    c.free(heap, t=0.6)
    c.malloc(heap, 128, site=0x401999, t=0.7)  # same address, another site
    c.stack(11, stack, 1 << 20)
    c.event(src=10, dst=11, line=heap + 64, dst_off=8, t=0.5, count=3)  # first block
    c.event(src=10, dst=11, line=heap, t=0.8, count=2)  # second block
    c.event(src=10, dst=11, line=heap + 64, t=0.05)  # before any block: unattributed
    c.event(src=10, dst=11, line=stack + 4096, dst_off=16, count=4)
    c.event(src=12, dst=13, line=STATS, dst_off=8, count=5)
    res = _res(tmp_path, run)
    by = {o["name"]: o for o in res["objects"]}
    assert by["stats"]["kind"] == "static" and by["stats"]["detections"] == 5
    assert by["stats"]["size"] == 64  # the symbol's size
    assert by["stats"]["threads"] == [2, 3]
    h1 = by["heap block from worker fs.c:564"]  # 0x401234 & 0xfff
    assert (h1["kind"], h1["size"], h1["detections"]) == ("heap", 256, 3)
    assert h1["site"] == "worker fs.c:564"
    h2 = by["heap block from worker fs.c:2457"]
    assert (h2["size"], h2["detections"]) == (128, 2)
    st = by["stack of thread 1 (tid 11)"]
    assert (st["kind"], st["detections"]) == ("stack", 4)
    # What no object holds is summed apart: `objects` has the contract's kinds only.
    assert {o["kind"] for o in res["objects"]} == {"static", "heap", "stack"}
    assert res["unattributed"]["detections"] == 1 and res["unattributed"]["threads"] == [0, 1]
    lines = {(r["address"], r["object"]): r for r in res["lines"]}
    assert lines[(hex(heap + 64), "heap block from worker fs.c:564")]["offset"] == 64
    assert lines[(hex(STATS), "stats")]["offset"] == 0
    assert lines[(hex(stack + 4096), "stack of thread 1 (tid 11)")]["offset"] == 4096
    # The text gives the offset into an object, not into a thread's stack (megabytes).
    from locus.render.comm import comm_tables

    shown = {r["address"]: r["object_at"] for r in comm_tables({"lenses": {"comm": res}})[1].rows}
    assert shown[hex(stack + 4096)] == "stack of thread 1 (tid 11)"
    assert shown[hex(heap + 64)] == "heap block from worker fs.c:564 @+64"


class WrapperSym(FakeSym):
    """Code at 0x4015xx is in `xmalloc` (an allocation wrapper), the rest in worker()."""

    def code(self, addrs, return_addresses=True):
        return {
            a: CodeLoc("xmalloc" if a & 0xFF00 == 0x1500 else "worker", "/src/fs.c", a & 0xFFF)
            for a in addrs
        }


def test_heap_objects_named_past_allocation_wrappers(tmp_path):
    """A block from an allocation wrapper (xmalloc) is named by the wrapper's caller when the
    run has call stacks, one object per calling path even when two threads numbered the same
    path differently; without call stacks it is named by the wrapper, with a note."""
    heap = 0x7000_0000
    for stacks in (True, False):
        run, p, c = _run(threads=3)
        site = 0x401510  # inside xmalloc
        for k, (sid, caller) in enumerate(((1, 0x401234), (7, 0x401234), (2, 0x401888))):
            if stacks:
                c.call_stack(sid, [site, caller, 0x401999])
            c.malloc(heap + k * 4096, 64, site=site, t=0.1, stack=sid if stacks else 0)
            c.event(src=10, dst=11, line=heap + k * 4096, t=0.5, count=2)
        res = _res(tmp_path, run, Options(symbolizer=lambda proc: WrapperSym()), f"w{stacks}")
        names = sorted(o["name"] for o in res["objects"])
        wrapped = [n for n in res["notes"] if "allocation wrapper (xmalloc)" in n]
        if stacks:
            assert names == [
                "heap block from worker fs.c:2184 (via xmalloc)",  # 0x401888
                "heap block from worker fs.c:564 (via xmalloc)",  # 0x401234: ids 1, 7 merged
            ], names
            assert not wrapped
        else:
            assert names == ["heap block from xmalloc fs.c:1296"], names
            assert wrapped and "--call-stack" in wrapped[0]


class InlinedWrapperSym(FakeSym):
    """Code at 0x4016xx is `xmalloc` inlined into `make_stats` inlined into `main`."""

    def code(self, addrs, return_addresses=True):
        out = {}
        for a in addrs:
            if a & 0xFF00 == 0x1600:
                chain = (("make_stats", "/src/fs.c", 9), ("main", "/src/fs.c", 20))
                out[a] = CodeLoc("xmalloc", "/src/fs.c", 7, inlined=chain)
            else:
                out[a] = CodeLoc("worker", "/src/fs.c", a & 0xFFF)
        return out


def test_heap_object_named_past_an_inlined_wrapper(tmp_path):
    """An allocation wrapper inlined into its caller (g++ -O2: `xmalloc` into `make_stats`
    into `main`) has its caller in the site's own inline chain: no call stack needed. The
    block was named "heap block from xmalloc fs.c:7"."""
    run, p, c = _run(threads=3)
    c.malloc(0x7000_0000, 64, site=0x401610, t=0.1)
    c.event(src=10, dst=11, line=0x7000_0000, t=0.5, count=2)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: InlinedWrapperSym()))
    assert [o["name"] for o in res["objects"]] == [
        "heap block from make_stats fs.c:9 (via xmalloc)"
    ]
    assert not [n for n in res["notes"] if "allocation wrapper" in n], res["notes"]


def test_line_byte_ranges_and_sites(tmp_path):
    run, _p, c = _run()
    c.event(src=10, dst=11, line=STATS, src_off=0, src_len=4, dst_off=2, dst_len=4,
            src_ip=0x401010, dst_ip=0x401020)  # fmt: skip
    c.event(src=10, dst=11, line=STATS, src_off=4, src_len=4, dst_off=16, dst_len=8,
            src_ip=0x401010, dst_ip=0x401020)  # fmt: skip
    res = _res(tmp_path, run)
    (ln,) = res["lines"]
    rng = {t["thread"]: t["bytes"] for t in ln["threads"]}
    assert rng == {0: [[0, 7]], 1: [[2, 5], [16, 23]]}
    assert ln["sites"] == ["worker fs.c:16", "worker fs.c:32"]
    assert ln["true"] == pytest.approx(1e-3) and ln["false"] == pytest.approx(1e-3)
    sites = {s["line"]: s for s in res["sites"]}
    assert sites[16]["all"] == pytest.approx(2e-3)  # the writer of both
    assert sites[32]["false"] == pytest.approx(1e-3)


def test_advice_for_false_sharing(tmp_path):
    path = false_sharing_run(str(tmp_path / "fs"), threads=8, n=20)
    res = analyze(RunDir.open(path), FAKE)
    (o,) = res["objects"]
    assert (o["name"], o["false"], o["true"]) == ("stats", o["all"], 0.0)
    assert {ln["verdict"] for ln in res["lines"]} == {"false"}
    assert res["advice"] == [
        "threads 0-7 write adjacent 8-byte fields of `stats` at offsets 0-56; pad each to "
        "64 bytes (alignas(64)) or give each thread its own line"
    ]
    assert not any(k.startswith("_") for k in o)


class MidLineSym(FakeSym):
    """`hits` (16 bytes; or `name` of `size` bytes) starts 32 bytes into the line at
    0x603000, after another object."""

    def __init__(self, name: str = "hits", size: int = 16):
        self.name, self.size = name, size

    def data(self, addrs):
        out = {}
        for a in addrs:
            o = a - 0x603020
            out[a] = (self.name if o == 0 else f"{self.name}+{o}") if 0 <= o < self.size else None
        return out

    def data_size(self, name):
        return self.size if name == self.name else super().data_size(name)


def _two_slots(tmp_path, sym) -> dict:
    """Two threads writing bytes 32-39 and 40-47 of the line at 0x603000 (30 detections
    each way), analysed with symbolizer `sym`."""
    run, p, c = _run(threads=2, cpus=2)
    for src, dst, so, do in ((10, 11, 32, 40), (11, 10, 40, 32)):
        c.event(src=src, dst=dst, line=0x603000, src_off=so, src_len=8, dst_off=do, dst_len=8,
                src_ip=0x401100, dst_ip=0x401100, store=True, count=30)  # fmt: skip
    for t in (10, 11):
        c.counters(t, samples=100, signals=100)
    return _res(tmp_path, run, Options(symbolizer=lambda proc: sym))


def test_advice_for_an_object_that_starts_mid_line(tmp_path):
    """A static array is rarely line-aligned: `hits` starts at byte 32 of its line, and its
    two slots (bytes 32-39 and 40-47 of the line) are written by two threads. The advice
    names its object offsets 0-8 (it was dropped when the line began before the object)."""
    res = _two_slots(tmp_path, MidLineSym())
    assert res["objects"][0]["name"] == "hits"
    # The line starts 32 bytes before the object.
    assert (res["lines"][0]["object"], res["lines"][0]["offset"]) == ("hits", -32)
    assert res["advice"] == [
        "threads 0-1 write adjacent 8-byte fields of `hits` at offsets 0-8; pad each to "
        "64 bytes (alignas(64)) or give each thread its own line"
    ]


def test_advice_for_writers_says_write_beside_a_reader_left_out(tmp_path):
    """Two threads write their own slots; a third (the main thread summing them after the
    joins) reads one once, a load, with a sliver of the volume: it is left out of the advice,
    which says the two threads write (it said "access": not every access was a store)."""
    run, p, c = _run(threads=3, cpus=2)
    for src, dst, so, do in ((10, 11, 32, 40), (11, 10, 40, 32)):
        c.event(src=src, dst=dst, line=0x603000, src_off=so, src_len=8, dst_off=do, dst_len=8,
                src_ip=0x401100, dst_ip=0x401100, store=True, count=30)  # fmt: skip
    c.event(src=10, dst=12, line=0x603000, src_off=32, src_len=8, dst_off=40, dst_len=8,
            src_ip=0x401100, dst_ip=0x401200, store=False, count=1)  # fmt: skip
    for t in (10, 11, 12):
        c.counters(t, samples=100, signals=100)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: MidLineSym()))
    assert res["advice"] == [
        "threads 0-1 write adjacent 8-byte fields of `hits` at offsets 0-8; pad each to "
        "64 bytes (alignas(64)) or give each thread its own line"
    ]


def test_advice_names_each_threads_element(tmp_path):
    """Each thread writes both 8-byte fields of its own 16-byte struct (`pairs`, two of them,
    32 bytes into 0x603000's line): the advice speaks of 16-byte elements (it said 8-byte
    fields, as if each thread had one word)."""
    run, p, c = _run(threads=2, cpus=2)
    for src, dst, so, do in (
        (10, 11, 32, 48),
        (10, 11, 40, 56),
        (11, 10, 48, 32),
        (11, 10, 56, 40),
    ):
        c.event(src=src, dst=dst, line=0x603000, src_off=so, src_len=8, dst_off=do, dst_len=8,
                src_ip=0x401100, dst_ip=0x401100, store=True, count=30)  # fmt: skip
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: MidLineSym("pairs", 32)))
    assert res["advice"] == [
        "threads 0-1 write adjacent 16-byte elements (8-byte fields) of `pairs` at offsets "
        "0-24; pad each to 64 bytes (alignas(64)) or give each thread its own line"
    ]


def test_advice_for_a_local_variable_shared_by_address(tmp_path):
    """Threads 0 and 1 write neighbouring words of a local on thread 1's stack: the advice
    gives the addresses (offsets into a stack of megabytes said nothing)."""
    stack = 0x7F00_0000
    run, p, c = _run(threads=2, cpus=2)
    c.stack(11, stack, 1 << 20)
    line = stack + (1 << 20) - 4096
    for src, dst, so, do in ((10, 11, 0, 8), (11, 10, 8, 0)):
        c.event(src=src, dst=dst, line=line, src_off=so, dst_off=do, store=True, count=30)
    res = _res(tmp_path, run)
    assert res["advice"] == [
        f"threads 0-1 write adjacent 8-byte fields of stack of thread 1 (tid 11) at "
        f"{line:#x}-{line + 8:#x} (a local variable other threads reach by its address); pad "
        "each to 64 bytes (alignas(64)) or give each thread its own line"
    ]


class FortranSym(MidLineSym):
    """The same `hits`, a Fortran module variable (`counters::hits`, as the symbolizer names
    gfortran's `__counters_MOD_hits`), written from a Fortran source."""

    def data(self, addrs):
        return {
            a: n and n.replace("hits", "counters::hits") for a, n in super().data(addrs).items()
        }

    def code(self, addrs, return_addresses=True):
        return {a: CodeLoc("MAIN__._omp_fn.0", "/src/fs.f90", 15) for a in addrs}


def test_advice_in_fortran_names_fortran_means(tmp_path):
    """Fortran has no alignas: for an array written from a .f90 source the advice pads a
    dimension (hits(8, nthreads), element 1 of each thread's column) or names a reduction."""
    res = _two_slots(tmp_path, FortranSym())
    assert res["objects"][0]["name"] == "counters::hits"
    assert res["advice"] == [
        "threads 0-1 write adjacent 8-byte elements of `counters::hits` at offsets 0-8; give "
        "each thread's element its own 64-byte line (declare 8 per thread, hits(8, nthreads), "
        "and use hits(1, t)) or accumulate in a private variable (an OpenMP reduction)"
    ]


class LockSym(MidLineSym):
    """The same two slots, written by glibc's mutex code (sysbench mutex keeps its mutexes
    in one array)."""

    def code(self, addrs, return_addresses=True):
        return {
            a: CodeLoc("lll_mutex_unlock_optimized", "pthread_mutex_unlock.c", 43) for a in addrs
        }


def test_advice_for_neighbouring_locks(tmp_path):
    """Words written by lock code are locks: the advice says so, and pads each lock (not
    "each field"), naming the lock function."""
    res = _two_slots(tmp_path, LockSym())
    assert res["advice"] == [
        "threads 0-1 use different locks that share 64-byte lines in `hits` at offsets 0-8 "
        "(in lll_mutex_unlock_optimized): taking one moves its neighbours' line too (false "
        "sharing, 100 % of its volume); give each lock its own 64-byte line (alignas(64)), or "
        "pad the element that holds it to 64 bytes"
    ]


def test_lock_code_names():
    for func in (
        "lll_mutex_lock_optimized",
        "__pthread_mutex_lock",
        "__GI___lll_lock_wait",
        "pthread_spin_lock",
        "omp_set_lock",
        "gomp_mutex_lock_slow",
        "std::mutex::lock()",
        "futex_wait",
    ):
        assert comm.LOCK_CODE.search(func), func
    for func in ("update_stats", "worker", "mutexes_init_table", "allocate_lll"):
        assert not comm.LOCK_CODE.search(func), func


HITS_DWARF = """
0x0000000c: DW_TAG_compile_unit
              DW_AT_language	(DW_LANG_C11)

0x00000020:   DW_TAG_base_type
                DW_AT_byte_size	(0x08)

0x00000030:   DW_TAG_array_type
                DW_AT_type	(0x00000020 "long int")

0x00000039:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(0x01)

0x0000003f:     NULL
"""


class LayoutSym(MidLineSym):
    """`hits` is `long hits[2]` in the program's DWARF."""

    def data_layout(self, name, addr):
        from locus.dwarf import Layout, parse

        assert (name, addr) == ("hits", 0x603020)
        return Layout(name, "long int[2]", 16, False, parse(HITS_DWARF), 0x30)


def test_advice_names_the_fields_from_dwarf(tmp_path):
    """With the variable's type from DWARF, the advice says which field each thread wrote."""
    res = _two_slots(tmp_path, LayoutSym())
    assert res["advice"] == [
        "threads 0-1 write adjacent 8-byte fields of `hits` at offsets 0-8 (thread 0 hits[0]; "
        "thread 1 hits[1]); pad each to 64 bytes (alignas(64)) or give each thread its own line"
    ]
    # The line starts 32 bytes before `hits`: bytes 32-39 are hits[0], 40-47 hits[1].
    (ln,) = res["lines"]
    assert [(t["bytes"], t["fields"]) for t in ln["threads"]] == [
        ([[32, 39]], ["hits[0]"]),
        ([[40, 47]], ["hits[1]"]),
    ]
    # The text's bytes column names them relative to the line's object.
    from locus.render.comm import _field_note

    assert _field_note(ln["threads"][1]["fields"], ln["object"]) == " ([1])"
    assert _field_note(["stats[0].hits", "stats[0].misses"], "stats") == " ([0].hits+)"
    assert _field_note([], "stats") == ""


PAIRS_DWARF = """
0x0000000c: DW_TAG_compile_unit
              DW_AT_language	(DW_LANG_C11)

0x00000020:   DW_TAG_base_type
                DW_AT_byte_size	(0x08)

0x00000028:   DW_TAG_structure_type
                DW_AT_name	("pair")
                DW_AT_byte_size	(0x10)

0x00000030:     DW_TAG_member
                  DW_AT_name	("a")
                  DW_AT_type	(0x00000020 "long int")
                  DW_AT_data_member_location	(0x00)

0x00000038:     DW_TAG_member
                  DW_AT_name	("b")
                  DW_AT_type	(0x00000020 "long int")
                  DW_AT_data_member_location	(0x08)

0x00000040:     NULL

0x00000048:   DW_TAG_array_type
                DW_AT_type	(0x00000028 "pair")

0x00000050:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(0x03)

0x00000058:     NULL
"""


# `struct pair { long v[2]; } pairs[4]`: the fields are the elements of the member `v` (the
# members of PAIRS_DWARF's `pair` replaced by that array).
PAIRS_ARRAY_DWARF = re.sub(
    r"0x00000030:.*?(?=0x00000040:)",
    """0x00000030:     DW_TAG_member
                  DW_AT_name	("v")
                  DW_AT_type	(0x00000024 "long int[2]")
                  DW_AT_data_member_location	(0x00)

""",
    PAIRS_DWARF,
    flags=re.S,
).replace(
    "0x00000028:   DW_TAG_structure_type",
    """0x00000024:   DW_TAG_array_type
                DW_AT_type	(0x00000020 "long int")

0x00000026:     DW_TAG_subrange_type
                  DW_AT_upper_bound	(0x01)

0x00000027:     NULL

0x00000028:   DW_TAG_structure_type""",
)


class PairsSym(MidLineSym):
    """`pairs` is `struct pair { long a, b; } pairs[4]` in the program's DWARF (or, with
    `arrays`, `struct pair { long v[2]; }`), 32 bytes into the line at 0x603000."""

    def __init__(self, arrays: bool = False):
        super().__init__("pairs", 64)
        self.dwarf = PAIRS_ARRAY_DWARF if arrays else PAIRS_DWARF

    def data_layout(self, name, addr):
        from locus.dwarf import Layout, parse

        assert (name, addr) == ("pairs", 0x603020)
        return Layout(name, "pair[4]", 64, False, parse(self.dwarf), 0x48)


@pytest.mark.parametrize("second", [16, 8, "v"])
def test_advice_names_the_structure_to_pad(tmp_path, second):
    """Thread 0 writes pairs[0].a; thread 1 pairs[1].a (16 bytes on): padding each `struct
    pair` to a line separates them, and the advice names the type (the issue's "fields of
    `struct stats`: pad each"). When thread 1 writes pairs[0].b instead, both fields are in
    one element: padding the structure would not separate them, and the advice says to pad
    each field, with alignas on each field (it said "pad each to 64 bytes (alignas(64))").
    When the two are elements of one array member (`pairs[0].v[0]`, `pairs[0].v[1]`),
    alignas on a field cannot part them: each element goes in a structure of its own (it
    said "pad each field ... (alignas(64) on each field)")."""
    arrays = second == "v"
    off = 8 if arrays else second
    run, p, c = _run(threads=2, cpus=2)
    for src, dst, so, do in ((10, 11, 32, 32 + off), (11, 10, 32 + off, 32)):
        c.event(src=src, dst=dst, line=0x603000, src_off=so, src_len=8, dst_off=do, dst_len=8,
                src_ip=0x401100, dst_ip=0x401100, store=True, count=30)  # fmt: skip
    for t in (10, 11):
        c.counters(t, samples=100, signals=100)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: PairsSym(arrays)))
    (advice,) = res["advice"]
    if arrays:
        assert advice == (
            "threads 0-1 write adjacent 8-byte elements of `pairs` at offsets 0-8 (thread 0 "
            "pairs[0].v[0]; thread 1 pairs[0].v[1]); pad each element of `v` to 64 bytes (an "
            "array of one-element structures, alignas(64) in their type) or give each thread "
            "its own line"
        )
        return
    fields = "thread 0 pairs[0].a; thread 1 " + ("pairs[1].a" if second == 16 else "pairs[0].b")
    each = "each `struct pair`" if second == 16 else "each field"
    align = "alignas(64)" if second == 16 else "alignas(64) on each field"
    assert advice == (
        f"threads 0-1 write adjacent 8-byte fields of `pairs` at offsets 0-{second} ({fields}); "
        f"pad {each} to 64 bytes ({align}) or give each thread its own line"
    )


def test_advice_for_an_array_both_threads_sweep(tmp_path):
    """Two threads update the same elements of `stats` at different times and neighbouring
    ones at the same time: every detection compares two different words (false sharing),
    but the samples show the same words written by one thread and used by the other. Padding
    each word would leave the true part; the advice says to partition or privatise. Per-
    thread fields sampled the same way (each thread only its own word) keep the padding
    advice."""
    for sweep in (True, False):
        run, p, c = _run(threads=2, cpus=2)
        for k in range(4):
            so, do = 16 * k, 16 * k + 8
            c.event(src=10, dst=11, line=STATS, src_off=so, dst_off=do, store=True, count=10)
            c.event(src=11, dst=10, line=STATS, src_off=do, dst_off=so, store=True, count=10)
        for t, own in ((10, 0), (11, 8)):
            for k in range(4):
                words = (16 * k, 16 * k + 8) if sweep else (16 * k + own,)
                for w in words:
                    c.sample(t, STATS + w, ip=0x401100, store=True)
            c.counters(t, samples=100, signals=100)
        res = _res(tmp_path, run, name=f"sweep{sweep}")
        (advice,) = res["advice"]
        if sweep:
            assert advice.startswith("threads 0-1 write neighbouring 8-byte words of `stats`")
            assert "true sharing: 8 of 8 sampled words used by two threads" in advice
            assert "give each thread its own block of whole lines" in advice
        else:
            assert "pad each to 64 bytes" in advice, advice


@pytest.mark.parametrize("false_count,advised", [(40, True), (20, False)])
def test_advice_from_a_quarter_false_sharing(tmp_path, false_count, advised):
    """An object that is 40 % false sharing (a lock array: the rest is the lock words) gets
    advice; one at 20 % does not."""
    run, p, c = _run(threads=2, cpus=2)
    # Each thread reads the other's word (false) or its own word after the other wrote it.
    for src, dst, so, do in ((10, 11, 0, 8), (11, 10, 8, 0)):
        for off, n in ((do, false_count), (so, 100 - false_count)):
            c.event(src=src, dst=dst, line=STATS, src_off=so, dst_off=off, store=True, count=n)
    for t in (10, 11):
        c.counters(t, samples=400, signals=400)
    res = _res(tmp_path, run)
    assert bool(res["advice"]) == advised, res["advice"]
    if advised:
        assert "`stats`" in res["advice"][0]


def test_no_advice_for_a_stray_transfer_or_a_lone_thread(tmp_path):
    """Advice needs two threads in the object and a share of the largest false sharing: an
    exact run's single false transfer on another object (seen from one side: the other
    thread's bytes lie outside it) next to thousands on `stats` gets none."""
    run, p, c = _run(threads=3, cpus=2, backend="exact")
    for src, dst, so, do in ((11, 12, 0, 8), (12, 11, 8, 0)):
        c.event(src=src, dst=dst, line=STATS, src_off=so, dst_off=do, store=True, volume=5000)
    # `counter` (8 bytes at the start of its line): thread 1 read it, after thread 0 wrote
    # byte 40, outside the object.
    c.event(src=10, dst=11, line=COUNTER, src_off=40, src_len=8, dst_off=0, dst_len=8)
    res = _res(tmp_path, run)
    assert {o["name"] for o in res["objects"]} == {"stats", "counter"}
    assert len(res["advice"]) == 1 and "`stats`" in res["advice"][0], res["advice"]


def test_thread_names_and_legend(tmp_path):
    """The system's thread names (from the counters records) are in `threads` as `os_name`,
    and the heat map's legend says what each index is, with the name where the program set
    one different from the main thread's."""
    run, p, c = _run(threads=2, cpus=2)
    c.event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, store=True, count=20)
    c.counters(10, samples=50, signals=50, name=b"app")
    c.counters(11, samples=50, signals=50, name=b"GC Thread#0")
    path = run.write(str(tmp_path / "names"))
    res = analyze(RunDir.open(path), FAKE)
    assert [t["os_name"] for t in res["threads"]] == ["app", "GC Thread#0"]
    report = build(RunDir.open(path), ["comm"], Filters())
    legend = [ln for ln in heatmap_lines(report) if "threads:" in ln]
    assert legend and "0 main (tid 10)" in legend[0] and "[GC Thread#0] (tid 11)" in legend[0]
    assert "[app]" not in legend[0]


def test_thread_work_names_what_a_trampoline_ran(tmp_path):
    """`work`: the function (and line) a thread was sampled in most, for threads started
    through a generic trampoline; the legend shows it. Too few samples name nothing."""
    run, p, c = _run(threads=3, cpus=2)
    c.event(src=11, dst=12, line=STATS, src_off=0, dst_off=8, store=True, count=20)
    for _ in range(15):
        c.sample(11, STATS, ip=0x401123)  # worker fs.c:291 (FakeSym: line = ip & 0xfff)
    for _ in range(5):
        c.sample(11, STATS, ip=0x401200)
    for _ in range(3):
        c.sample(10, STATS, ip=0x401300)  # main: 3 samples, below WORK_MIN
    for t in (10, 11, 12):
        c.counters(t, samples=20, signals=20)
    path = run.write(str(tmp_path / "work"))
    res = analyze(RunDir.open(path), FAKE)
    work = {t["tid"]: t["work"] for t in res["threads"]}
    assert work == {10: "", 11: "worker fs.c:291", 12: ""}, work
    assert "1 ? → worker fs.c:291 (tid 11)" in thread_legend(res["threads"])


def test_legend_shows_work_only_when_it_names_another_function():
    """`work` is "function file:line": a thread whose most sampled function is its own start
    routine gets no arrow (the legend said `2 work → work stats.c:13`)."""
    threads = [
        {"index": 0, "tid": 1, "name": "main", "work": "main app.c:3"},
        {"index": 1, "tid": 2, "name": "work", "work": "work app.c:13"},
        {"index": 2, "tid": 3, "name": "work", "work": "work_inner app.c:20"},
        {"index": 3, "tid": 4, "name": "OpenMP worker", "work": "main._omp_fn.0 omp.c:8"},
    ]
    legend = thread_legend(threads)
    assert "0 main (tid 1), 1 work (tid 2), 2 work → work_inner app.c:20 (tid 3)" in legend
    assert "3 OpenMP worker → main._omp_fn.0 omp.c:8 (tid 4)" in legend


def test_many_threads_listed_only_when_they_took_part(tmp_path):
    """Above 64 threads, `threads` keeps the main thread and those in events; the matrices
    follow it; `threads_total` counts every thread."""
    run = SynthCommRun(cpus=2)
    p = run.proc(pid=700)
    for i in range(100):
        p.thread(700 + i, 0.0, 1.0, parent=0 if i == 0 else 700)
    c = run.comm(p)
    c.event(src=750, dst=760, line=0x601000, count=3)
    res = analyze(RunDir.open(run.write(str(tmp_path / "r"))), FAKE)
    assert res["threads_total"] == 100
    assert [t["tid"] for t in res["threads"]] == [700, 750, 760]
    m = res["matrices"]["thread"]["all"]
    assert len(m) == 3 and m[1][2] == m[2][1] > 0 and m[0] == [0, 0, 0]
    assert any("left out of `threads`" in n for n in res["notes"])


def test_no_advice_from_a_few_samples(tmp_path):
    """Two sampled detections are too few to advise on (the object is still listed)."""
    path = false_sharing_run(str(tmp_path / "fs"), threads=2, n=1)
    res = analyze(RunDir.open(path), FAKE)
    assert res["objects"] and res["objects"][0]["detections"] < 10
    assert res["advice"] == []


def test_skipped_interrupts_broken_down(tmp_path):
    """Most interrupts without an access (sysbench mutex: 92 %): the header says what they
    were, and a note what that means for the volumes; a run with few has no note."""
    for skipped in (90, 10):
        run, p, c = _run(threads=2, cpus=2)
        c.event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, store=True, count=20)
        c.counters(10, samples=100 - skipped, signals=100, skipped=skipped, undecoded=5, kernel=1)
        path = run.write(str(tmp_path / f"skip{skipped}"))
        res = analyze(RunDir.open(path), FAKE)
        note = [n for n in res["notes"] if "gave no access" in n]
        head = summary_lines(build(RunDir.open(path), ["comm"], Filters()))[0]
        parts = f"{skipped - 6} no access, 5 undecodable, 1 in kernel"
        assert f"{skipped} skipped ({skipped} %: {parts})" in head, head
        if skipped == 90:
            assert note and note[0].startswith("90 % of the sampler's interrupts"), note
            assert "84 found no memory operand" in note[0]
        else:
            assert not note


def test_kind_and_by_filters(tmp_path, capsys):
    run, _p, c = _run(cpus=4)
    c.event(src=10, dst=11, line=COUNTER, src_cpu=0, dst_cpu=1, count=9)  # true
    c.event(src=12, dst=13, line=STATS, dst_off=8, src_cpu=2, dst_cpu=3, count=3)  # false
    path = run.write(str(tmp_path / "r"))
    argv = ["report", path, "--lens", "comm", "--format", "json"]
    assert main(argv + ["--kind", "false", "--by", "core"]) == 0
    r = json.loads(capsys.readouterr().out)["lenses"]["comm"]
    assert r["view"] == {"by": "core", "kind": "false"}
    assert [x["address"] for x in r["lines"]] == [hex(STATS)]  # counter: no false sharing
    assert all(x["false"] > 0 for x in r["objects"] + r["sites"])
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)["lenses"]["comm"]
    assert r["view"] == {"by": "thread", "kind": "all"} and len(r["lines"]) == 2
    assert r["lines"][0]["address"] == hex(COUNTER)
    rep = build(RunDir.open(path), ["comm"], Filters(by="core", kind="true"))
    pic = heatmap_lines(rep)
    assert "by CPU, true sharing" in pic[0]
    assert pic[2].split()[1] == "··██····"  # CPU 0 row: exchanged with CPU 1 only
    with pytest.raises(SystemExit):
        main(argv + ["--kind", "bogus"])


def test_empty_map_between_cpus_says_where_the_volume_went(tmp_path):
    """Two threads on one CPU communicate: the CPU matrix is all diagonal (zero), and the map
    says the volume was exchanged within a CPU rather than that there was none."""
    run, _p, c = _run()
    c.event(src=10, dst=11, line=COUNTER, src_cpu=1, dst_cpu=1, count=4)
    rep = build(RunDir.open(run.write(str(tmp_path / "r"))), ["comm"], Filters(by="core"))
    pic = heatmap_lines(rep)
    assert (
        len(pic) == 1 and "none between CPUs; all 4.00 ms was exchanged within each CPU" in pic[0]
    ), pic
    assert "zero by definition" in pic[0]
    rep = build(RunDir.open(str(tmp_path / "r")), ["comm"], Filters(by="thread"))
    assert "none" not in heatmap_lines(rep)[0]


def test_text_csv_md_and_plots(tmp_path, capsys):
    path = false_sharing_run(str(tmp_path / "fs"), threads=4, n=5)
    assert main(["report", path, "--lens", "comm", "--plot", str(tmp_path / "plots")]) == 0
    cap = capsys.readouterr()
    out = cap.out
    assert "Objects by communication volume" in out and "heat map by thread" in out
    assert "█" in out and "note:" in out
    assert "comm-thread.png" in cap.err
    for ext in ("png", "svg"):
        p = tmp_path / "plots" / f"comm-thread.{ext}"
        assert p.exists() and p.stat().st_size > 1000
    assert main(["report", path, "--lens", "comm", "--format", "csv"]) == 0
    csv = capsys.readouterr().out
    for section in ("# comm_objects", "# comm_lines", "# comm_sites", "# comm_matrix"):
        assert section in csv
    assert main(["report", path, "--lens", "comm", "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "## Cache lines by communication volume" in md and "comm_matrix" not in md


def test_many_threads_heat_map_is_aggregated(tmp_path):
    n = 80
    run, _p, c = _run(threads=n)
    for i in range(n - 1):
        c.event(src=10 + i, dst=11 + i, line=COUNTER)
    rep = build(RunDir.open(run.write(str(tmp_path / "r"))), ["comm"], Filters())
    assert len(rep["lenses"]["comm"]["matrices"]["thread"]["all"]) == n
    pic = heatmap_lines(rep)
    assert "(3 threads per cell)" in pic[0]
    rows = [ln for ln in pic[2:] if ln[:5].strip().isdigit()]
    assert len(rows) <= MAX_CELLS and max(len(r) for r in rows) <= 80
    assert render(rep, "text")  # fits the renderer end to end


def test_truncated_and_killed_files(tmp_path):
    run, _p, c = _run()
    c.event(src=10, dst=11, line=COUNTER, count=3)
    path = run.write(str(tmp_path / "r"))
    os.remove(os.path.join(path, "procs", "10", "comm.threads.bin"))
    res = analyze(RunDir.open(path), FAKE)
    assert res["totals"]["detections"] == 3
    assert any("no per-thread comm counters" in n for n in res["notes"])
    # Half a record is no killed writer's (the runtime extends its files in whole chunks):
    # the file was cut, and the run is refused (tests/integration/test_damaged_runs.py).
    ev = os.path.join(path, "procs", "10", "comm.events.bin")
    with open(ev, "ab") as f:
        f.write(b"\x01" * (COMM_EVENT_DTYPE.itemsize // 2))
    with pytest.raises(LocusError, match="is damaged: procs/10/comm.events.bin"):
        RunDir.open(path)


def test_no_events(tmp_path):
    run, _p, c = _run()
    c.counters(10, samples=10)
    res = _res(tmp_path, run)
    assert res["totals"]["all"] == 0 and res["objects"] == [] and res["lines"] == []
    assert any("no communication" in n for n in res["notes"])
    rep = build(RunDir.open(str(tmp_path / "run")), ["comm"], Filters())
    assert "none" in render(rep, "text")


def test_run_without_comm(tmp_path, capsys):
    run = SynthRun(lenses=["locks"])
    p = run.proc(pid=1)
    p.thread(1, 0.0, 1.0)
    path = run.write(str(tmp_path / "r"))
    with pytest.raises(LocusError, match="lens 'comm' was not recorded"):
        analyze(RunDir.open(path), FAKE)
    assert main(["report", path, "--lens", "comm"]) == 1
    err = capsys.readouterr().err
    assert "lens 'comm' was not recorded" in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_compare_comm_runs_and_gate_on_false_sharing(tmp_path, capsys):
    """`locus compare` on comm runs: totals side by side; --fail-if on comm.totals.false."""
    a = false_sharing_run(str(tmp_path / "a"), threads=4, n=20)
    b = false_sharing_run(str(tmp_path / "b"), threads=4, n=40)
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "comm.totals.false" in out and "+100%" in out
    assert main(["compare", a, b, "--fail-if", "comm.totals.false>+50%"]) == 1
    assert main(["compare", a, b, "--fail-if", "comm.totals.false>+150%"]) == 0
    # From none to some (a padded build, then false sharing): the gate passed (no change
    # from 0 was computed).
    run, _p, c = _run()
    c.event(src=10, dst=11, line=COUNTER, count=3)  # true sharing only: false = 0
    z = run.write(str(tmp_path / "z"))
    capsys.readouterr()
    assert main(["compare", z, b, "--fail-if", "comm.totals.false>+20%"]) == 1
    assert "(from 0)" in capsys.readouterr().out
    # Soft seconds against exact lines: no change is computed, and a gate is refused.
    x = SynthCommRun(backend="exact")
    xp = x.proc(pid=10)
    for i in range(2):
        xp.thread(10 + i, 0.0, 1.0)
    x.comm(xp).event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, count=50)
    xd = x.write(str(tmp_path / "x"))
    assert main(["compare", a, xd]) == 0
    out = capsys.readouterr()
    assert (
        "different units" in out.err
        and "%)" not in out.out.split("comm.totals.all")[1].split("\n")[0]
    )
    assert main(["compare", a, xd, "--fail-if", "comm.totals.false>+20%"]) == 2
    assert main(["compare", a, xd, "--fail-if", "comm.samples>+20%"]) == 2  # samples/accesses
    # An exact run's detections are aggregates: no gate on them.
    assert main(["compare", xd, xd, "--fail-if", "comm.totals.detections>+10%"]) == 2


def test_trampolines_named_as_users_know_them():
    """A thread started by std::thread, libgomp, Rust's std or Go's cgo runs a trampoline:
    `name` says which (its `work` says what it ran); any other start routine is its own name."""
    from locus.analysis.common import trampoline_name

    assert trampoline_name("libstdc++.so.6.0.30+0xd4490") == "std::thread"
    assert trampoline_name("execute_native_thread_routine") == "std::thread"
    assert trampoline_name("libgomp.so.1.0.0+0x1cc40") == "OpenMP worker"
    assert trampoline_name("std::sys::pal::unix::thread::Thread::new::thread_start") == (
        "Rust thread"
    )
    assert trampoline_name("<std::sys::thread::unix::Thread>::new::thread_start") == (
        "Rust thread"  # rustc 1.95
    )
    assert trampoline_name("libtbb.so.12.8+0x22180") == "TBB worker"
    assert trampoline_name("threadentry") == "Go thread"
    assert trampoline_name("worker") == "worker"
    assert trampoline_name("sysbench+0xc600") == "sysbench+0xc600"


def test_long_thread_lists_are_cut_with_their_count():
    """A thousand threads whose indices scatter (the exact backend's 1000-thread counter run)
    gave an advice line of 30 terminal lines and squeezed the object's name out of the
    objects table: lists are cut after 8 ranges with the count, 3 without it in a table."""
    from locus.analysis.common import ranges

    idx = list(range(64)) + list(range(65, 200, 2))
    assert ranges([0, 1, 2, 3, 5]) == "0-3,5"
    assert ranges(idx) == "0-63,65,67,69,71,73,75,77,… (132 in all)"
    assert ranges(idx, most=3, count=False) == "0-63,65,67,…"
    assert ranges(list(range(1000))) == "0-999"


@pytest.mark.parametrize("far", [5, 40])
def test_advice_about_the_line_that_holds_most_false_sharing(tmp_path, far):
    """A queue (`q`, 256 bytes, 32 bytes into 0x603000's line) whose head and tail (q+0,
    q+8) two threads write, and whose ring (q+96, q+104) they also touch less often: the
    advice named offsets 0-104 and the ring's elements first (fields were sorted by name).
    When one line holds at least 3/4 of the false sharing, the advice is about that line."""
    run, p, c = _run(threads=2, cpus=2)
    for line, so, do, n in ((0x603000, 32, 40, 40), (0x603080, 0, 8, far)):
        for src, dst, a, b in ((10, 11, so, do), (11, 10, do, so)):
            c.event(src=src, dst=dst, line=line, src_off=a, src_len=8, dst_off=b, dst_len=8,
                    src_ip=0x401100, dst_ip=0x401100, store=True, count=n)  # fmt: skip
    for t in (10, 11):
        c.counters(t, samples=200, signals=200)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: MidLineSym("q", 256)))
    (advice,) = res["advice"]
    if far == 5:
        assert "`q` at offsets 0-8, the 64-byte line with 89 % of its false sharing;" in advice
    else:
        assert "`q` at offsets 0-104;" in advice, advice


def test_advice_lists_each_threads_busiest_field_first(tmp_path):
    """Fields were listed by name: thread 1, mostly on hits[1], read `hits[0], hits[1]`."""
    run, p, c = _run(threads=2, cpus=2)
    for src, dst, so, do, n in ((10, 11, 32, 40, 40), (11, 10, 40, 32, 40), (10, 11, 40, 32, 2)):
        c.event(src=src, dst=dst, line=0x603000, src_off=so, src_len=8, dst_off=do, dst_len=8,
                src_ip=0x401100, dst_ip=0x401100, store=True, count=n)  # fmt: skip
    for t in (10, 11):
        c.counters(t, samples=100, signals=100)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: LayoutSym()))
    (advice,) = res["advice"]
    assert "(thread 0 hits[0], hits[1]; thread 1 hits[1], hits[0])" in advice, advice


@pytest.mark.parametrize("cyclic", [False, True], ids=["sweep", "cyclic"])
def test_advice_for_false_sharing_spread_over_a_large_block(tmp_path, cyclic):
    """Two threads writing over the same 1 MiB block at once (each memsets it): 40 lines
    far apart, none with more than 1/40 of the false sharing. The advice padded the busiest
    ("pad each to 64 bytes ... (the busiest of 171 such lines, spread over 253.1 MiB of it:
    each is a case of its own)", stress-ng memthrash); it now says that the threads sweep
    the same memory. A cyclic distribution over such a block (each thread its own elements
    in turn) keeps its own advice."""
    heap = 0x7000_0000
    run, p, c = _run(threads=2, cpus=2)
    c.malloc(heap, 1 << 20, site=0x401234, t=0.1)
    for j in range(40):
        line = heap + 64 * 400 * j
        for src, dst in ((10, 11), (11, 10)):
            if cyclic:  # thread 10 the even words, 11 the odd ones, two in each line
                even = 16 * (j % 4)
                so, do = (even, even + 8) if src == 10 else (even + 8, even)
            else:  # both the whole line, two words of it apart
                so, do = (8 * (j % 8), 8 * ((j + 3) % 8))
            c.event(src=src, dst=dst, line=line, src_off=so, src_len=8, dst_off=do,
                    dst_len=8, store=True, t=0.5)  # fmt: skip
    res = _res(tmp_path, run, name=str(cyclic))
    (advice,) = res["advice"]
    if cyclic:
        assert "write interleaved 8-byte elements" in advice, advice
        return
    assert advice == (
        "threads 0-1 write 40 lines of heap block from worker fs.c:564 spread over 975.1 KiB "
        "of it, none with more than 2 % of its false sharing: they work over the same memory "
        "at the same time (each sweeps or copies it: the code sites say where), which padding "
        "cannot part; give each thread its own part of it, in whole 64-byte lines, or let one "
        "thread do that work"
    ), advice


def test_advice_for_a_cyclic_distribution(tmp_path):
    """Two threads updating the even and the odd elements of one heap array (OpenMP
    schedule(static,1)): every line is shared, and padding each element (the advice before)
    would take 8 times the memory; the fix is contiguous blocks of whole lines."""
    from locus.analysis.comm import _ordinal

    heap = 0x7000_0000
    run, p, c = _run(threads=2, cpus=2)
    c.malloc(heap, 4096, site=0x401234, t=0.1)
    for j in range(8):
        for w in (0, 2, 4, 6):
            for src, dst, so, do in ((10, 11, 8 * w, 8 * w + 8), (11, 10, 8 * w + 8, 8 * w)):
                c.event(src=src, dst=dst, line=heap + 64 * j, src_off=so, src_len=8,
                        dst_off=do, dst_len=8, store=True, t=0.5)  # fmt: skip
    res = _res(tmp_path, run)
    (advice,) = res["advice"]
    assert advice.startswith(
        "threads 0-1 write interleaved 8-byte elements of heap block from worker fs.c:564 at "
        "offsets 0-504: each thread every 2nd element (a cyclic distribution"
    ), advice
    assert "chunk size of at least 8 elements" in advice
    assert [_ordinal(k) for k in (2, 3, 4, 11, 21, 22, 112)] == [
        "2nd",
        "3rd",
        "4th",
        "11th",
        "21st",
        "22nd",
        "112th",
    ]


def test_exact_names_the_threads_it_did_not_track(tmp_path):
    """A thread that started while 1024 others were live has no slot in the exact model:
    none of its accesses were seen, not even as `skipped` (1100 live workers: 77 such)."""
    run, _p, c = _run(backend="exact")
    c.event(src=10, dst=11, line=COUNTER, volume=3.0, count=1)
    c.counters(10, samples=100, backend=3)
    c.counters(11, samples=100, backend=3)
    c.counters(12, samples=0, backend=3, flags=2)  # LOCUS_CT_UNTRACKED
    res = _res(tmp_path, run, name="exact")
    note = next(n for n in res["notes"] if "not tracked at all" in n)
    assert note.startswith("exact: 1 thread(s) were not tracked at all"), note


def test_heat_map_columns_from_ten_threads_and_md_without_a_map(tmp_path, capsys):
    """12 threads: the column header read '0 1 2 ... 8 91011'; now the tens stand above the
    units. A map that is only its title gave Markdown an empty code block."""
    run, _p, c = _run(threads=12)
    c.event(src=10, dst=21, line=COUNTER, count=2)
    rep = build(RunDir.open(run.write(str(tmp_path / "r"))), ["comm"], Filters())
    pic = heatmap_lines(rep)
    assert pic[1].split() == ["1", "1"] and pic[2].split() == [str(i % 10) for i in range(12)]
    assert pic[1].index("1") == pic[2].index("0", pic[2].index("9"))  # above 10's units
    run, _p, c = _run()
    c.event(src=10, dst=11, line=COUNTER, src_cpu=1, dst_cpu=1, count=4)
    path = run.write(str(tmp_path / "one-cpu"))
    assert main(["report", path, "--lens", "comm", "--by", "core", "--format", "md"]) == 0
    md = capsys.readouterr().out
    title = next(i for i, ln in enumerate(md.splitlines()) if "heat map by CPU" in ln)
    assert "```" not in md.splitlines()[title + 1 : title + 3], md


def test_lines_table_names_code_with_file_and_line(tmp_path, capsys):
    """The lines table's `code` column kept only the function ('work'), where the sites
    and the docs have 'work p2p.c:9'."""
    path = false_sharing_run(str(tmp_path / "fs"), threads=2, n=5)
    rep = build(RunDir.open(path), ["comm"], Filters())
    rep["lenses"]["comm"]["lines"][0]["sites"] = ["work /src/p2p.c:9", "0x401100"]
    lines = next(t for t in comm_tables(rep) if t.name == "comm_lines")
    assert lines.rows[0]["code"] == "work p2p.c:9\n0x401100"
    cxx = "std::vector<int>::at(unsigned long) const"
    assert _short_site(cxx) == cxx  # no file:line: as it is (it was cut at the first space)
    assert _short_site(f"{cxx} /usr/include/c++/12/bits/stl_vector.h:1123") == (
        f"{cxx} stl_vector.h:1123"
    )


def test_top_zero_shows_every_row(tmp_path, capsys):
    """Cut tables say "--top 0 for all", which was refused ("must be positive")."""
    path = false_sharing_run(str(tmp_path / "fs"), threads=2, n=5)
    assert main(["report", path, "--lens", "comm", "--top", "0"]) == 0


def test_by_a_view_no_reported_lens_has(tmp_path, capsys):
    """`--by site` under --lens comm was ignored silently (numa's view)."""
    path = false_sharing_run(str(tmp_path / "fs"), threads=2, n=5)
    assert main(["report", path, "--lens", "comm", "--by", "site"]) == 2
    assert "--by site applies to no lens of this report" in capsys.readouterr().err


def test_meta_values_out_of_range(tmp_path):
    """A hand-edited or damaged meta.json: a line size of 1e308, a count period of 1e308
    and 2^70 CPUs were tracebacks (OverflowError, non-JSON floats, a numpy dimension)."""
    run, _p, c = _run()
    c.event(src=10, dst=11, line=COUNTER, count=2)
    path = run.write(str(tmp_path / "r"))
    meta_path = os.path.join(path, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta.setdefault("comm", {}).update(line_size=1e308, period_n=1e308)
    meta.setdefault("host", {})["cpus"] = 2**70
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    rep = build(RunDir.open(path), ["comm"], Filters())
    c = rep["lenses"]["comm"]
    assert c["line_size"] == 64 and any("not a cache line's" in n for n in c["notes"])
    json.dumps(rep, allow_nan=False)  # what --format json writes
    assert render(rep, "text")


class VectorSym(FakeSym):
    """A -O0 std::vector: operator new is called from `allocate` in new_allocator.h, through
    five more frames of libstdc++ headers, from main at vec.cpp:7."""

    NEW = "std::__new_allocator<std::atomic<int> >::allocate(unsigned long, void const*)"

    def code(self, addrs, return_addresses=True):
        hdr = "/usr/include/c++/12/bits/"
        table = {
            0x401510: CodeLoc(self.NEW, hdr + "new_allocator.h", 137),
            0x401520: CodeLoc(
                "std::allocator_traits<A>::allocate(A&, unsigned long)", hdr + "alloc_traits.h", 464
            ),  # fmt: skip
            0x401530: CodeLoc(
                "std::_Vector_base<int>::_M_create_storage(unsigned long)",
                hdr + "stl_vector.h",
                398,
            ),  # fmt: skip
            0x401540: CodeLoc("main", "/src/vec.cpp", 7),
        }
        return {a: table.get(a, CodeLoc("worker", "/src/vec.cpp", 20)) for a in addrs}


def test_heap_object_named_past_library_headers(tmp_path):
    """With a call stack, the frames in system headers are skipped like wrappers and not
    listed ('via std::__new_allocator<...>::allocate(unsigned long, void const*),
    std::allocator_traits<...>, ...': six frames, thirty terminal lines); without one, the
    header's function is named short."""
    for stacks in (True, False):
        run, p, c = _run(threads=3)
        if stacks:
            c.call_stack(1, [0x401510, 0x401520, 0x401530, 0x401540])
        c.malloc(0x7000_0000, 64, site=0x401510, t=0.1, stack=1 if stacks else 0)
        c.event(src=10, dst=11, line=0x7000_0000, t=0.5, count=2)
        res = _res(tmp_path, run, Options(symbolizer=lambda proc: VectorSym()), f"v{stacks}")
        names = [o["name"] for o in res["objects"]]
        # A line's object is the objects table's name (the line said the header's function).
        assert [ln["object"] for ln in res["lines"]] == names, res["lines"]
        if stacks:
            assert names == ["heap block from main vec.cpp:7"], names
        else:
            assert names == ["heap block from std::__new_allocator::allocate new_allocator.h:137"]


def test_via_text_is_short():
    from locus.analysis.common import short_function, via_text

    assert short_function(VectorSym.NEW) == "std::__new_allocator::allocate"
    assert short_function("operator new(unsigned long)") == "operator new"
    assert via_text([]) == ""
    assert via_text(["xmalloc"]) == " (via xmalloc)"
    assert via_text(["a(int)", "b<int>::c()", "d", "e"]) == " (via a, b::c, +2 more)"


def test_objects_of_forked_processes_say_whose(tmp_path):
    """A static shared in a parent and in its forked child: two rows 'fsv static', and the
    legend's '0 main', '3 main'. The text now names the pid of each (JSON had it); rich took
    '[pid N]' for markup and dropped it."""
    from locus.report import filter_comm

    path = false_sharing_run(str(tmp_path / "fs"), threads=2, n=5)
    rep = build(RunDir.open(path), ["comm"], Filters())
    rep["lenses"]["comm"] = c = filter_comm(analyze(RunDir.open(path), FAKE), Filters())
    (o,) = c["objects"]
    c["objects"] = [dict(o, pid=100), dict(o, pid=200, all=o["all"] / 2, false=o["false"] / 2)]
    c["threads"] = [dict(t, pid=100 if t["index"] < 2 else 200) for t in c["threads"]]
    c["threads"].append(dict(c["threads"][-1], index=2, tid=201, pid=200))
    text = " ".join(render(rep, "text").split())
    assert f"{o['name']} [pid 100]" in text and f"{o['name']} [pid 200]" in text, text
    assert "(pid 200, tid 201)" in text, text


class NeighbourSym(FakeSym):
    """Two 8-byte statics side by side on one line: `hits_a` at 0x603000, `hits_b` at
    0x603008."""

    def data(self, addrs):
        names = {0x603000: "hits_a", 0x603008: "hits_b", 0x603010: "iter"}
        out = {}
        for a in addrs:
            base = a & ~7
            out[a] = (
                (names[base] if a == base else f"{names[base]}+{a - base}")
                if base in names
                else None
            )
        return out

    def data_size(self, name):
        return 8 if name in ("hits_a", "hits_b", "iter") else None


def test_advice_for_neighbouring_variables_of_one_thread_each(tmp_path):
    """`long hits_a, hits_b;` each written by its own thread: all of it false sharing, and
    no advice (no object alone shows two threads); the line does."""
    run, _p, c = _run()
    for k in range(24):
        a, b = (10, 11) if k % 2 else (11, 10)
        off = {10: 0, 11: 8}
        c.event(src=a, dst=b, line=0x603000, src_off=off[a], dst_off=off[b], store=True)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: NeighbourSym()))
    assert sorted(o["name"] for o in res["objects"]) == ["hits_a", "hits_b"]
    (adv,) = res["advice"]
    want = "threads 0-1 each write their own variable, `hits_a` (thread 0), `hits_b` (thread 1)"
    assert adv.startswith(want + ", and these share the 64-byte line 0x603000"), adv
    assert "alignas(64)" in adv


def test_a_reused_thread_stack_belongs_to_the_thread_of_the_time(tmp_path):
    """glibc gives a joined thread's stack to the next thread (sort's workers ran one after
    another on one stack): every event on it was 'stack of thread 1', the first owner."""
    run, _p, c = _run(threads=4)
    lo = 0x7F00_0000_0000
    c.stack(11, lo, 1 << 20, t=0.1)
    c.stack(13, lo, 1 << 20, t=0.5)  # thread 11 ended; 13 got its stack
    c.event(src=12, dst=11, line=lo + 4096, t=0.2, count=2)
    c.event(src=12, dst=13, line=lo + 8192, t=0.7, count=3)
    res = _res(tmp_path, run)
    by = {o["name"]: o for o in res["objects"]}
    assert by["stack of thread 1 (tid 11)"]["detections"] == 2, by
    assert by["stack of thread 3 (tid 13)"]["detections"] == 3, by


class StrippedSym(FakeSym):
    """Code at 0x4019xx has no symbol (a stripped library's loop): liblzma.so.5+0x..."""

    def code(self, addrs, return_addresses=True):
        return {
            a: CodeLoc("", "", 0) if a & 0xFF00 == 0x1900 else CodeLoc("worker", "/src/fs.c", 7)
            for a in addrs
        }

    def module_offset(self, ip):
        return f"liblzma.so.5+{ip - 0x400000:#x}"


def test_thread_work_counts_code_without_symbols(tmp_path):
    """xz's workers spent their samples in stripped liblzma: `work` was "" (only named code
    counted), and a thread with a few named samples was named by them."""
    run, p, c = _run(threads=2, cpus=2)
    for k in range(30):
        c.sample(11, STATS, ip=0x401900 + 4 * (k % 6))  # one loop, several instructions
    for _ in range(12):
        c.sample(11, STATS, ip=0x401123)  # a named function, fewer samples
    for t in (10, 11):
        c.counters(t, samples=42, signals=42)
    res = analyze(
        RunDir.open(run.write(str(tmp_path / "w"))), Options(symbolizer=lambda p: StrippedSym())
    )
    work = {t["tid"]: t["work"] for t in res["threads"]}
    assert work[11] == "liblzma.so.5 (no symbols)", work


def test_advice_for_a_variable_only_read_beside_written_ones(tmp_path):
    """`iter`, only read by both threads, shares a line with two counters they write: its
    advice said "threads 0-1 access different bytes of the same line of `iter` ... separate
    what each thread writes", though nobody writes it."""
    run, _p, c = _run()
    for k in range(24):
        a, b = (10, 11) if k % 2 else (11, 10)
        c.event(src=a, dst=b, line=0x603000, src_off={10: 0, 11: 8}[a], dst_off=16)  # a read
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: NeighbourSym()))
    (adv,) = res["advice"]
    assert adv.startswith("threads 0-1 only read `iter`, which shares 64-byte lines with data "
                          "other threads write"), adv  # fmt: skip


def test_fields_smaller_than_a_word_are_not_true_sharing(tmp_path):
    """Two threads each writing their own 2-byte field of one 8-byte word (`struct { short
    a, b; }`): the advice said "... and the same words at other times (true sharing: 2 of 2
    sampled words used by two threads)": words were the unit. Bytes are."""
    run, p, c = _run(threads=2, cpus=2)
    for k in range(4):
        base = 16 * k
        c.event(src=10, dst=11, line=STATS, src_off=base, src_len=2, dst_off=base + 2,
                dst_len=2, store=True, count=10)  # fmt: skip
        c.event(src=11, dst=10, line=STATS, src_off=base + 2, src_len=2, dst_off=base,
                dst_len=2, store=True, count=10)  # fmt: skip
    for t, own in ((10, 0), (11, 2)):
        for k in range(4):
            c.sample(t, STATS + 16 * k + own, ip=0x401100, store=True, length=2)
        c.counters(t, samples=100, signals=100)
    (advice,) = _res(tmp_path, run)["advice"]
    assert "true sharing" not in advice and "pad each to 64 bytes" in advice, advice


def test_alignment_advice_in_the_sources_language():
    """Rust and Go programs were told to use alignas(64), which neither has."""
    from locus.analysis.comm import _align

    def at(f):
        return {"function": "f", "file": f, "line": 1}

    assert _align(at("/src/fs.c"), 64) == " (alignas(64))"
    assert _align(at("/src/fs.cpp"), 64) == " (alignas(64))"
    assert "#[repr(align(64))]" in _align(at("/src/main.rs"), 64)
    assert "`_ [56]byte`" in _align(at("/src/main.go"), 64, 8)
    assert _align(at("/src/m.f90"), 64) == ""
    assert _align(None, 64) == " (alignas(64))"


def test_advice_for_a_shared_variable_whose_line_moves_for_its_neighbour(tmp_path):
    """`shared_crit`, which every thread writes (in a critical section), beside an atomic
    they also write: exact gave "threads 0-1 access different bytes of the same line of
    `shared_crit` at offset 0" (they use the same 8 bytes); its false sharing is its
    neighbour's doing."""
    run, _p, c = _run()
    for k in range(24):
        a, b = (10, 11) if k % 2 else (11, 10)
        c.event(src=a, dst=b, line=0x603000, src_off=8, dst_off=16, store=True)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: NeighbourSym()))
    (adv,) = res["advice"]
    assert adv.startswith("threads 0-1 use `iter`, which shares 64-byte lines with data other "
                          "threads write"), adv  # fmt: skip
    assert "takes the line from them" in adv


def test_objects_of_one_name_are_told_apart_by_size(tmp_path):
    """Two blocks from one allocation wrapper (x264_malloc, no call stacks) were two rows of
    one name."""
    from locus.report import filter_comm

    path = false_sharing_run(str(tmp_path / "fs"), threads=2, n=5)
    rep = build(RunDir.open(path), ["comm"], Filters())
    rep["lenses"]["comm"] = c = filter_comm(analyze(RunDir.open(path), FAKE), Filters())
    (o,) = c["objects"]
    c["objects"] = [dict(o, size=74304), dict(o, size=5189120, all=o["all"] / 2)]
    text = " ".join(render(rep, "text").split())
    assert f"{o['name']} (74304 B)" in text and f"{o['name']} (5189120 B)" in text, text


class GoArenaSym(FakeSym):
    """The heap of a Go program built with cgo: mapped by x_cgo_mmap."""

    def code(self, addrs, return_addresses=True):
        return {
            a: CodeLoc("x_cgo_mmap", "gcc_mmap.c", 19)
            if a == 0x401700
            else CodeLoc("main.work", "/src/fs.go", 22)
            for a in addrs
        }


def test_go_heap_arena_named_as_such(tmp_path):
    """Every Go value lives in an arena the runtime maps (x_cgo_mmap with cgo): the object
    was 'heap block from x_cgo_mmap gcc_mmap.c:19' and the advice gave offsets of megabytes
    into it; now the arena is named so and the advice gives addresses."""
    run, p, c = _run(threads=3)
    arena = 0x7000_0000_0000
    c.malloc(arena, 64 << 20, site=0x401700, t=0.1, mmap=True)
    for k in range(12):
        a, b = (11, 12) if k % 2 else (12, 11)
        off = 3735744
        c.event(src=a, dst=b, line=arena + off, src_off=0 if a == 11 else 8,
                dst_off=0 if b == 11 else 8, store=True, dst_ip=0x401123)  # fmt: skip
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: GoArenaSym()))
    (o,) = res["objects"]
    assert o["name"] == "Go heap arena (mapped by x_cgo_mmap gcc_mmap.c:19)", o["name"]
    (adv,) = res["advice"]
    assert f"at {arena + 3735744:#x}-{arena + 3735752:#x} (a Go value" in adv, adv
    assert "`_ [56]byte`" in adv, adv


def test_node_matrix_follows_emulated_nodes(tmp_path):
    """comm,numa with --fake-numa 2: numa reported two nodes (CPU 0, CPU 1) while the comm
    node matrix read the machine's one node ("all ... exchanged in one node")."""
    run, _p, c = _run(cpus=2)
    c.event(src=10, dst=11, line=COUNTER, src_cpu=0, dst_cpu=1, count=4)
    path = run.write(str(tmp_path / "r"))
    meta_path = os.path.join(path, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta.setdefault("host", {})["cpu_node"] = [0, 0]
    meta["numa"] = {"emulated": True, "cpu_node": [0, 1]}
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    res = analyze(RunDir.open(path), FAKE)
    assert res["matrices"]["node"]["all"] == [[0.0, 4e-3], [4e-3, 0.0]], res["matrices"]["node"]


class OneLockSym(FakeSym):
    """`stats` (64 bytes) taken as one mutex: every access is in glibc's lock code."""

    def code(self, addrs, return_addresses=True):
        return {a: CodeLoc("lll_mutex_lock_optimized", "pthread_mutex_lock.c", 93) for a in addrs}


def test_advice_for_one_contended_lock(tmp_path):
    """One mutex taken by three threads: its lock word and owner field, written by different
    threads, read as false sharing, and the advice said "threads 1-3 use different locks
    that share 64-byte lines in `big_lock` ... give each lock its own line": there is one
    lock, and padding removes nothing."""
    run, _p, c = _run()
    for k in range(24):
        a, b = (10 + k % 3, 10 + (k + 1) % 3)
        c.event(src=a, dst=b, line=STATS, src_off=8 * (k % 2), dst_off=8 * ((k + 1) % 2),
                store=True, dst_ip=0x401100)  # fmt: skip
    (adv,) = _res(tmp_path, run, Options(symbolizer=lambda proc: OneLockSym()))["advice"]
    assert adv.startswith("threads 0-2 take the one lock `stats`"), adv
    assert "padding does not remove" in adv and "alignas" not in adv, adv


class PaddedLocksSym(FakeSym):
    """`locks`, four mutexes 296 bytes apart (sysbench mutex's `pthread_mutex_t mutex; char
    pad[256]`) at 0x604000, every access in glibc's lock code; `adjacent`: 40 bytes apart."""

    def __init__(self, stride: int = 296):
        self.stride = stride

    def data(self, addrs):
        n = 4 * self.stride
        return {a: ("locks" if a == 0x604000 else f"locks+{a - 0x604000}") if 0 <= a - 0x604000 < n
                else None for a in addrs}  # fmt: skip

    def data_size(self, name):
        return 4 * self.stride if name == "locks" else super().data_size(name)

    def code(self, addrs, return_addresses=True):
        return {a: CodeLoc("__pthread_mutex_lock", "pthread_mutex_lock.c", 93) for a in addrs}


@pytest.mark.parametrize("stride", [296, 40])
def test_advice_for_locks_with_lines_of_their_own(tmp_path, stride):
    """Three threads take two mutexes of an array at random: each lock's word and owner
    field, written by different threads, read as false sharing. With the locks 296 bytes
    apart (sysbench mutex) each line holds one lock's words, and the advice said "use
    different locks that share 64-byte lines ... give each lock its own line": they have
    one, and it is the locks' contention. 40 bytes apart, two locks share a line."""
    run, _p, c = _run()
    for k in range(24):
        a, b = (10 + k % 3, 10 + (k + 1) % 3)
        base = 0x604000 + stride * (k % 2)  # lock 0, then lock 1
        line, at, w = base & ~63, base & 63, 8 * (k % 3 == 0)  # the lock word or the owner
        c.event(src=a, dst=b, line=line, src_off=at + w, dst_off=at + 8 - w, src_len=4,
                dst_len=4, store=True, dst_ip=0x401100)  # fmt: skip
    sym = PaddedLocksSym(stride)
    (adv,) = _res(tmp_path, run, Options(symbolizer=lambda proc: sym))["advice"]
    if stride == 296:
        assert adv.startswith("threads 0-2 take locks of `locks`"), adv
        assert "a line of their own" in adv and "alignas" not in adv, adv
    else:
        assert adv.startswith("threads 0-2 use different locks that share 64-byte lines"), adv


class _TwoMutexes:
    """`struct { pthread_mutex_t m1, m2; } s`'s fields by offset (glibc, x86-64)."""

    FIELDS = {0: "__lock", 4: "__count", 8: "__owner", 12: "__nusers", 16: "__kind"}

    def field(self, off):
        m, at = divmod(off, 40)
        return f"s.m{m + 1}.__data.{self.FIELDS.get(at, '__list')}"


def test_two_locks_on_a_line_are_told_apart_by_their_fields():
    """Thread 1 sampled at `s.m1.__data.__kind` (16) and thread 2 at `s.m2.__data.__lock`
    (40): 28 bytes, less than a mutex, so the span rule read one lock on the line, and the
    advice said the locks had lines of their own (test_two_mutexes_taken_by_turns_are_
    different_locks failed 1 run in 10). The fields say two locks."""
    acc = [(1, 16, 4, 0, 1.0), (2, 40, 4, 0, 1.0)]
    assert comm._lock_a_line(acc, 40)  # the span alone
    assert not comm._lock_a_line(acc, 40, _TwoMutexes())
    one = [(1, 40, 4, 0, 1.0), (2, 48, 4, 0, 1.0)]  # m2's lock word and owner
    assert comm._lock_a_line(one, 40, _TwoMutexes())
    assert comm._lock_instance("locks[3].mutex.__data.__lock") == "locks[3].mutex"
    assert comm._lock_instance("s.hits") is None and comm._lock_instance("__x") is None


def test_a_program_that_allocates_constantly_is_told_its_cost(tmp_path):
    """openssl speed ran 3-4x slower under comm beside "overhead ... 1.9 % of thread time":
    the heap records are not timed. A note estimates their cost."""
    run = SynthCommRun()
    p = run.proc(pid=10)
    p.thread(10, 0.0, 0.001)  # 1 ms of thread time, 2000 records: 80 us at 40 ns
    c = run.comm(p)
    for k in range(1000):
        c.malloc(0x7000_0000 + 64 * k, 32, t=0.0005)
        c.free(0x7000_0000 + 64 * k, t=0.0006)
    res = _res(tmp_path, run)
    (note,) = [n for n in res["notes"] if "heap allocation and free records" in n]
    assert note.startswith("2,000 heap allocation and free records") and "8 % of thread" in note
    run2, _p, _c = _run()
    assert not any("heap allocation" in n for n in _res(tmp_path, run2, name="quiet")["notes"])
    # The blocks whose records the runtime dropped cost about a record each: 200 records and
    # 1,800 dropped blocks are the same 8 %; 200 records alone say nothing.
    run3 = SynthCommRun()
    p3 = run3.proc(pid=10)
    p3.thread(10, 0.0, 0.001)
    c3 = run3.comm(p3)
    for k in range(100):
        c3.malloc(0x7000_0000 + 64 * k, 32, t=0.0005)
        c3.free(0x7000_0000 + 64 * k, t=0.0006)
    assert not any("heap allocation" in n for n in _res(tmp_path, run3, name="few")["notes"])
    p3.heap_dropped = 1800
    res3 = _res(tmp_path, run3, name="dropped")
    assert res3["heap_blocks"] == {"blocks": 100, "frees": 100, "short_lived": 1800}
    (note,) = [n for n in res3["notes"] if "heap alloc" in n]
    assert note.startswith(
        "200 heap allocation and free records, and 1,800 short-lived blocks whose records were "
        "dropped"
    ), note
    assert "8 % of thread" in note, note


def test_advice_for_a_false_sharing_line_inside_a_mostly_true_object(tmp_path):
    """`S` (128 bytes): a counter every thread updates (true sharing, most of the volume) and,
    on its next line, two threads' own fields (false sharing): 17 % false overall, under the
    advice's 25 % floor, so the fields that padding would fix got no advice."""
    run, p, c = _run(threads=2, cpus=2)
    for src, dst in ((10, 11), (11, 10)):
        c.event(src=src, dst=dst, line=0x603000, src_off=32, src_len=8, dst_off=32, dst_len=8,
                src_ip=0x401100, dst_ip=0x401100, store=True, count=100)  # fmt: skip
    for src, dst, so, do in ((10, 11, 32, 40), (11, 10, 40, 32)):
        c.event(src=src, dst=dst, line=0x603040, src_off=so, src_len=8, dst_off=do, dst_len=8,
                src_ip=0x401200, dst_ip=0x401200, store=True, count=20)  # fmt: skip
    for t in (10, 11):
        c.counters(t, samples=100, signals=100)
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: MidLineSym("S", 128)))
    s = next(o for o in res["objects"] if o["name"] == "S")
    assert s["false"] < 0.25 * s["all"], s
    (adv,) = [a for a in res["advice"] if "`S`" in a]
    assert "offsets 64-72" in adv and "pad each to 64 bytes" in adv, adv


def test_exact_advice_needs_a_share_of_the_run(tmp_path):
    """Counted transfers: 3 false ones on `stats` beside 100,000 true ones on `counter` got
    an advice line (xz: two lines for 3 and 6 false transfers of 868 k)."""
    run, _p, c = _run(backend="exact")
    c.event(src=10, dst=11, line=COUNTER, src_off=0, dst_off=0, store=True, count=1,
            volume=100_000.0)  # fmt: skip
    c.event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, store=True, count=1, volume=3.0)
    res = _res(tmp_path, run, name="exact")
    assert not [a for a in res["advice"] if "stats" in a], res["advice"]
    run, _p, c = _run(backend="exact")
    c.event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, store=True, count=1, volume=300.0)
    c.event(src=11, dst=10, line=STATS, src_off=8, dst_off=0, store=True, count=1, volume=300.0)
    res = _res(tmp_path, run, name="exact2")
    assert [a for a in res["advice"] if "stats" in a], res["advice"]


def test_sites_in_a_library_list_the_programs_calls(tmp_path):
    """Events whose instructions have callers (an access in the C library): each such site
    lists the program's calls, busiest first, with their shares of its volume (the caller
    named by its call instruction, the address before the return address); sites without
    callers have an empty list; the lines' code column shows `site ← caller`."""
    run, _p, c = _run()
    c.event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, src_ip=0x401010,
            dst_ip=0x401020, dst_caller=0x401101, count=3)  # fmt: skip
    c.event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, src_ip=0x401010,
            dst_ip=0x401020, dst_caller=0x401201, count=1)  # fmt: skip
    res = _res(tmp_path, run)
    sites = {s["line"]: s for s in res["sites"]}
    assert sites[16]["callers"] == []  # the writer: no caller recorded
    callers = sites[32]["callers"]
    assert [(k["line"], k["address"]) for k in callers] == [
        (0x100, "0x401101"),
        (0x200, "0x401201"),
    ]
    assert [k["share"] for k in callers] == pytest.approx([0.75, 0.25])
    (ln,) = res["lines"]
    assert "worker fs.c:32 ← worker fs.c:256" in ln["sites"], ln["sites"]
    sites_table = next(t for t in comm_tables({"lenses": {"comm": res}}) if t.name == "comm_sites")
    where = [r["where"] for r in sites_table.rows]
    assert "worker fs.c:32\n← worker fs.c:256 (75 %)\n← worker fs.c:512 (25 %)" in where, where


def test_a_version_1_run_reads_its_64_byte_events(tmp_path):
    """Runs recorded before format version 2 hold 64-byte events without callers: read as
    they are (their sites have no callers), not refused as damaged."""
    from locus.rundir import COMM_EVENT_V1_DTYPE, PROC_DTYPE

    run, _p, c = _run()
    c.event(src=10, dst=11, line=STATS, src_off=0, dst_off=8, src_ip=0x401010,
            dst_ip=0x401020, dst_caller=0x401101, count=2)  # fmt: skip
    path = run.write(str(tmp_path / "v1"))
    pdir = os.path.join(path, "procs", "10")
    new = np.fromfile(os.path.join(pdir, "comm.events.bin"), dtype=COMM_EVENT_DTYPE)
    old = np.zeros(len(new), dtype=COMM_EVENT_V1_DTYPE)
    for f in COMM_EVENT_V1_DTYPE.names:
        old[f] = new[f]
    old.tofile(os.path.join(pdir, "comm.events.bin"))
    h = np.fromfile(os.path.join(pdir, "proc.bin"), dtype=PROC_DTYPE)
    h["format_version"] = 1
    h.tofile(os.path.join(pdir, "proc.bin"))
    res = analyze(RunDir.open(path), FAKE)
    assert res["totals"]["detections"] == 2
    assert all(s["callers"] == [] for s in res["sites"])


@pytest.mark.parametrize("mapped", [False, True])
def test_padding_advice_asks_for_aligned_alloc_only_for_malloced_blocks(tmp_path, mapped):
    """Adjacent per-thread counters falsely shared in a heap object: alignas in the type is
    not enough in a malloc'd block (aligned to 16), so the advice adds aligned_alloc; a
    block from mmap (an allocator's arena, Python's obmalloc) is page-aligned already."""
    heap = 0x7000_0000
    run, _p, c = _run(threads=2, cpus=2)
    c.malloc(heap, 4096, site=0x401234, t=0.1, mmap=mapped)
    for _ in range(20):
        c.event(src=10, dst=11, line=heap, src_off=0, dst_off=8, store=True, t=0.5)
        c.event(src=11, dst=10, line=heap, src_off=8, dst_off=0, store=True, t=0.5)
    (advice,) = _res(tmp_path, run)["advice"]
    assert "pad each to 64 bytes (alignas(64)" in advice, advice
    assert ("aligned_alloc(64" in advice) is not mapped, advice


class JitSym(FakeSym):
    """Instructions at JIT and above are in no module (a JIT's code): no name, no
    module+offset; the others are worker()'s."""

    JIT = 0x7F0000000000

    def code(self, addrs, return_addresses=True):
        return {
            a: CodeLoc("", "", 0) if a >= self.JIT else CodeLoc("worker", "/src/fs.c", a & 0xFFF)
            for a in addrs
        }

    def module_offset(self, addr):
        return None if addr >= self.JIT else f"fs+{addr & 0xFFF:#x}"


def test_code_a_jit_compiled_is_named_how_to_name_it(tmp_path):
    """Most of the volume at code outside every module, with no perf map: a note says it is
    a JIT's and how to have it named (the runtimes' options). Code in a module: no note."""
    notes = []
    for jit in (True, False):
        run, _p, c = _run(threads=3)
        ip = JitSym.JIT + 0x40 if jit else 0x401040
        c.event(11, 12, STATS, src_off=0, dst_off=8, src_ip=ip, dst_ip=ip + 8, count=20)
        res = _res(tmp_path, run, Options(symbolizer=lambda proc: JitSym()), f"j{jit}")
        assert res["sites"][0]["function"] == (f"{ip:#x}" if jit else "worker"), res["sites"]
        notes.append([n for n in res["notes"] if "outside every loaded object" in n])
    assert notes[0] and "100 % of the code sites' volume" in notes[0][0], notes
    assert "(pid 10)" in notes[0][0] and "--perf-basic-prof" in notes[0][0], notes
    assert "-XX:+DumpPerfMapAtExit" in notes[0][0], notes
    assert notes[1] == []


class JvmHeapSym(FakeSym):
    """A JVM's heap: committed by libjvm's os::pd_commit_memory_or_exit; the accesses in
    JIT code a perf map names."""

    def code(self, addrs, return_addresses=True):
        commit = "os::pd_commit_memory_or_exit(char*, unsigned long, unsigned long, bool)"
        return {
            a: CodeLoc(commit, "", 0) if a == 0x401700 else CodeLoc("void FS.run(int)", "", 0)
            for a in addrs
        }


def test_java_heap_named_as_such_and_advised_in_java(tmp_path):
    """Every Java object lives in the heap HotSpot maps at start: the object read 'heap
    block from os::pd_commit_memory_or_exit(...)' at offsets of hundreds of megabytes, and
    its advice asked for C's alignas; now the heap is named so, the advice gives addresses
    and Java's means (@Contended, padding fields)."""
    run, p, c = _run(threads=3)
    heap = 0x6_0000_0000
    c.malloc(heap, 1 << 30, site=0x401700, t=0.1, mmap=True)
    off = 394366656
    for k in range(12):
        a, b = (11, 12) if k % 2 else (12, 11)
        c.event(src=a, dst=b, line=heap + off, src_off=0 if a == 11 else 8,
                dst_off=0 if b == 11 else 8, store=True, dst_ip=0x7F0000001123)  # fmt: skip
    res = _res(tmp_path, run, Options(symbolizer=lambda proc: JvmHeapSym()))
    (o,) = res["objects"]
    assert o["name"].startswith("Java heap (mapped by os::pd_commit_memory_or_exit"), o["name"]
    (adv,) = res["advice"]
    assert f"at {heap + off:#x}-{heap + off + 8:#x} (a Java object" in adv, adv
    assert "@jdk.internal.vm.annotation.Contended" in adv and "alignas" not in adv, adv


def test_advice_on_false_sharing_scattered_over_a_large_object(tmp_path):
    """False sharing on a few lines megabytes apart in one large block (the locks of a
    database's shared memory: PostgreSQL's 140 MB segment under pgbench): the advice said
    "adjacent 4-byte fields ... at offsets 17156-142944660". It names the busiest line, and
    how many there are and how far apart."""
    run, _p, c = _run()
    big = 0x7000_0000
    c.malloc(big, 64 << 20, site=0x401234, t=0.0)
    for k, (line_off, n) in enumerate(((0x4000, 6), (0x1000_0000 // 8, 3), (0x300_0000, 3))):
        c.event(src=10, dst=11, line=big + line_off, src_off=0, src_len=4, dst_off=4,
                dst_len=4, src_ip=0x401010 + k, dst_ip=0x401020 + k, count=n, t=0.5,
                store=True)  # fmt: skip
    res = _res(tmp_path, run)
    (o,) = [o for o in res["objects"] if o["kind"] == "heap"]
    assert o["lines"] == 3
    (adv,) = res["advice"]
    assert "at offsets 16384-16388, the 64-byte line with 50 % of its false sharing" in adv
    assert "(the busiest of 3 such lines, spread over 48.0 MiB of it" in adv, adv
    # One thread only reading beside the other's writes: the same, in that advice's words.
    run, _p, c = _run()
    c.malloc(big, 64 << 20, site=0x401234, t=0.0)
    for k, (line_off, n) in enumerate(((0x4000, 6), (0x1000_0000 // 8, 3), (0x300_0000, 3))):
        c.event(src=10, dst=11, line=big + line_off, src_off=0, src_len=4, dst_off=4,
                dst_len=4, src_ip=0x401010 + k, dst_ip=0x401020 + k, count=n, t=0.5)  # fmt: skip
    (adv,) = _res(tmp_path, run, name="reads")["advice"]
    assert "offsets 16384-" not in adv and "50331648" not in adv, adv
