"""Writer of synthetic numa-lens run directories, for tests and benchmarks.

Builds on locus.synth: a SynthNumaRun is a SynthRun with a NUMA topology (meta["numa"] as
the launcher writes it) whose processes carry the numa lens's records: sampled accesses
(comm.samples.bin, with the page's node), first touches (numa.touch.bin), the pinning log
(numa.pins.bin), heap blocks (allocs.bin) and the samplers' counters (comm.threads.bin).
Times are seconds since the run start; ticks are nanoseconds (MONOTONIC clock).

    run = SynthNumaRun(nodes=[[0, 1], [2, 3]])          # two nodes of two CPUs
    p = run.proc(pid=100)
    p.thread(100, 0.0, 1.0)
    n = run.numa(p)
    n.start(100, nodes=[0])                              # pinned to node 0 from its start
    n.mmap(0x7F0000000000, 1 << 20, site=0x401500)
    n.touch(100, 0x7F0000000000, node=0, pages=4)        # four one-page touch records
    n.sample(100, 0x7F0000000010, node=0, count=10)
    run.write("/tmp/run")
"""

from __future__ import annotations

import os

import numpy as np

from locus.analysis.numa import (
    AFFINITY,
    MODE_NAMES,
    MODE_NONE,
    NC_UNPINNED_PAGE,
    NT_EXACT,
    NT_FINAL,
    NT_PLACE,
    NT_RANGE,
    NT_UNPINNED,
    NT_WRITE,
    WHAT_NAMES,
)
from locus.rundir import (
    AC_STACK,
    AC_STORE,
    AL_FREE,
    AL_MALLOC,
    AL_MMAP,
    ALLOC_DTYPE,
    COMM_SAMPLE_DTYPE,
    COMM_THREAD_DTYPE,
    NUMA_COUNT_DTYPE,
    NUMA_PIN_DTYPE,
    NUMA_TOUCH_DTYPE,
)
from locus.synth import START_NS, SynthProc, SynthRun, write_allocs
from locus.synth_comm import BACKENDS

PAGE = 4096
WHAT = {v: k for k, v in WHAT_NAMES.items()}
MODES = {v: k for k, v in MODE_NAMES.items()}


def _ns(t) -> np.ndarray:
    return START_NS + np.round(np.asarray(t, dtype=np.float64) * 1e9).astype(np.int64)


def _mask(nodes) -> int:
    m = 0
    for n in nodes:
        m |= 1 << int(n)
    return m


class SynthNuma:
    """The numa records of one synthetic process."""

    def __init__(self, run: SynthNumaRun, proc: SynthProc):
        self.run = run
        self.proc = proc
        self.samples: list[np.ndarray] = []
        self.touches: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []
        self.pins: list[dict] = []
        self.allocs: list[tuple] = []
        self.threads: dict[int, dict] = {}

    # ---- pinning log ----

    def pin(
        self,
        tid: int,
        nodes=(),
        t: float = 0.0,
        what: str = "sched_setaffinity",
        caller: int | None = None,
        ncpus: int | None = None,
        mode: str | None = None,
        policy_nodes=(),
        addr: int = 0,
        length: int = 0,
        ip: int = 0,
    ):
        """One record of numa.pins.bin; `nodes` are the nodes the thread may run on after
        the call (ncpus defaults to their CPUs), `mode` a MPOL_* name."""
        if ncpus is None:
            ncpus = sum(len(self.run.nodes[n]) for n in nodes if n < len(self.run.nodes))
        self.pins.append(
            {
                "what": WHAT[what],
                "mode": MODE_NONE if mode is None else MODES[mode],
                "tid": tid,
                "caller": tid if caller is None else caller,
                "ncpus": ncpus,
                "t": t,
                "nodes": _mask(nodes),
                "ip": ip,
                "policy_nodes": _mask(policy_nodes),
                "addr": addr,
                "len": length,
            }
        )

    def start(self, tid: int, nodes=None, t: float = 0.0):
        """The START record of a thread: allowed on `nodes` (default: every CPU node)."""
        if nodes is None:
            nodes = [i for i, c in enumerate(self.run.nodes) if c]
        self.pin(tid, nodes, t=t, what="start")

    def end(self, tid: int, nodes, t: float = 1.0):
        self.pin(tid, nodes, t=t, what="end")

    def mempolicy(self, tid: int, mode: str, nodes, t: float = 0.0, ip: int = 0):
        self.pin(tid, (), t=t, what="set_mempolicy", ncpus=0, mode=mode, policy_nodes=nodes, ip=ip)

    def mbind(
        self, addr: int, length: int, mode: str, nodes, t: float = 0.0, tid: int = 0, ip: int = 0
    ):
        self.pin(
            tid,
            (),
            t=t,
            what="mbind",
            ncpus=0,
            mode=mode,
            policy_nodes=nodes,
            addr=addr,
            length=length,
            ip=ip,
        )

    def move_pages(
        self, addr: int, pages: int, node: int, t: float = 0.0, tid: int = 0, ip: int = 0
    ):
        self.pin(
            tid,
            (),
            t=t,
            what="move_pages",
            ncpus=0,
            policy_nodes=[node],
            addr=addr,
            length=pages,
            ip=ip,
        )

    def _allowed(self, tid: int, t: float) -> int:
        """Node mask of thread `tid` at time t, as the runtime would record it."""
        best = None
        for r in self.pins:
            if r["tid"] == tid and r["what"] in AFFINITY and r["t"] <= t and r["nodes"]:
                if best is None or r["t"] >= best["t"]:
                    best = r
        if best is None:
            return _mask(i for i, c in enumerate(self.run.nodes) if c)
        return best["nodes"]

    # ---- first touches ----

    def touch(
        self,
        tid: int,
        addr: int,
        node: int,
        pages: int = 1,
        t: float = 0.1,
        ip: int = 0x401600,
        region: int = 0,
        nodes=None,
        cpu: int = -1,
        write: bool = True,
        as_range: bool = False,
        exact: bool = False,
        place: bool = False,
        caller: int = 0,
    ):
        """First touches of `pages` pages from `addr` (page-aligned) by `tid`, landed on
        `node`: one record per page, or one RANGE record standing for all. `nodes` (the
        toucher's allowed nodes) defaults to its binding in this pinning log. `place`: not a
        first touch but the first write to pages first touched by a read (LOCUS_NT_PLACE)."""
        n = 1 if as_range else pages
        r = np.zeros(n, dtype=NUMA_TOUCH_DTYPE)
        r["t"] = _ns(t)
        r["addr"] = addr + PAGE * np.arange(n, dtype=np.uint64)
        r["ip"] = ip
        r["caller"] = caller
        r["region"] = region or addr
        mask = self._allowed(tid, t) if nodes is None else _mask(nodes)
        r["nodes"] = mask
        r["tid"] = tid
        r["pages"] = pages if as_range else 1
        r["node"] = node
        r["cpu"] = cpu
        flags = NT_WRITE if write else 0
        if bin(mask).count("1") > 1:
            flags |= NT_UNPINNED
        if as_range:
            flags |= NT_RANGE
        if exact:
            flags |= NT_EXACT
        if place:
            flags |= NT_PLACE
        r["flags"] = flags
        r["kind"] = 1
        self.touches.append(r)

    def final(self, region: int, node: int, pages: int, t: float = 0.9, tid: int = 0):
        """A census record (LOCUS_NT_FINAL): `pages` pages of the allocation at `region`
        were on `node` when it was freed or at exit."""
        r = np.zeros(1, dtype=NUMA_TOUCH_DTYPE)
        r["t"], r["addr"], r["region"], r["node"], r["pages"] = _ns(t), region, region, node, pages
        r["tid"], r["cpu"], r["flags"], r["kind"] = tid, -1, NT_FINAL, 1
        self.touches.append(r)

    # ---- sampled accesses ----

    def sample(
        self,
        tid: int,
        addr: int,
        node: int = -1,
        t: float = 0.5,
        ip: int = 0x401700,
        cpu: int = -1,
        store: bool = False,
        stack: bool = False,
        count: int = 1,
        length: int = 8,
        periods: int = 0,
    ):
        """`count` identical samples (node: the page's node at sample time, -1 unknown,
        -2 not present; stack accesses get -3; periods: what each stands for, 0 = 1)."""
        self.add_samples(
            periods=periods,
            tid=np.full(count, tid),
            addr=addr,
            node=-3 if stack else node,
            t=t,
            ip=ip,
            cpu=cpu,
            flags=(AC_STORE if store else 0) | (AC_STACK if stack else 0),
            len=length,
        )

    def add_samples(self, **cols):
        """Bulk samples: each keyword (a field of struct locus_comm_sample; t in seconds)
        is a scalar or an array."""
        n = max((np.size(v) for v in cols.values()), default=1)
        a = np.zeros(n, dtype=COMM_SAMPLE_DTYPE)
        a["node"] = -1
        a["cpu"] = -1
        a["len"] = 8
        a["kind"] = 1
        for k, v in cols.items():
            a[k] = _ns(v) if k == "t" else v
        self.samples.append(a)

    def count(
        self,
        tid: int,
        page: int,
        count: int,
        node: int = -1,
        nodes=None,
        t: float = 0.5,
        ip: int = 0x401700,
        store: bool = False,
        stack: bool = False,
        unpinned_page: bool = False,
    ):
        """One record of numa.counts.bin (exact backend): `count` accesses of `tid` at `ip`
        to `page`, on `node` (-3 for a stack access), the thread allowed on `nodes` (default:
        its binding in this pinning log)."""
        r = np.zeros(1, dtype=NUMA_COUNT_DTYPE)
        r["t"] = _ns(t)
        r["addr"] = page & ~(PAGE - 1)
        r["ip"] = ip
        r["nodes"] = self._allowed(tid, t) if nodes is None else _mask(nodes)
        r["count"] = count
        r["tid"] = tid
        r["node"] = -3 if stack else node
        r["flags"] = (
            (AC_STORE if store else 0)
            | (AC_STACK if stack else 0)
            | (NC_UNPINNED_PAGE if unpinned_page else 0)
        )
        r["kind"] = 1
        self.counts.append(r)

    # ---- allocations, counters ----

    def malloc(self, addr, size, site=0x401234, t=0.0, tid=0, stack=0):
        self.allocs.append((t, addr, size, site, tid, stack, AL_MALLOC))

    def mmap(self, addr, size, site=0x401234, t=0.0, tid=0, stack=0):
        self.allocs.append((t, addr, size, site, tid, stack, AL_MMAP))

    def free(self, addr, t):
        self.allocs.append((t, addr, 0, 0, 0, 0, AL_FREE))

    def counters(self, tid: int, **kw):
        """Per-thread counters of comm.threads.bin (fields of struct locus_comm_thread)."""
        self.threads.setdefault(tid, {}).update(kw)

    # ---- writing ----

    def write(self, pdir: str):
        def cat(parts, dtype):
            return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

        cat(self.samples, COMM_SAMPLE_DTYPE).tofile(os.path.join(pdir, "comm.samples.bin"))
        cat(self.touches, NUMA_TOUCH_DTYPE).tofile(os.path.join(pdir, "numa.touch.bin"))
        if self.counts:
            cat(self.counts, NUMA_COUNT_DTYPE).tofile(os.path.join(pdir, "numa.counts.bin"))
        p = np.zeros(len(self.pins), dtype=NUMA_PIN_DTYPE)
        for i, r in enumerate(self.pins):
            for k, v in r.items():
                p[i][k] = _ns(v) if k == "t" else v
        p["kind"] = 1
        p.tofile(os.path.join(pdir, "numa.pins.bin"))
        a = np.zeros(len(self.allocs), dtype=ALLOC_DTYPE)
        for i, (t, addr, size, site, tid, stack, kind) in enumerate(self.allocs):
            a[i]["t"], a[i]["addr"], a[i]["size"], a[i]["site"] = _ns(t), addr, size, site
            a[i]["tid"], a[i]["stack"], a[i]["kind"] = tid, stack, kind
        write_allocs(pdir, a)
        th = np.zeros(len(self.threads), dtype=COMM_THREAD_DTYPE)
        for i, (tid, kw) in enumerate(sorted(self.threads.items())):
            th[i]["tid"], th[i]["kind"] = tid, 1
            th[i]["backend"] = BACKENDS.get(self.run.backend, 0)
            th[i]["period_ns"] = self.run.period_ns
            for k, v in kw.items():
                th[i][k] = v
        th.tofile(os.path.join(pdir, "comm.threads.bin"))


class SynthNumaRun(SynthRun):
    """A synthetic run with the numa lens. `nodes`: the CPUs of each node (an empty list
    is a memory-only node); `distances`: the node distance matrix (default 10 on the
    diagonal, 20 elsewhere)."""

    def __init__(
        self,
        nodes=((0, 1), (2, 3)),
        backend: str = "soft",
        period_ns: int = 1_000_000,
        period_n: int = 0,
        emulated: bool = False,
        distances=None,
        meta_numa: bool = True,
        **kw,
    ):
        self.nodes = [list(c) for c in nodes]
        ncpu = max([c + 1 for cs in self.nodes for c in cs] + [1])
        kw.setdefault("lenses", ["numa"])
        kw.setdefault("cpus", ncpu)
        super().__init__(**kw)
        self.backend = backend
        self.period_ns = period_ns if backend != "exact" else 0
        self.period_n = period_n
        self._numa: dict[int, SynthNuma] = {}
        cpu_node = [0] * ncpu
        for i, cs in enumerate(self.nodes):
            for c in cs:
                cpu_node[c] = i
        n = len(self.nodes)
        if distances is None:
            distances = [[10 if i == j else 20 for j in range(n)] for i in range(n)]
        self.meta_extra["host"] = dict(self.meta_host(), numa_nodes=1 if emulated else n)
        if meta_numa:
            self.meta_extra["numa"] = {
                "backend": backend,
                "period_ns": self.period_ns,
                "period_n": period_n,
                "emulated": emulated,
                "fake": n if emulated else None,
                "page_size": PAGE,
                "nodes": [
                    {
                        "id": i,
                        "cpus": cs,
                        "mem_kb": 1 << 20,
                        "distances": distances[i],
                        "memory_only": not cs,
                    }
                    for i, cs in enumerate(self.nodes)
                ],
                "cpu_node": cpu_node,
            }
            self.meta_extra["backends"] = {"numa": backend}

    def numa(self, proc: SynthProc) -> SynthNuma:
        if id(proc) not in self._numa:
            self._numa[id(proc)] = SynthNuma(self, proc)
        return self._numa[id(proc)]

    def write(self, path: str) -> str:
        super().write(path)
        for p in self.procs:
            self.numa(p).write(os.path.join(path, "procs", p.key))
        return path


# Addresses of first_touch_run: an mmap'd array and the code sites the tests' fake
# symbolizer names (line = ip & 0xfff).
ARRAY = 0x7F00_0000_0000
ALLOC_SITE = 0x401010  # main() line 16: the allocation
INIT_SITE = 0x401020  # line 32: the initialisation loop
COMPUTE_SITE = 0x401030  # line 48: the compute loop


def first_touch_run(
    path: str, parallel_init: bool, threads: int = 4, pages: int = 64, per_page: int = 4
) -> str:
    """NUMAPROF's textbook case on two nodes: `threads` threads pinned compactly (half on
    each node) each compute on their own contiguous quarter of an mmap'd array. With
    `parallel_init` each initialises its own part (all accesses local); without, the main
    thread (thread 0, node 0) initialises all of it and the threads of node 1 access
    remote pages."""
    run = SynthNumaRun(nodes=[[0, 1], [2, 3]])
    p = run.proc(pid=300)
    tids = [300 + i for i in range(threads)]
    n = run.numa(p)
    half = max(threads // 2, 1)
    for i, tid in enumerate(tids):
        p.thread(tid, 0.0, 1.0, parent=0 if i == 0 else 300)
        n.start(tid, nodes=[0 if i < half else 1], t=0.0)
        n.counters(tid, samples=per_page * pages // threads, signals=per_page * pages // threads)
    n.mmap(ARRAY, pages * PAGE, site=ALLOC_SITE, t=0.01, tid=tids[0])
    chunk = pages // threads
    for i, tid in enumerate(tids):
        node = 0 if i < half else 1
        base = ARRAY + i * chunk * PAGE
        if parallel_init:
            n.touch(tid, base, node=node, pages=chunk, t=0.1, ip=INIT_SITE, region=ARRAY)
        else:
            n.touch(tids[0], base, node=0, pages=chunk, t=0.1, ip=INIT_SITE, region=ARRAY)
        page_node = node if parallel_init else 0
        addrs = base + PAGE * np.repeat(np.arange(chunk, dtype=np.uint64), per_page) + 64
        n.add_samples(tid=tid, addr=addrs, node=page_node, t=0.5, ip=COMPUTE_SITE, cpu=2 * node)
    return run.write(path)


def many_samples(path: str, n: int = 1_000_000, threads: int = 8, seed: int = 0) -> str:
    """A run with `n` sampled accesses over two nodes, for the analysis-speed benchmark:
    half the threads pinned per node, one array first-touched page by page by random
    threads, 10 % stack accesses, a re-pin and an mbind in the log."""
    rng = np.random.default_rng(seed)
    run = SynthNumaRun(nodes=[[0, 1, 2, 3], [4, 5, 6, 7]])
    p = run.proc(pid=900)
    tids = 900 + np.arange(threads)
    nm = run.numa(p)
    pages = 4096
    for i, tid in enumerate(tids.tolist()):
        p.thread(tid, 0.0, 1.0, parent=0 if i == 0 else 900)
        nm.start(tid, nodes=[i % 2], t=0.0)
        nm.counters(tid, samples=n // threads, self_ns=1_000_000)
    nm.pin(int(tids[1]), nodes=[0, 1], t=0.5)
    nm.mmap(ARRAY, pages * PAGE, site=ALLOC_SITE, t=0.001, tid=900)
    nm.mbind(ARRAY, 64 * PAGE, "bind", [1], t=0.002, tid=900)
    r = np.zeros(pages, dtype=NUMA_TOUCH_DTYPE)
    toucher = rng.integers(0, threads, pages)
    r["t"] = _ns(0.01 + 1e-5 * np.arange(pages))
    r["addr"] = ARRAY + PAGE * np.arange(pages, dtype=np.uint64)
    r["ip"] = INIT_SITE
    r["region"] = ARRAY
    r["nodes"] = 1 << (toucher % 2)
    r["tid"] = tids[toucher]
    r["pages"] = 1
    r["node"] = toucher % 2
    r["kind"] = 1
    nm.touches.append(r)
    k = rng.integers(0, threads, n)
    pg = rng.integers(0, pages, n)
    stack = rng.random(n) < 0.1
    nm.add_samples(
        tid=tids[k],
        addr=ARRAY + PAGE * pg.astype(np.uint64) + 8 * rng.integers(0, 512, n).astype(np.uint64),
        node=np.where(stack, -3, toucher[pg] % 2),
        t=np.sort(rng.random(n)),
        ip=COMPUTE_SITE + 4 * rng.integers(0, 16, n),
        cpu=rng.integers(0, 8, n),
        flags=np.where(stack, AC_STACK, 0),
    )
    return run.write(path)
