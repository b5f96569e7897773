"""Writer of synthetic run directories, for tests and benchmarks.

Times are given in seconds since the run start; the processes use the MONOTONIC clock, so
ticks are nanoseconds. Counts tables are derived from the events unless given explicitly,
which is what the runtime would have written had it timed every section.

    run = SynthRun(cpus=4)
    p = run.proc(pid=100)
    p.thread(100, 0.0, 1.0)
    p.event("mutex", tid=100, lock=0x1000, t_req=0.1, t_acq=0.1, t_rel=0.2)
    run.write("/tmp/run")
"""

from __future__ import annotations

import json
import os

import numpy as np

from locus import FORMAT_VERSION, __version__
from locus.analysis.kinds import (  # noqa: F401  (re-exported for tests that build runs)
    EV_BROADCAST,
    EV_CONTENDED,
    EV_FAILED,
    EV_SAMPLED,
    EV_TRY,
    EV_UNRELEASED,
)
from locus.rundir import (
    CLOCK_MONOTONIC,
    LC_HEADER,
    LOCK_COUNT_DTYPE,
    LOCK_EVENT_DTYPE,
    LOCK_OBJECT_DTYPE,
    PROC_DTYPE,
    PROC_EXITED,
    PROC_MAGIC,
    SCHED_DTYPE,
    THREAD_DTYPE,
    THREAD_EXITED,
    THREAD_MAIN,
)

KINDS = {
    "mutex": 1,
    "rwlock_rd": 2,
    "rwlock_wr": 3,
    "spin": 4,
    "cond_wait": 5,
    "barrier": 6,
    "sem_wait": 7,
    "omp_lock": 8,
    "omp_nest_lock": 9,
    "omp_critical": 10,
    "omp_barrier": 11,
    "cond_signal": 12,
    "sem_post": 13,
    "join": 14,
    "create": 15,
}

START_NS = 1_000_000_000_000


def _ns(t: float) -> int:
    return START_NS + int(round(t * 1e9))


class SynthProc:
    def __init__(self, run: SynthRun, pid: int, ppid: int, start_s: float, end_s, flags):
        self.run = run
        self.pid = pid
        self.ppid = ppid
        self.start_s = start_s
        self.end_s = end_s
        self.flags = flags
        self.threads: list[tuple] = []
        self.events: list[np.ndarray] = []
        self.counts: list[tuple] = []
        self.objects: list[tuple] = []
        self.maps = ""
        self.self_ns = 0
        self.dropped = 0
        self.fastpath_ps = 0
        self.untimed_calls = 0
        self.heap_dropped = 0  # proc.bin heap_dropped: blocks whose records were dropped
        self.key = str(pid)

    def thread(self, tid: int, start: float, end: float | None = None, parent: int = 0):
        """A thread; end None = never exited cleanly."""
        serial = len(self.threads) + 1
        flags = THREAD_MAIN if serial == 1 else 0
        if end is not None:
            flags |= THREAD_EXITED
        self.threads.append((tid, serial, parent, flags, start, end))
        return serial

    def event(
        self,
        kind: str | int,
        tid: int,
        lock: int = 0,
        t_req: float = 0.0,
        t_acq: float | None = None,
        t_rel: float | None = None,
        site: int = 0x401000,
        obj: int = 0,
        weight: int = 1,
        flags: int = 0,
        contended: bool | None = None,
    ):
        """One event; t_acq defaults to t_req, t_rel to t_acq. `contended` defaults to
        t_acq > t_req for lock kinds, True for waits."""
        k = KINDS[kind] if isinstance(kind, str) else int(kind)
        t_acq = t_req if t_acq is None else t_acq
        t_rel = t_acq if t_rel is None else t_rel
        if contended is None:
            contended = t_acq > t_req or k in (5, 6, 7, 11, 14)
        if contended and k not in (12, 13, 15):
            flags |= EV_CONTENDED
        if weight > 1:
            flags |= EV_SAMPLED
        self.add_events(
            kind=k,
            tid=tid,
            lock=lock,
            t_req=t_req,
            t_acq=t_acq,
            t_rel=t_rel,
            site=site,
            obj=obj,
            weight=weight,
            flags=flags,
        )

    def add_events(self, **cols):
        """Bulk events: each keyword is a scalar or an array (times in seconds)."""
        n = max((np.size(v) for v in cols.values()), default=1)
        a = np.zeros(n, dtype=LOCK_EVENT_DTYPE)
        a["weight"] = 1
        a["site"] = 0x401000
        for name, v in cols.items():
            if name in ("t_req", "t_acq", "t_rel"):
                a[name] = START_NS + np.round(np.asarray(v, dtype=np.float64) * 1e9).astype(
                    np.int64
                )
            else:
                a[name] = v
        self.events.append(a)

    def count(self, tid, lock, site, kind, acquisitions, contended=0, failed=0, timed=0):
        k = KINDS[kind] if isinstance(kind, str) else int(kind)
        self.counts.append((tid, lock, site, k, acquisitions, contended, failed, timed))

    def object(self, lock, site, kind="mutex", t=0.0, attr=0, tid=0, flags=1):
        k = KINDS[kind] if isinstance(kind, str) else int(kind)
        self.objects.append((lock, site, k, t, attr, tid, flags))

    # ---- writing ----

    def _event_array(self) -> np.ndarray:
        if not self.events:
            return np.zeros(0, dtype=LOCK_EVENT_DTYPE)
        return np.concatenate(self.events)

    def _count_array(self, ev: np.ndarray) -> np.ndarray:
        serial_of = {t[0]: t[1] for t in self.threads}
        rows: dict[tuple, list[int]] = {}
        if self.counts:
            for tid, lock, site, k, acq, cont, fail, timed in self.counts:
                rows[(tid, lock, site, k)] = [acq, cont, fail, timed]
        elif len(ev):
            w = ev["weight"].astype(np.int64)
            failed = (ev["flags"] & EV_FAILED) != 0
            cont = (ev["flags"] & EV_CONTENDED) != 0
            key = np.stack(
                [ev["tid"].astype(np.uint64), ev["lock"], ev["site"], ev["kind"].astype(np.uint64)],
                axis=1,
            )
            uk, inv = np.unique(key, axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            acq = np.bincount(inv, weights=np.where(failed, 0, w), minlength=len(uk))
            con = np.bincount(inv, weights=np.where(cont & ~failed, w, 0), minlength=len(uk))
            fai = np.bincount(inv, weights=np.where(failed, w, 0), minlength=len(uk))
            tim = np.bincount(inv, minlength=len(uk))
            for i, k in enumerate(uk):
                rows[tuple(int(x) for x in k)] = [int(acq[i]), int(con[i]), int(fai[i]), tim[i]]
        by_thread: dict[int, list] = {}
        for (tid, lock, site, k), v in rows.items():
            by_thread.setdefault(tid, []).append((lock, site, k, v))
        tables = []
        for tid, entries in sorted(by_thread.items()):
            n = len(entries) * 2 + 2
            t = np.zeros(n, dtype=LOCK_COUNT_DTYPE)
            t[0]["lock"] = n
            t[0]["site"] = 1
            t[0]["kind"] = LC_HEADER
            t[0]["tid"] = tid
            t[0]["serial"] = serial_of.get(tid, 0)
            for i, (lock, site, k, (acq, cont, fail, timed)) in enumerate(entries):
                r = t[1 + 2 * i]  # leave every other slot empty, as a hash table would
                r["lock"], r["site"], r["kind"] = lock, site, k
                r["acquisitions"], r["contended"], r["failed"], r["timed"] = acq, cont, fail, timed
                r["tid"], r["serial"] = tid, serial_of.get(tid, 0)
            tables.append(t)
        if not tables:
            return np.zeros(0, dtype=LOCK_COUNT_DTYPE)
        return np.concatenate(tables)

    def write(self, pdir: str, lenses: list[str]):
        os.makedirs(pdir, exist_ok=True)
        ev = self._event_array()
        h = np.zeros(1, dtype=PROC_DTYPE)
        h["magic"] = PROC_MAGIC
        h["format_version"] = FORMAT_VERSION
        h["pid"], h["ppid"] = self.pid, self.ppid
        h["clock"] = CLOCK_MONOTONIC
        h["tsc0"] = h["ns0"] = h["start_ns"] = _ns(self.start_s)
        end = self.end_s if self.end_s is not None else self.run.duration_s
        h["tsc1"] = h["ns1"] = _ns(max(end, self.start_s + 1e-6))
        if self.end_s is not None:
            h["end_ns"] = _ns(self.end_s)
        h["flags"] = self.flags
        h["self_ns"] = self.self_ns
        h["records"] = len(ev) + len(self.threads)
        h["dropped"] = self.dropped
        h["threads"] = len(self.threads)
        h["fastpath_ns_per_call_x1000"] = self.fastpath_ps
        h["untimed_calls"] = self.untimed_calls
        h["heap_dropped"] = self.heap_dropped
        h.tofile(os.path.join(pdir, "proc.bin"))
        th = np.zeros(len(self.threads), dtype=THREAD_DTYPE)
        for i, (tid, serial, parent, flags, start, tend) in enumerate(self.threads):
            th[i]["tid"], th[i]["serial"], th[i]["parent_tid"] = tid, serial, parent
            th[i]["flags"] = flags
            th[i]["start"] = _ns(start)
            th[i]["end"] = _ns(tend) if tend is not None else 0
        th.tofile(os.path.join(pdir, "threads.bin"))
        if "locks" in lenses:
            ev.tofile(os.path.join(pdir, "locks.events.bin"))
            self._count_array(ev).tofile(os.path.join(pdir, "locks.counts.bin"))
            ob = np.zeros(len(self.objects), dtype=LOCK_OBJECT_DTYPE)
            for i, (lock, site, k, t, attr, tid, flags) in enumerate(self.objects):
                ob[i]["lock"], ob[i]["site"], ob[i]["kind"] = lock, site, k
                ob[i]["t"], ob[i]["attr"], ob[i]["tid"], ob[i]["flags"] = _ns(t), attr, tid, flags
            ob.tofile(os.path.join(pdir, "locks.objects.bin"))
        with open(os.path.join(pdir, "maps"), "w") as f:
            f.write(self.maps)


class SynthRun:
    def __init__(
        self,
        duration_s: float = 1.0,
        cpus: int = 4,
        complete: bool = True,
        command: list[str] | None = None,
        lenses: list[str] | None = None,
    ):
        self.duration_s = duration_s
        self.cpus = cpus
        self.complete = complete
        self.command = command or ["./synthetic"]
        self.lenses = lenses or ["locks"]
        self.procs: list[SynthProc] = []
        self.sched: list[tuple] = []
        self.meta_extra: dict = {}

    def proc(
        self, pid: int, ppid: int = 1, start: float = 0.0, end: float | None = None, flags=None
    ) -> SynthProc:
        """A process; end defaults to the run duration. flags None = exited cleanly."""
        if end is None:
            end = self.duration_s
        p = SynthProc(self, pid, ppid, start, end, PROC_EXITED if flags is None else flags)
        self.procs.append(p)
        return p

    def sample(self, t: float, pid: int, tid: int, service_s: float):
        """A launcher sched sample (tid 0: service_s is procs_running)."""
        self.sched.append((t, pid, tid, service_s))

    def meta_host(self) -> dict:
        return {
            "hostname": "synth",
            "cpus": self.cpus,
            "numa_nodes": 1,
            "cache_line": 64,
            "kernel": "6.1",
            "machine": "x86_64",
        }

    def meta(self) -> dict:
        m = {
            "format_version": FORMAT_VERSION,
            "locus_version": __version__,
            "command": self.command,
            "cwd": "/tmp",
            "env": {},
            "start_time": "2024-01-01T00:00:00+00:00",
            "start_ns": START_NS,
            "end_ns": _ns(self.duration_s),
            "duration_s": self.duration_s,
            "exit_status": 0,
            "complete": self.complete,
            "signal": None,
            "host": self.meta_host(),
            "lenses": self.lenses,
            "options": {"call_stack": False, "sample_interval_ms": 10},
            "sampler": {"interval_ms": 10, "samples": len(self.sched), "source": "synthetic"},
        }
        m.update(self.meta_extra)
        return m

    def write(self, path: str) -> str:
        os.makedirs(os.path.join(path, "procs"), exist_ok=True)
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump(self.meta(), f, indent=1)
        for p in self.procs:
            p.write(os.path.join(path, "procs", p.key), self.lenses)
        s = np.zeros(len(self.sched), dtype=SCHED_DTYPE)
        for i, (t, pid, tid, service) in enumerate(self.sched):
            s[i]["t_ns"], s[i]["pid"], s[i]["tid"] = _ns(t), pid, tid
            s[i]["service_ns"] = service if tid == 0 else int(round(service * 1e9))
        s.tofile(os.path.join(path, "sched.bin"))
        return path


def many_events(
    path: str, n_events: int = 1_000_000, threads: int = 8, locks: int = 16, seed: int = 0
) -> str:
    """A run with `n_events` mutex critical sections, for the analysis-speed benchmark.

    Each lock's sections follow one another in time (a lock is held by one thread at a
    time); threads are drawn at random, so about (threads-1)/threads of the sections find
    their lock taken and wait for the previous holder. Every thread also samples its
    service time, so the dependency-loss model runs too.
    """
    rng = np.random.default_rng(seed)
    per_lock = n_events // locks
    duration = per_lock * 12e-6 + 0.01
    run = SynthRun(duration_s=duration, cpus=threads)
    p = run.proc(pid=4242)
    tids = 4242 + np.arange(threads)
    for i, tid in enumerate(tids):
        p.thread(int(tid), 0.0, duration, parent=0 if i == 0 else 4242)
    for lk in range(locks):
        n = per_lock if lk < locks - 1 else n_events - per_lock * (locks - 1)
        hold = rng.exponential(4e-6, n) + 1e-7
        gap = rng.exponential(8e-6, n) * (rng.random(n) < 0.3)
        t_acq = 1e-3 + np.cumsum(hold + gap) - hold
        t_rel = t_acq + hold
        prev_rel = np.concatenate([[0.0], t_rel[:-1]])
        wait = np.where(gap == 0, t_acq - prev_rel + rng.exponential(5e-6, n), 0.0)
        t_req = t_acq - np.minimum(wait, t_acq)
        p.add_events(
            kind=1,
            tid=rng.choice(tids, n),
            lock=0x600000 + 64 * lk,
            site=0x401000 + 16 * rng.integers(0, 8, n),
            t_req=t_req,
            t_acq=t_acq,
            t_rel=t_rel,
            weight=1,
            flags=np.where(t_acq > t_req, EV_CONTENDED, 0),
        )
    for tid in tids:
        for t in np.linspace(0, duration, 11):
            run.sample(float(t), 4242, int(tid), float(t) * 0.6)
    return run.write(path)


def write_allocs(pdir: str, a: np.ndarray) -> None:
    """Allocation rows (ALLOC_DTYPE) in the files the runtime writes: heap blocks without a
    call stack in heap.bin, frees in frees.bin, the rest (mappings, stacks, blocks with a
    stack id) in allocs.bin."""
    from locus.rundir import (
        AL_FREE,
        AL_MALLOC,
        ALF_NEW,
        FREE_DTYPE,
        HEAP_DTYPE,
        HEAP_NEW,
        HEAP_SIZE_BITS,
    )

    heap = (a["kind"] == AL_MALLOC) & (a["stack"] == 0) & (a["site"] != 0)
    free = (a["kind"] == AL_FREE) & (a["addr"] != 0)
    a[~heap & ~free].tofile(os.path.join(pdir, "allocs.bin"))
    h = np.zeros(int(heap.sum()), dtype=HEAP_DTYPE)
    h["t"], h["addr"], h["site"] = a["t"][heap], a["addr"][heap], a["site"][heap]
    h["size_tid"] = (
        a["size"][heap]
        | (a["tid"][heap].astype(np.uint64) << np.uint64(HEAP_SIZE_BITS))
        | np.where((a["flags"][heap] & ALF_NEW) != 0, np.uint64(HEAP_NEW), np.uint64(0))
    )
    h.tofile(os.path.join(pdir, "heap.bin"))
    f = np.zeros(int(free.sum()), dtype=FREE_DTYPE)
    f["t"], f["addr"] = a["t"][free], a["addr"][free]
    f.tofile(os.path.join(pdir, "frees.bin"))
