"""Writer of synthetic comm-lens run directories, for tests and benchmarks.

Builds on locus.synth: a SynthCommRun is a SynthRun whose processes can also carry comm
records (events, per-thread counters, samples, allocations). Times are seconds since the
run start; the processes use the MONOTONIC clock, so ticks are nanoseconds.

    run = SynthCommRun(backend="soft", period_ns=1_000_000)
    p = run.proc(pid=100)
    p.thread(100, 0.0, 1.0)
    p.thread(101, 0.0, 1.0, parent=100)
    c = run.comm(p)
    c.event(src=100, dst=101, line=0x601000, src_off=0, dst_off=8)   # false sharing
    c.counters(100, samples=1000)
    run.write("/tmp/run")
"""

from __future__ import annotations

import os

import numpy as np

from locus.rundir import (
    AC_STORE,
    AL_FREE,
    AL_MALLOC,
    AL_MMAP,
    AL_MUNMAP,
    AL_STACK,
    ALF_FILE,
    ALF_SHARED,
    ALLOC_DTYPE,
    BK_EXACT,
    BK_HW,
    BK_SOFT,
    CE_EXACT,
    CE_GUESSED,
    CE_LOADED,
    CE_PROCS,
    CE_TRAP,
    CE_TRUE,
    COMM_EVENT_DTYPE,
    COMM_SAMPLE_DTYPE,
    COMM_THREAD_DTYPE,
    STACK_DTYPE,
)
from locus.synth import START_NS, SynthProc, SynthRun, write_allocs

BACKENDS = {"hw": BK_HW, "soft": BK_SOFT, "exact": BK_EXACT}


def _ns(t: float) -> int:
    return START_NS + int(round(t * 1e9))


class SynthComm:
    """The comm records of one synthetic process."""

    def __init__(self, run: SynthCommRun, proc: SynthProc):
        self.run = run
        self.proc = proc
        self.events: list[tuple] = []
        self.threads: dict[int, dict] = {}
        self.samples: list[tuple] = []
        self.allocs: list[tuple] = []
        self.stacks: dict[int, list[int]] = {}

    def event(
        self,
        src: int,
        dst: int,
        line: int,
        src_off: int = 0,
        src_len: int = 8,
        dst_off: int = 0,
        dst_len: int = 8,
        volume: float = 1.0,
        t: float = 0.5,
        src_cpu: int = -1,
        dst_cpu: int = -1,
        src_ip: int = 0,
        dst_ip: int = 0,
        src_caller: int = 0,
        dst_caller: int = 0,
        true: bool | None = None,
        trap: bool = False,
        loaded: bool = False,
        store: bool = False,
        count: int = 1,
        procs: tuple[int, int, int] | None = None,
        guessed: bool = False,
    ):
        """`count` identical detections; `true` defaults to whether the byte ranges
        overlap; the exact backend's events carry LOCUS_CE_EXACT; `loaded`: a trap on a store
        to a line the dst thread was sampled loading (LOCUS_CE_LOADED)."""
        if true is None:
            true = src_off < dst_off + dst_len and dst_off < src_off + src_len
        flags = (CE_TRUE if true else 0) | (CE_TRAP if trap or loaded else 0)
        flags |= CE_LOADED if loaded else 0
        # guessed: a trap whose access was not decoded (LOCUS_CE_GUESSED).
        flags |= CE_GUESSED if guessed else 0
        # procs: (inode, the line's offset in it, device) of the shared memory: src is a
        # thread of another process (LOCUS_CE_PROCS, the key in reserved[0..2]).
        flags |= CE_PROCS if procs else 0
        if self.run.backend == "exact":
            flags |= CE_EXACT
        row = (
            _ns(t),
            line,
            src_ip,
            dst_ip,
            volume,
            src,
            dst,
            src_cpu,
            dst_cpu,
            src_off,
            src_len,
            dst_off,
            dst_len,
            flags,
            AC_STORE if store else 0,
            src_caller,
            dst_caller,
            (*procs, 0, 0, 0) if procs else (0,) * 6,
        )
        self.events.extend([row] * count)

    def counters(self, tid: int, **kw):
        """Per-thread counters of comm.threads.bin (fields of struct locus_comm_thread)."""
        self.threads.setdefault(tid, {}).update(kw)

    def sample(
        self, tid: int, addr: int, ip: int = 0, t: float = 0.5, cpu: int = -1, length=8, store=False
    ):
        self.samples.append((_ns(t), addr, ip, tid, cpu, length, AC_STORE if store else 0))

    def malloc(self, addr, size, site=0x401234, t=0.0, tid=0, stack=0, mmap=False):
        self.allocs.append((_ns(t), addr, size, site, tid, stack, AL_MMAP if mmap else AL_MALLOC))

    def free(self, addr, t):
        self.allocs.append((_ns(t), addr, 0, 0, 0, 0, AL_FREE))

    def mmap_file(self, addr, size, dev, ino, off=0, shared=True, t=0.0, site=0x401234):
        """An mmap of a file (LOCUS_ALF_FILE; LOCUS_ALF_SHARED when shared): st_dev `dev`,
        inode `ino`, file offset `off` at addr."""
        flags = ALF_FILE | (ALF_SHARED if shared else 0)
        self.allocs.append((_ns(t), addr, size, site, 0, 0, AL_MMAP, flags, (off, ino), dev))

    def munmap(self, addr, size, t):
        self.allocs.append((_ns(t), addr, size, 0, 0, 0, AL_MUNMAP))

    def call_stack(self, sid: int, pcs: list[int]):
        """Call stack `sid` of stacks.bin (--call-stack): return addresses, innermost first
        (the first is the allocating call's)."""
        self.stacks[sid] = list(pcs)

    def stack(self, tid, addr, size, t=0.0):
        """The stack of thread `tid`: [addr, addr + size)."""
        self.allocs.append((_ns(t), addr, size, 0, tid, 0, AL_STACK))

    def write(self, pdir: str):
        if self.stacks:
            st = np.zeros(len(self.stacks), dtype=STACK_DTYPE)
            for i, (sid, pcs) in enumerate(sorted(self.stacks.items())):
                st[i]["id"], st[i]["depth"] = sid, len(pcs)
                st[i]["pc"][: len(pcs)] = pcs
            st.tofile(os.path.join(pdir, "stacks.bin"))
        ev = np.zeros(len(self.events), dtype=COMM_EVENT_DTYPE)
        names = (
            "t line src_ip dst_ip volume src_tid dst_tid src_cpu dst_cpu src_off src_len "
            "dst_off dst_len flags dst_flags src_caller dst_caller reserved"
        ).split()
        for i, row in enumerate(self.events):
            for k, v in zip(names, row):
                ev[i][k] = v
        ev["kind"] = 1
        ev.tofile(os.path.join(pdir, "comm.events.bin"))
        th = np.zeros(len(self.threads), dtype=COMM_THREAD_DTYPE)
        backend = BACKENDS.get(self.run.backend, 0)
        for i, (tid, kw) in enumerate(sorted(self.threads.items())):
            th[i]["tid"], th[i]["kind"] = tid, 1
            th[i]["backend"] = backend
            th[i]["period_ns"] = self.run.period_ns
            th[i]["watchpoints"] = self.run.watchpoints
            for k, v in kw.items():
                th[i][k] = v
        th.tofile(os.path.join(pdir, "comm.threads.bin"))
        s = np.zeros(len(self.samples), dtype=COMM_SAMPLE_DTYPE)
        for i, (t, addr, ip, tid, cpu, length, flags) in enumerate(self.samples):
            s[i]["t"], s[i]["addr"], s[i]["ip"], s[i]["tid"] = t, addr, ip, tid
            s[i]["cpu"], s[i]["len"], s[i]["flags"], s[i]["kind"] = cpu, length, flags, 1
        s.tofile(os.path.join(pdir, "comm.samples.bin"))
        a = np.zeros(len(self.allocs), dtype=ALLOC_DTYPE)
        for i, (t, addr, size, site, tid, stack, kind, *file) in enumerate(self.allocs):
            a[i]["t"], a[i]["addr"], a[i]["size"], a[i]["site"] = t, addr, size, site
            a[i]["tid"], a[i]["stack"], a[i]["kind"] = tid, stack, kind
            if file:
                a[i]["flags"], a[i]["reserved"], a[i]["dev"] = file
        write_allocs(pdir, a)


class SynthCommRun(SynthRun):
    """A synthetic run with the comm lens (and meta["comm"] as the launcher writes it)."""

    def __init__(
        self,
        backend: str = "soft",
        period_ns: int = 1_000_000,
        period_n: int = 0,
        watchpoints: int = 4,
        line_size: int = 64,
        meta_comm: bool = True,
        between: str | None = None,
        **kw,
    ):
        kw.setdefault("lenses", ["comm"])
        super().__init__(**kw)
        self.backend = backend
        self.period_ns = period_ns if backend != "exact" else 0
        self.period_n = period_n
        self.watchpoints = watchpoints
        self.line_size = line_size
        self._comm: dict[int, SynthComm] = {}
        if meta_comm:
            self.meta_extra["comm"] = {
                "backend": backend,
                "period_ns": self.period_ns,
                "period_n": period_n,
                "watchpoints": watchpoints,
                "bulletin": 4096,
                "watch_loads": backend == "soft",
                "line_size": line_size,
                "bind": "none",
            }
            if between:  # "runtime": the runtime's board between processes
                self.meta_extra["comm"]["between_processes"] = between

    def comm(self, proc: SynthProc) -> SynthComm:
        if id(proc) not in self._comm:
            self._comm[id(proc)] = SynthComm(self, proc)
        return self._comm[id(proc)]

    def write(self, path: str) -> str:
        super().write(path)
        if "comm" in self.lenses:
            for p in self.procs:
                self.comm(p).write(os.path.join(path, "procs", p.key))
        return path


def false_sharing_run(path: str, threads: int = 8, n: int = 100, field: int = 8) -> str:
    """Each of `threads` threads writes its own `field`-byte slot of one 64-byte line
    (`stats`, a static array at 0x601000 in the tests' fake symbol table): every
    detection is false sharing between neighbours in a ring."""
    run = SynthCommRun(cpus=threads)
    p = run.proc(pid=500)
    for i in range(threads):
        p.thread(500 + i, 0.0, 1.0, parent=0 if i == 0 else 500)
    c = run.comm(p)
    for i in range(threads):
        j = (i + 1) % threads
        c.event(
            src=500 + i,
            dst=500 + j,
            line=0x601000,
            src_off=i * field,
            src_len=field,
            dst_off=j * field,
            dst_len=field,
            src_cpu=i,
            dst_cpu=j,
            src_ip=0x401100,
            dst_ip=0x401100,
            store=True,
            count=n,
        )
    for i in range(threads):
        c.counters(500 + i, samples=10 * n, signals=12 * n, skipped=2 * n, self_ns=1000)
    return run.write(path)
