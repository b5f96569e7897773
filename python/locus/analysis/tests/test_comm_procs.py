"""The comm lens between processes: step 1 of the method made at report time on the samples
of memory that processes of the run map shared (analysis/comm.py, between_processes)."""

import numpy as np
import pytest

from locus.analysis.comm import Options, analyze
from locus.rundir import RunDir
from locus.symbolize import CodeLoc
from locus.synth_comm import SynthCommRun

SHM = 0x7F0000000000  # where the parent and the first child map the shared page
ELSEWHERE = 0x7F5500000000  # where the second child maps it (its own mmap, not fork's)


class FakeSym:
    def data(self, addrs):
        return {a: None for a in addrs}

    def code(self, addrs, return_addresses=True):
        return {a: CodeLoc("worker", "/src/w.c", a & 0xFFF) for a in addrs}

    def data_size(self, name):
        return None


FAKE = Options(symbolizer=lambda proc: FakeSym())


def shared(lo, key="555", off=0, perms="rw-s", path="/dev/zero (deleted)"):
    return f"{lo:x}-{lo + 0x2000:x} {perms} {off:08x} 00:01 {key} {path}\n"


def _run(child_maps=None, backend="soft", between=None):
    """A parent (pid 100, thread 100) and two single-threaded children (101, 102), all
    mapping the shared page at SHM unless child_maps says otherwise."""
    child_maps = child_maps or (shared(SHM), shared(SHM))
    run = SynthCommRun(backend=backend, between=between)
    procs = [run.proc(pid=100)]
    procs[0].thread(100, 0.0, 1.0)
    procs[0].maps = shared(SHM)
    for pid, maps in zip((101, 102), child_maps):
        p = run.proc(pid=pid, ppid=100)
        p.thread(pid, 0.0, 1.0)
        p.maps = maps
        procs.append(p)
    cs = [run.comm(p) for p in procs]
    for p, c in zip(procs, cs):
        c.counters(p.pid, samples=100)
    return run, cs


def _res(tmp_path, run):
    return analyze(RunDir.open(run.write(str(tmp_path / "run"))), FAKE)


def _cell(res, a, b, kind="all"):
    tids = [t["tid"] for t in res["threads"]]
    return res["matrices"]["thread"][kind][tids.index(a)][tids.index(b)]


def test_a_store_sampled_in_another_process_is_a_communication(tmp_path):
    run, (_p, c1, c2) = _run()
    c1.sample(101, SHM + 8, ip=0x401010, t=0.100, store=True)
    c2.sample(102, SHM, ip=0x401020, t=0.099)  # its previous sample: before the store
    c2.sample(102, SHM + 16, ip=0x401020, t=0.101)  # another word of the line: false
    c2.sample(102, SHM + 64 + 8, ip=0x401030, t=0.102, store=True)  # the next line
    c1.sample(101, SHM + 64 + 8, ip=0x401040, t=0.103)  # the same word: true
    res = _res(tmp_path, run)
    t = res["totals"]
    assert t["detections_between_processes"] == 2 and t["detections"] == 2
    ms = 1e-3  # one sample detection stands for one period (1 ms)
    assert t["false"] == pytest.approx(ms) and t["true"] == pytest.approx(ms)
    assert _cell(res, 101, 102, "false") == pytest.approx(ms)
    assert _cell(res, 102, 101, "true") == pytest.approx(ms)
    m = np.array(res["matrices"]["thread"]["all"])
    assert (m == m.T).all() and (np.diag(m) == 0).all()
    # The two lines are each one line of the table, at the parent's address (the first
    # process that maps the memory), with each process's bytes and code sites.
    lines = {r["address"]: r for r in res["lines"]}
    assert set(lines) == {f"{SHM:#x}", f"{SHM + 64:#x}"}
    assert lines[f"{SHM:#x}"]["pid"] == 100 and lines[f"{SHM:#x}"]["verdict"] == "false"
    spans = {u["thread"]: u["bytes"] for u in lines[f"{SHM:#x}"]["threads"]}
    assert sorted(spans.values()) == [[[8, 15]], [[16, 23]]]  # (inclusive)
    assert {s["line"] for s in res["sites"]} == {0x10, 0x20, 0x30, 0x40}
    note = [n for n in res["notes"] if "memory that processes of this run share" in n]
    assert note and "2 detection(s), 100 % of the volume" in note[0], res["notes"]


def test_the_same_memory_at_other_addresses_is_matched_by_its_offset(tmp_path):
    """The second child maps the memory itself, elsewhere and from a page into it (as MPI
    ranks map a shared segment): its accesses are matched by inode and offset."""
    run, (_p, c1, c2) = _run((shared(SHM), shared(ELSEWHERE, off=0x1000)))
    c1.sample(101, SHM + 0x1000 + 8, t=0.100, store=True)  # page 1 of the file, word 1
    c2.sample(102, ELSEWHERE + 8, t=0.101)  # the same word: true
    c2.sample(102, ELSEWHERE + 0x1000 + 8, t=0.102)  # page 2 of the file: nothing stored
    res = _res(tmp_path, run)
    assert res["totals"]["detections_between_processes"] == 1
    assert res["totals"]["true"] == pytest.approx(1e-3)
    assert [r["address"] for r in res["lines"]] == [f"{SHM + 0x1000:#x}"]


def test_t_prev_private_memory_and_other_inodes_are_no_communication(tmp_path):
    run, (_p, c1, c2) = _run((shared(SHM), shared(SHM + 0x10000, perms="rw-p", key="0")))
    # Thread 102's previous sample is after the store: that publication was seen before.
    c1.sample(101, SHM, t=0.100, store=True)
    c2.sample(102, SHM + 0x10000, t=0.1005)
    c2.sample(102, SHM + 0x10000, t=0.101)
    # Private memory at an address another process shares: not the same memory.
    run2, (_q, d1, d2) = _run((shared(SHM), shared(SHM, perms="rw-p", key="0")))
    d1.sample(101, SHM, t=0.100, store=True)
    d2.sample(102, SHM, t=0.101)
    # Two shared mappings of different files at one address: not the same memory.
    run3, (_r, e1, e2) = _run((shared(SHM), shared(SHM, key="556")))
    e1.sample(101, SHM, t=0.100, store=True)
    e2.sample(102, SHM, t=0.101)
    for i, r in enumerate((run, run2, run3)):
        res = analyze(RunDir.open(r.write(str(tmp_path / f"r{i}"))), FAKE)
        assert res["totals"]["detections"] == 0, (i, res["totals"])


def test_within_a_process_the_runtime_detects_not_the_report(tmp_path):
    """Two threads of one process on a shared mapping: the runtime's board sees their
    samples, so the report adds nothing between them (it would count them twice), and a
    store by a thread of the same process hides an older one of another process, as on a
    board: thread 103 takes part in nothing."""
    run, (_p, c1, c2) = _run()
    run.procs[1].thread(103, 0.0, 1.0, parent=101)
    c1.counters(103, samples=100)
    c1.sample(101, SHM, t=0.100, store=True)
    c1.sample(103, SHM + 8, t=0.101)  # 101's store: the runtime's to find
    c2.sample(102, SHM + 8, t=0.102, store=True)  # 101 -> 102
    c1.sample(101, SHM + 16, t=0.103, store=True)  # 102 -> 101; the line's latest store
    c1.sample(103, SHM, t=0.104)  # 101's again, not 102's older one
    res = _res(tmp_path, run)
    assert res["totals"]["detections"] == 2, res["totals"]
    assert _cell(res, 101, 102) > 0 and _cell(res, 102, 101) > 0
    tids = [t["tid"] for t in res["threads"]]
    assert 103 not in tids or not any(res["matrices"]["thread"]["all"][tids.index(103)])


def test_the_exact_backend_says_between_processes_is_not_counted(tmp_path):
    run, (_p, c1, c2) = _run(backend="exact")
    c1.sample(101, SHM, t=0.100, store=True)
    c2.sample(102, SHM + 8, t=0.101)
    res = _res(tmp_path, run)
    assert res["totals"]["detections"] == 0
    assert any(
        "exact backend counts the transfers between the threads of one process" in n
        for n in res["notes"]
    ), res["notes"]


def test_a_file_mapped_shared_during_the_run_is_matched_while_it_is_mapped(tmp_path):
    """MPI ranks map their shared-memory segment after they start and unmap it before they
    end: no maps copy lists it, the mmap records do (LOCUS_ALF_SHARED), with its lifetime.
    An access to the same address after the munmap is to other memory."""
    run, (_p, c1, c2) = _run(("", ""))  # neither child's maps lists the memory
    dev, ino = 0x801, 4242  # 08:01, as maps would write it
    c1.mmap_file(SHM, 0x2000, dev, ino, t=0.05)
    c2.mmap_file(ELSEWHERE, 0x1000, dev, ino, off=0x1000, t=0.05)
    c1.munmap(SHM, 0x2000, t=0.2)
    c2.munmap(ELSEWHERE, 0x1000, t=0.2)
    c1.sample(101, SHM + 0x1000, t=0.100, store=True)
    c2.sample(102, ELSEWHERE + 8, t=0.101)  # page 1 of the file: false
    c1.sample(101, SHM + 0x1000, t=0.300, store=True)  # after the munmaps: other memory
    c2.sample(102, ELSEWHERE, t=0.301)
    # A private mapping of the same file is not shared with anyone.
    c2.mmap_file(ELSEWHERE + 0x10000, 0x2000, dev, ino, shared=False, t=0.05)
    c1.sample(101, SHM + 16, t=0.150, store=True)
    c2.sample(102, ELSEWHERE + 0x10000 + 16, t=0.151)
    res = _res(tmp_path, run)
    t = res["totals"]
    assert t["detections_between_processes"] == 1 and t["false"] == pytest.approx(1e-3), t
    assert _cell(res, 101, 102) > 0
    # The line is at the address of the first process that maps the memory (child 101).
    assert [(r["address"], r["pid"]) for r in res["lines"]] == [(f"{SHM + 0x1000:#x}", 101)]


def test_the_runs_own_record_files_are_not_shared_memory(tmp_path):
    """A fork child inherits its parent's mappings of its record files, an image after exec
    (procs/PID.K) too: the same inode in two processes, which is locus's, not the
    program's."""
    own = "/runs/r/procs/100.1/comm.samples.bin"
    run, _cs = _run((shared(SHM, path=own), shared(SHM, path=own)), backend="exact")
    run.procs[0].maps = shared(SHM, path=own)
    res = _res(tmp_path, run)
    assert not any("share memory" in n for n in res["notes"]), res["notes"]


def test_the_process_matrix_sums_the_threads_of_each_process(tmp_path):
    """--by process: a pid's threads are one row (a child with two threads here), the
    volume between two threads of one process is within it (off the map, like a CPU's)."""
    from locus.render.comm import heatmap_lines
    from locus.report import Filters, filter_comm

    run, (_p, c1, c2) = _run()
    run.procs[1].thread(103, 0.0, 1.0, parent=101)
    c1.counters(103, samples=100)
    c1.sample(101, SHM, t=0.100, store=True)
    c2.sample(102, SHM + 8, t=0.101)  # 101 -> 102, between processes
    c1.sample(103, SHM + 16, t=0.102, store=True)
    c2.sample(102, SHM, t=0.103)  # 103 -> 102, between processes
    c1.event(src=101, dst=103, line=SHM + 64, count=3)  # within process 101 (runtime's)
    res = _res(tmp_path, run)
    assert [(p["index"], p["pid"]) for p in res["processes"]] == [(0, 100), (1, 101), (2, 102)]
    m = np.array(res["matrices"]["process"]["all"])
    assert m.shape == (3, 3) and (m == m.T).all() and (np.diag(m) == 0).all()
    assert m[1, 2] == pytest.approx(2e-3) and m[0].sum() == 0
    assert res["totals"]["all"] == pytest.approx(5e-3)  # the 3 within process 101 too
    view = filter_comm(res, Filters(by="process"))
    text = "\n".join(heatmap_lines({"lenses": {"comm": view}}))
    assert "heat map by process" in text and "(pid 101)" in text, text
    assert "not shown: 3.00 ms of 5.00 ms (60 %) was exchanged within one process\n" in text, text


def test_a_sample_the_runtime_detected_is_not_counted_again(tmp_path):
    """Thread 103 samples the line after stores of its own process (101) and of another
    (102, the latest). The runtime's board, which holds 101's store, detected the sample
    (101 -> 103); one board for all would have found 102's. The sample is one detection,
    the runtime's, not two."""
    run, (_p, c1, c2) = _run()
    run.procs[1].thread(103, 0.0, 1.0, parent=101)
    c1.counters(103, samples=100)
    c1.sample(103, SHM + 16, t=0.099)  # 103's previous sample
    c1.sample(101, SHM, t=0.100, store=True)
    c2.sample(102, SHM + 8, t=0.101, store=True)
    c1.sample(103, SHM + 16, t=0.102)
    c1.event(src=101, dst=103, line=SHM, src_off=0, dst_off=16, t=0.102)  # the runtime's
    res = _res(tmp_path, run)
    t = res["totals"]
    # 101 -> 103 (the runtime's) and 101 -> 102 (102's store found 101's): 102 -> 103 is
    # 103's sample again.
    assert t["detections"] == 2 and t["detections_between_processes"] == 1, t
    assert _cell(res, 101, 103) > 0 and _cell(res, 101, 102) > 0 and _cell(res, 102, 103) == 0


def test_the_runtimes_detections_between_processes(tmp_path):
    """A run recorded with the board between processes: the runtime's events whose source is
    a thread of another process (LOCUS_CE_PROCS, at the destination's address of the line)
    are between the two processes' threads, on the line at the first mapping process's
    address; the report makes no step of its own (the samples below would be one more)."""
    run, (_p, c1, c2) = _run((shared(SHM), shared(ELSEWHERE, off=0x1000)), between="runtime")
    # The second child's address of the file's offset 0x1040 and 0x1000.
    # (the shared memory: inode 555 on device 00:01, as shared() maps it; the line's offset)
    c2.event(101, 102, ELSEWHERE + 64, src_off=8, dst_off=16, t=0.2, procs=(555, 0x1040, 1))
    c2.event(
        101, 102, ELSEWHERE, src_off=0, dst_off=0, t=0.3, trap=True, volume=4.0,
        procs=(555, 0x1000, 1),
    )  # fmt: skip
    c1.sample(101, SHM + 0x1000 + 8, t=0.100, store=True)
    c2.sample(102, ELSEWHERE + 8, t=0.101)
    res = _res(tmp_path, run)
    t = res["totals"]
    assert t["detections_between_processes"] == 2 and t["traps_between_processes"] == 1, t
    assert t["detections"] == 2
    assert _cell(res, 101, 102) == pytest.approx(t["all"]) and t["all"] > 0
    assert _cell(res, 101, 102, "false") == pytest.approx(1e-3)  # one period
    lines = {r["address"]: r for r in res["lines"]}
    assert set(lines) == {f"{SHM + 0x1040:#x}", f"{SHM + 0x1000:#x}"}, lines.keys()
    assert {r["pid"] for r in lines.values()} == {100}
    assert lines[f"{SHM + 0x1040:#x}"]["verdict"] == "false"
    note = [n for n in res["notes"] if "memory that processes of this run share" in n]
    assert note and "board the run's processes share" in note[0], res["notes"]
    assert "2 detection(s) between processes (1 by watchpoint traps)" in note[0], note


def test_loads_only_on_shared_memory_are_explained(tmp_path):
    """Samples on memory processes share that are all loads (an interpreter's rare stores
    never sampled) give no detection: the note says why, and only then."""
    notes = []
    for store in (False, True):
        run, (_p, c1, c2) = _run(between="runtime")
        c1.sample(101, SHM, t=0.100, store=store)
        c2.sample(102, SHM + 8, t=0.101)
        res = _res(tmp_path / f"s{store}", run)
        notes += [[n for n in res["notes"] if "memory that processes of this run share" in n]]
    assert notes[0] and "None of those 2 samples was a store" in notes[0][0], notes
    assert notes[1] and "None of those" not in notes[1][0], notes
