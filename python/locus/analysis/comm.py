"""The comm lens: which threads exchange cache lines, how much, true or false sharing, on
which objects, lines and code sites (ComDetective, SC'19; docs/lenses/comm.md documents
every number).

One event of comm.events.bin is one detected communication src_tid -> dst_tid on a cache
line. Its `volume` is in samples for the sampling backends (soft, hw): ComDetective's
scaling makes a detection stand for `period` communications, so its weight is volume x
period, in the period's unit (memory accesses for count-based hw sampling, which gives
cache lines; nanoseconds of CPU time for time-based sampling). A watchpoint trap is
counted with the volume the runtime recorded for it, scaled the same way. The exact backend
counts every transfer: its volume is a number of cache lines, weight 1.

Matrices are symmetrised (M + M^T) with a zero diagonal, as ComDetective's are.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from locus.analysis.common import Names as _Names
from locus.analysis.common import Threads as _Threads
from locus.analysis.common import (
    add_os_names,
    alloc_prefetch,
    alloc_site,
    cpu_nodes,
    drop_damaged,
    handler_cost_rse,
    heap_blocks,
    in_system_header,
    inherited_allocs,
    is_alloc_wrapper,
    live_blocks,
    lock_of,
    short_function,
    site_callers,
    stack_table,
    strided_samples,
    task_switches,
    thinning_noted,
    thread_rows,
    unseen_tasks_note,
    via_text,
)
from locus.analysis.common import ranges as _ranges
from locus.analysis.common import site_str as _site_str
from locus.analysis.locks import group
from locus.dwarf import omp_outlined
from locus.errors import LocusError
from locus.render.units import nbytes
from locus.rundir import (
    AC_STORE,
    AL_MALLOC,
    AL_MMAP,
    AL_STACK,
    AL_TLS,
    ALF_FILE,
    ALF_NEW,
    ALF_SHARED,
    ALF_SYSV,
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
    CPU_MAX,
    FREE_DTYPE,
    HEAP_DTYPE,
    PID_MAX,
    RunDir,
    read_records,
)
from locus.symbolize import split_offset, tls_shown

BACKEND_NAMES = {BK_HW: "hw", BK_SOFT: "soft", BK_EXACT: "exact"}
KINDS = ("all", "true", "false")
BY = ("thread", "core", "node", "process")
# Below this many detections a volume is indicative only (relative standard error > 30 %).
MIN_DETECTIONS = 10


@dataclass
class Options:
    symbols: bool = True
    # proc -> an object with .data(addrs) and .code(addrs, return_addresses=) (tests give
    # a fake one); None = locus.symbolize.Symbolizer over the process's maps.
    symbolizer: Callable | None = None
    top_lines: int = 200
    top_sites: int = 500
    top_objects: int = 500


@dataclass
class Events:
    """All comm events of the run, columns concatenated over processes. load_events also
    sets `objects` (not a column): for the runtime's events between processes, row -> (key
    of the shared memory, offset of the line in it), which _home_lines reads."""

    proc: np.ndarray  # the detecting process (dst's): `line`, `t` and dst_ip are in it
    # The writer's process (src_ip, src_caller) and the detector's (dst_ip, dst_caller): proc,
    # except between processes, where proc is the first process that maps the memory.
    src_proc: np.ndarray
    dst_proc: np.ndarray
    t: np.ndarray  # raw ticks of the process's clock (compared with allocs.bin ticks)
    line: np.ndarray
    src_ip: np.ndarray
    dst_ip: np.ndarray
    volume: np.ndarray
    src: np.ndarray  # thread index (see _Threads)
    dst: np.ndarray
    src_cpu: np.ndarray
    dst_cpu: np.ndarray
    src_off: np.ndarray
    src_len: np.ndarray
    dst_off: np.ndarray
    dst_len: np.ndarray
    flags: np.ndarray
    dst_flags: np.ndarray
    # The program's calls into the system library src_ip/dst_ip is in (soft), 0 none.
    src_caller: np.ndarray
    dst_caller: np.ndarray
    # The detections each event stands for: 1, or the runtime's 1-in-K of a thinned event
    # (reserved[5]: --keep-samples), whose volume counts the ones left out already.
    count: np.ndarray


def recorded(run: RunDir) -> bool:
    if "comm" in run.lenses:
        return True
    names = ("comm.events.bin", "comm.threads.bin")
    return any(os.path.exists(p.file(n)) for p in run.procs for n in names)


# The flag bits the runtime defines (records with others are damage).
CE_KNOWN = 63  # LOCUS_CE_TRUE | TRAP | EXACT | LOADED | PROCS | GUESSED
AC_KNOWN = 63  # LOCUS_AC_STORE .. LOCUS_AC_RMW


def valid_events(e: np.ndarray) -> np.ndarray:
    """Rows of comm.events.bin that can be the runtime's (kind 1, known flags, tids, CPUs and
    a finite volume in range): a damaged file's other rows would make matrices of any size."""
    with np.errstate(invalid="ignore"):
        vol_ok = np.isfinite(e["volume"]) & (e["volume"] >= 0) & (e["volume"] < 1e18)
    return (
        (e["kind"] == 1)
        & ((e["flags"] & ~np.uint16(CE_KNOWN)) == 0)
        & ((e["dst_flags"] & ~np.uint32(AC_KNOWN)) == 0)
        & (e["src_tid"] > 0)
        & (e["src_tid"] <= PID_MAX)
        & (e["dst_tid"] > 0)
        & (e["dst_tid"] <= PID_MAX)
        & (e["src_cpu"] >= -1)
        & (e["src_cpu"] < CPU_MAX)
        & (e["dst_cpu"] >= -1)
        & (e["dst_cpu"] < CPU_MAX)
        & vol_ok
        & (e["reserved"][:, 5] <= THIN_MOST)
    )


THIN_MOST = 1 << 20  # the runtime's largest 1-in-K (comm.c, THIN_MAX)


def valid_threads(c: np.ndarray) -> np.ndarray:
    """Rows of comm.threads.bin that can be the runtime's (kind 1, a backend, a tid)."""
    return (
        (c["kind"] == 1)
        & np.isin(c["backend"], [BK_HW, BK_SOFT, BK_EXACT])
        & (c["tid"] > 0)
        & (c["tid"] <= PID_MAX)
    )


def load_events(run: RunDir, th: _Threads, notes: list[str] | None = None) -> Events:
    """The run's events; those between processes (CE_PROCS) also in `ev.objects`: row ->
    the key of their shared memory ("MAJ:MIN:INODE", as maps writes it) and their line's
    offset in it (the runtime's reserved[0..2])."""
    cols: dict[str, list] = {k: [] for k in Events.__dataclass_fields__}
    src_tid, dst_tid = [], []
    objects: dict[int, tuple[str, int]] = {}
    rows = 0
    for i, p in enumerate(run.procs):
        e = p.comm_events()
        e = drop_damaged(p, "comm.events.bin", e, valid_events(e), notes)
        if len(e) == 0:
            continue
        cols["proc"].append(np.full(len(e), i, dtype=np.int64))
        for k in Events.__dataclass_fields__:
            if k in ("proc", "src_proc", "dst_proc", "src", "dst", "count"):
                continue
            cols[k].append(e[k])
        cols["count"].append(np.maximum(e["reserved"][:, 5], 1).astype(np.int64))
        src_tid.append(e["src_tid"])
        dst_tid.append(e["dst_tid"])
        for j in np.flatnonzero((e["flags"] & CE_PROCS) != 0).tolist():
            ino, off, dev = (int(v) for v in e["reserved"][j][:3])
            if ino:
                objects[rows + j] = (f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}", off)
        rows += len(e)
    if not cols["proc"]:
        z = np.zeros(0, dtype=np.int64)
        arrs = {k: z for k in cols}
        arrs["volume"] = np.zeros(0)
        return Events(**arrs)
    arrs = {k: np.concatenate(v) for k, v in cols.items() if v}
    proc = arrs["proc"]
    st, dt = np.concatenate(src_tid), np.concatenate(dst_tid)
    arrs["dst_proc"] = proc
    arrs["src_proc"] = _source_procs(th, proc, st, arrs["flags"])
    # Threads of both roles in one pass, so first-seen order follows the events.
    both = th.lookup(np.concatenate([arrs["src_proc"], proc]), np.concatenate([st, dt]))
    arrs["src"], arrs["dst"] = both[: len(st)], both[len(st) :]
    for k in ("src_off", "src_len", "dst_off", "dst_len", "src_cpu", "dst_cpu"):
        arrs[k] = arrs[k].astype(np.int64)
    arrs["volume"] = arrs["volume"].astype(np.float64)
    ev = Events(**arrs)
    ev.objects = objects
    return ev


def _source_procs(th: _Threads, proc: np.ndarray, src_tid: np.ndarray, flags: np.ndarray):
    """The process of each event's source thread: the event's own, or, for an event between
    processes (CE_PROCS: the runtime's board between processes), the other process of the
    run that registered a thread src_tid (the first, by process order)."""
    out = proc.copy()
    x = np.flatnonzero((flags & CE_PROCS) != 0)
    if not len(x):
        return out
    where: dict[int, list[int]] = {}
    for pi, tid in th.index:
        where.setdefault(tid, []).append(pi)
    for i in x.tolist():
        others = [pi for pi in where.get(int(src_tid[i]), []) if pi != int(proc[i])]
        if others:
            out[i] = min(others)
    return out


def _config(run: RunDir, ct: np.ndarray, ev: Events, notes: list[str]) -> dict:
    """The comm configuration: meta["comm"] (launcher), else what the records say."""
    cfg = run.meta.get("comm")
    cfg = cfg if isinstance(cfg, dict) else {}

    def num(key, default=None):
        v = cfg.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else default

    backend = cfg.get("backend") if cfg.get("backend") in ("hw", "soft", "exact") else None
    if backend is None and len(ct):
        codes, n = np.unique(ct["backend"], return_counts=True)
        backend = BACKEND_NAMES.get(int(codes[np.argmax(n)]))
    if backend is None and len(ev.flags):
        backend = "exact" if (ev.flags & CE_EXACT).any() else None
    if backend is None:
        backend = "unknown"
    # The threads' records hold the period the runtime used (it may floor a tiny one).
    period_ns = num("period_ns")
    used = int(ct["period_ns"].max()) if len(ct) else 0
    if used and period_ns and used != period_ns and backend != "exact":
        notes.append(f"sampling period {used} ns used by the runtime ({period_ns} ns asked)")
    period_ns = int(used or period_ns or 0)
    period_n = num("period_n", 0) or 0
    period_n = int(period_n) if period_n <= 1 << 40 else 0  # the launcher's bound (cli.py)
    host_line = run.host.get("cache_line")
    line = num("line_size") or (host_line if isinstance(host_line, int) else 0) or 64
    if not (isinstance(line, int) and 8 <= line <= 4096 and line & (line - 1) == 0):
        notes.append(f"line size {line!r} in meta.json is not a cache line's: 64 bytes taken")
        line = 64
    if not cfg:
        notes.append(
            "meta.json has no comm configuration: backend and period were read from the "
            "per-thread records"
        )
    return {
        "backend": backend,
        "period_ns": period_ns,
        "period_n": period_n,
        # The exact backend arms none (a killed run has no thread records to say so).
        "watchpoints": 0 if backend == "exact" else num("watchpoints"),
        "bulletin": num("bulletin"),
        # Runs before it existed: not recorded (None), and nothing was armed on loads.
        "watch_loads": cfg.get("watch_loads") if cfg.get("watch_loads") in (True, False) else None,
        "exact_hooks": cfg.get("exact_hooks")
        if cfg.get("exact_hooks") in ("inlined", "calls")
        else None,
        "instrumented": cfg.get("instrumented")
        if isinstance(cfg.get("instrumented"), str)
        else None,
        "exact_copies": cfg.get("exact_copies")
        if cfg.get("exact_copies") in (True, False)
        else None,
        "line_size": int(line),
        "bind": cfg.get("bind") if isinstance(cfg.get("bind"), str) else None,
        # "runtime": the runtime detected between processes (its board between them); runs
        # before it: None, step 1 between processes is made here (between_processes).
        "between_processes": "runtime" if cfg.get("between_processes") == "runtime" else None,
    }


def scaling(cfg: dict) -> dict:
    """What one sampled detection stands for: {period, period_unit, scale, unit}."""
    if cfg["backend"] == "exact":
        return {"period": None, "period_unit": None, "scale": 1.0, "unit": "lines"}
    if cfg["period_n"] > 0:
        # Count-based (hw: one sample every period_n memory accesses): a detection stands
        # for period_n communications, i.e. cache-line transfers.
        return {
            "period": cfg["period_n"],
            "period_unit": "accesses",
            "scale": float(cfg["period_n"]),
            "unit": "lines",
        }
    if cfg["backend"] == "hw":
        # hw without a count: the kernel adapts the count period to reach about one sample
        # per period_ns (AMD IBS: every IBS_PERIOD ops), and samples do not carry it, so a
        # detection is one sampled access (perf c2c's unit): neither lines nor time.
        return {
            "period": cfg["period_ns"] or None,
            "period_unit": "ns" if cfg["period_ns"] else None,
            "scale": 1.0,
            "unit": "samples",
        }
    if cfg["period_ns"] > 0:
        # Time-based (soft timer): a sample stands for period_ns of the
        # sampling thread's CPU time, so volumes estimate CPU time (seconds) spent in
        # accesses that communicate, not a number of lines.
        return {
            "period": cfg["period_ns"],
            "period_unit": "ns",
            "scale": cfg["period_ns"] / 1e9,
            "unit": "s",
        }
    return {"period": None, "period_unit": None, "scale": 1.0, "unit": "detections"}


def weights(ev: Events, scale: float) -> np.ndarray:
    """Volume each event stands for: exact transfers as recorded, sampled detections (from
    a sample's lookup or a watchpoint trap) volume x scale."""
    exact = (ev.flags & CE_EXACT) != 0
    return np.where(exact, ev.volume, ev.volume * scale)


def symmetric(n: int, a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """M + M^T with a zero diagonal, M[a, b] = sum of w (rows outside 0..n-1 ignored)."""
    ok = (a >= 0) & (b >= 0) & (a < n) & (b < n) & (a != b)
    m = np.bincount(a[ok] * n + b[ok], weights=w[ok], minlength=n * n).reshape(n, n)
    m = m + m.T
    np.fill_diagonal(m, 0.0)
    return m


# ---- objects ----


class _Objects:
    """Objects the events are attributed to: key -> id, and their descriptions."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.info: list[dict] = []
        # The heap block holding each event's writer bytes, where one does: an index into
        # `writer_blocks` ({proc, site, frames, file}, as heap objects' info), else -1.
        self.writer_block: np.ndarray = np.zeros(0, dtype=np.int64)
        self.writer_blocks: list[dict] = []
        self._writer_keys: dict[tuple, int] = {}
        # (static objects by process: their starts, and (start, end, info), sorted; _static_at)
        self._static_spans: dict[int, tuple] | None = None

    def writer(self, pi: int, site: int, frames: tuple, file) -> int:
        key = (pi, site, frames, file)
        if key not in self._writer_keys:
            self._writer_keys[key] = len(self.writer_blocks)
            self.writer_blocks.append({"proc": pi, "site": site, "frames": frames, "file": file})
        return self._writer_keys[key]

    def get(self, key: tuple, **info) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.info)
            self.info.append(info)
        return self.ids[key]


def _thread_ends(threads: np.ndarray) -> dict[int, list[int]]:
    """Each tid's exit times (ticks; a tid may be reused), sorted; a thread that never
    exited cleanly has none."""
    ends: dict[int, list[int]] = {}
    for tid, end in zip(threads["tid"].tolist(), threads["end"].tolist()):
        if end:
            ends.setdefault(tid, []).append(end)
    return {k: sorted(v) for k, v in ends.items()}


def _end_after(ends, t0: int) -> int:
    """The first of a tid's exit times after t0 (its stack's start), else no end."""
    return next((e for e in ends if e >= t0), np.iinfo(np.uint64).max)


def _attribute_tls(tls, st, ends, pi, m, a, t, obj, off, names, objs, th) -> None:
    """Thread-local variables (`__thread`, C++ `thread_local`, OpenMP `threadprivate`): each
    thread's copy of a module's static TLS block lies at the block's offset (its LOCUS_AL_TLS
    record) from the thread's pointer (its stack record's reserved[0]), inside its stack
    mapping (other threads) or apart from it (the main thread). Named by the module's TLS
    symbol (`tally (thread-local, thread 1's copy)`), one object per thread's copy, as each
    thread's stack is one; without a symbol, the module's block. `tls`: the process's
    LOCUS_AL_TLS records."""
    if not len(tls) or not len(st):
        return
    tps = st[st["reserved"][:, 0] != 0]
    # (events, TLS record, offsets, the copy's address, its thread)
    hits: list[tuple[np.ndarray, int, np.ndarray, int, int]] = []
    # The events by address, each copy's found by bisection: thousands of threads times
    # each module's block, over every event, was quadratic.
    order = np.argsort(a, kind="stable")
    sa = a[order]
    for row in tps:
        tp, tid, t0 = int(row["reserved"][0]), int(row["tid"]), int(row["t"])
        t1 = _end_after(ends.get(tid, ()), t0)
        for k, blk in enumerate(tls):
            lo = (tp - int(blk["reserved"][0])) & (2**64 - 1)
            i0, i1 = np.searchsorted(sa, np.array([lo, lo + int(blk["size"])], dtype=np.uint64))
            if i0 == i1:
                continue
            c = order[i0:i1]
            c = c[(obj[m[c]] < 0) & (t[c] >= np.uint64(t0)) & (t[c] < np.uint64(t1))]
            if len(c):
                o = (a[c] - np.uint64(lo)).astype(np.int64)
                obj[m[c]] = -2  # taken (named below)
                hits.append((m[c], k, o, lo, th.index.get((pi, tid), -1)))
    for k in sorted({h[1] for h in hits}):
        copies = [(e, o, lo, owner) for e, kk, o, lo, owner in hits if kk == k]
        _name_tls(names, objs, pi, int(tls[k]["site"]), copies, obj, off)


def _name_tls(names, objs, pi: int, site: int, copies: list, obj, off) -> None:
    """Name the events of a module's TLS copies: `copies` [(event indices, their offsets in
    the copy, the copy's address, its thread)], the module's TLS segment at `site`. One object
    per copy and variable, by the module's TLS symbol (`tally (thread-local, thread 1's
    copy)`); without a symbol, one per copy for the module's block."""
    offs = np.concatenate([o for _e, o, _lo, _owner in copies])
    mod, found = names.tls(pi, site, sorted(set(offs.tolist())))
    for e, o, lo, owner in copies:
        for u in np.unique(o).tolist():
            sel = o == u
            name = found.get(u)
            # One object per thread's copy, as each thread's stack is one: what the advice
            # reads (who writes, who reads beside it) is a copy's.
            whose = f"thread {owner}'s copy" if owner >= 0 else "a thread's copy"
            if name:
                var, so = split_offset(name)
                shown = tls_shown(var)
                oid = objs.get(
                    ("tls", pi, site, var, lo),
                    kind="static",
                    proc=pi,
                    name=f"{shown} (thread-local, {whose})",
                    var=var,
                    shown=shown,
                    tls=site,
                    tls_off=u - so,
                    copy=owner,
                )
            else:
                so = u
                label = mod or f"{site:#x}"
                oid = objs.get(
                    ("tls", pi, site, lo),
                    kind="static",
                    proc=pi,
                    name=f"thread-local storage of {label} (no symbol, {whose})",
                    tls=site,
                    tls_off=0,
                    copy=owner,
                )
            obj[e[sel]] = oid
            off[e[sel]] = so


def _loader_tls(names, pi: int, tls: np.ndarray, block, static: dict) -> tuple | None:
    """(an address in the module whose dynamic TLS a heap block is, the TLS's start in the
    block), where the loader allocated the block (glibc's `__tls_get_addr` mallocs a
    dlopen'ed module's TLS at each thread's first use) and one loaded module without a
    static TLS block (`tls`, the process's LOCUS_AL_TLS records) has a TLS segment of its
    size (with its alignment, past 16); else None. `static` keeps those modules' paths,
    found at the first such block, and each size's module, for the next (a loader block per
    thread and module: the loaded modules were looked through for every one)."""
    where = names.module_path(pi, int(block["site"])) or ""
    if not os.path.basename(where).startswith(LOADERS):
        return None
    if "paths" not in static:
        static["paths"] = {p for r in tls if (p := names.module_path(pi, int(r["site"])))}
    sizes = static.setdefault("sizes", {})
    size = int(block["size"])
    if size not in sizes:
        sizes[size] = names.dynamic_tls(pi, size, static["paths"])
    found = sizes[size]
    if found is None:
        return None
    site, align = found
    addr = int(block["addr"])
    return site, (addr + align - 1) // align * align if align > 16 else addr


# The dynamic loader's file names (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ld.so).
LOADERS = ("ld-linux", "ld.so", "ld64.so")


def _attribute(run: RunDir, ev: Events, th: _Threads, names: _Names, objs: _Objects):
    """Object id and offset (of the detecting access) of each event, the distance to the
    writer's block when the writer's bytes lie in another block of the same heap object
    (else 0), and the writer's offset in its block of the object. Order: the threads'
    stacks, heap blocks alive at the event's time, static data symbols, cache lines of a
    module's data without a symbol, else unknown."""
    n = len(ev.proc)
    obj = np.full(n, -1, dtype=np.int64)
    off = np.zeros(n, dtype=np.int64)
    # The writer's bytes in another block of the same allocation site (small blocks that
    # malloc packs on one line, one per thread): the block distance, else 0.
    sib = np.zeros(n, dtype=np.int64)
    # The writer's offset in its own block where sib is set, else set below from the line.
    src_obj_off = np.zeros(n, dtype=np.int64)
    objs.writer_block = np.full(n, -1, dtype=np.int64)
    addr = ev.line.astype(np.uint64) + ev.dst_off.astype(np.uint64)
    src_addr = ev.line.astype(np.uint64) + ev.src_off.astype(np.uint64)
    for pi in np.unique(ev.proc).tolist():
        m = np.flatnonzero(ev.proc == pi)
        a = addr[m]
        t = ev.t[m].astype(np.uint64)
        al = inherited_allocs(run, pi, np.concatenate([a, src_addr[m]]))
        # Stacks: the thread whose stack it was at the event's time. glibc gives a joined
        # thread's stack to the next one (sort's workers, one after another, all had one):
        # the latest stack that started before the event holds it, until its thread ended
        # (then glibc may unmap it, or a user-supplied stack be freed, and a later heap
        # block there read as "stack of thread 7", long gone).
        st = al[al["kind"] == AL_STACK]
        st = st[np.argsort(st["t"], kind="stable")[::-1]]
        ends = _thread_ends(run.procs[pi].threads)
        tls = al[al["kind"] == AL_TLS]
        _attribute_tls(tls, st, ends, pi, m, a, t, obj, off, names, objs, th)
        static_tls: dict = {}  # (_loader_tls)
        for row in st:
            lo, size, tid = int(row["addr"]), int(row["size"]), int(row["tid"])
            hit = (obj[m] < 0) & (a >= lo) & (a < lo + size) & (t >= np.uint64(row["t"]))
            hit &= t < np.uint64(_end_after(ends.get(tid, ()), int(row["t"])))
            if not hit.any():
                continue
            k = th.index.get((pi, tid), -1)
            oid = objs.get(
                ("stack", pi, tid), kind="stack", proc=pi, thread=k, tid=tid, size=size, lo=lo
            )
            obj[m[hit]] = oid
            off[m[hit]] = (a[hit] - np.uint64(lo)).astype(np.int64)
        # Heap blocks: the block alive at the event's time that holds the address.
        b, bend = heap_blocks(al)
        if len(b):
            todo = np.flatnonzero(obj[m] < 0)
            bidx = live_blocks(b, bend, a[todo], t[todo])
            got = bidx >= 0
            sbidx = live_blocks(b, bend, src_addr[m][todo], t[todo])
            two = got & (sbidx >= 0) & (sbidx != bidx)
            two[two] = (b["site"][sbidx[two]] == b["site"][bidx[two]]) & (
                b["stack"][sbidx[two]] == b["stack"][bidx[two]]
            )
            sib[m[todo[two]]] = np.abs(
                b["addr"][sbidx[two]].astype(np.int64) - b["addr"][bidx[two]].astype(np.int64)
            )
            src_obj_off[m[todo[two]]] = (src_addr[m][todo[two]] - b["addr"][sbidx[two]]).astype(
                np.int64
            )
            stacks = stack_table(run.procs[pi]) if (b["stack"] != 0).any() else {}

            def block_key(r, stacks=stacks):
                # With --call-stack: grouped by the frames (threads number their stacks on
                # their own, so one path has an id per thread), named past the wrappers.
                frames = stacks.get(int(r["stack"]), ())
                # A file's mapping: one object per call and file (device, inode).
                flags = int(r["flags"])
                if flags & ALF_FILE:
                    return frames, (int(r["dev"]), int(r["reserved"][1]))
                if r["kind"] == AL_MMAP and flags & ALF_SHARED:
                    return frames, SHARED_SYSV if flags & ALF_SYSV else SHARED_ANON
                return frames, None

            # The writers' blocks, for a victim's advice (a block only read, moved by the
            # writes to another block on its line).
            sw = sbidx >= 0
            for bi in np.unique(sbidx[sw]).tolist():
                frames, file = block_key(b[bi])
                wid = objs.writer(pi, int(b["site"][bi]), frames, file)
                objs.writer_block[m[todo[sw & (sbidx == bi)]]] = wid
            for bi in np.unique(bidx[got]).tolist():
                r = b[bi]
                sel = todo[got & (bidx == bi)]
                dyn = _loader_tls(names, pi, tls, r, static_tls) if r["kind"] == AL_MALLOC else None
                if dyn is not None and (a[sel] >= np.uint64(dyn[1])).all():
                    # A thread's copy of a dlopen'ed module's TLS (an access in the block's
                    # alignment padding, before it, would be no variable's: a heap block).
                    tls_site, start = dyn
                    o = (a[sel] - np.uint64(start)).astype(np.int64)
                    owner = th.index.get((pi, int(r["tid"])), -1)
                    _name_tls(names, objs, pi, tls_site, [(m[sel], o, start, owner)], obj, off)
                    continue
                frames, file = block_key(r)
                key = ("heap", pi, int(r["site"]), frames, file)
                oid = objs.get(
                    key,
                    kind="heap",
                    proc=pi,
                    site=int(r["site"]),
                    frames=frames,
                    size=0,
                    blocks=0,
                    file=file,
                )
                info = objs.info[oid]
                info["mmap"] = info.get("mmap", True) and int(r["kind"]) == AL_MMAP
                info["new"] = info.get("new", True) and bool(int(r["flags"]) & ALF_NEW)
                info["size"] = max(info["size"], int(r["size"]))
                info["blocks"] += 1
                info.setdefault("lo", int(r["addr"]))
                obj[m[sel]] = oid
                off[m[sel]] = (a[sel] - r["addr"]).astype(np.int64)
        # Static data: data symbols of the distinct remaining addresses.
        rest = np.flatnonzero(obj[m] < 0)
        if len(rest):
            ua, uinv = np.unique(a[rest], return_inverse=True)
            uinv = uinv.reshape(-1)
            found = names.data(pi, ua.tolist())
            uobj = np.full(len(ua), -1, dtype=np.int64)
            uoff = np.zeros(len(ua), dtype=np.int64)
            for u, av in enumerate(ua.tolist()):
                name = found.get(av)
                if not name:
                    continue
                name, so = split_offset(name)
                uobj[u] = objs.get(
                    ("static", pi, name), kind="static", proc=pi, name=name, addr=av - so
                )
                uoff[u] = so
            obj[m[rest]] = uobj[uinv]
            off[m[rest]] = uoff[uinv]
        # Static data without a symbol (a stripped module): one object per cache line,
        # named by the line's ELF virtual address in its module's section, which a debug
        # build of the module names (`info symbol ADDR` in gdb).
        rest = np.flatnonzero(obj[m] < 0)
        if len(rest):
            lines = ev.line[m[rest]].astype(np.uint64)
            ul, linv = np.unique(lines, return_inverse=True)
            uobj = np.full(len(ul), -1, dtype=np.int64)
            for u, ln in enumerate(ul.tolist()):
                sec = names.section(pi, ln)
                if sec is None:
                    continue
                mod, section, v = sec
                name = f"line {v:#x} of {mod} {section or 'data'} (no symbol)"
                uobj[u] = objs.get(
                    ("static", pi, name), kind="static", proc=pi, name=name, stripped=mod
                )
            got = uobj[linv.reshape(-1)]
            obj[m[rest]] = got
            off[m[rest]] = np.where(got >= 0, (a[rest] - lines).astype(np.int64), 0)
        unk = np.flatnonzero(obj[m] < 0)
        if len(unk):
            oid = objs.get(("unknown", pi), kind="unknown", proc=pi)
            obj[m[unk]] = oid
            off[m[unk]] = -1
    # Elsewhere the writer's bytes are in the reader's object, at their distance in the line.
    same = sib == 0
    src_obj_off[same] = (
        off[same] + ev.src_off[same].astype(np.int64) - ev.dst_off[same].astype(np.int64)
    )
    return obj, off, sib, src_obj_off


# how heap objects read
HEAP_NAMES = ("heap block ", "file mapping ", "shared memory ", "Go heap arena", "Java heap")
# Share of an object's false volume between its blocks for the blocks' advice: below it
# the blocks have writers of their own fields too (two threads per block), which an aligned
# block does not cure (an audit's 67 %).
SIBLING_BLOCKS = 0.8
HANDOFF_ADVICE = 0.8  # share of an object's false volume at polled words: hand-off advice
# ... and its true share at least: each hand-over moves the flag truly (a mailbox: 55 %),
# while a hot counter beside a rarely set flag is 99 % false, and padding it helps (7x).
HANDOFF_TRUE = 0.25
SKIPPED_NOTE = 0.5  # share of skipped interrupts above which a note says what they were
WORK_SAMPLES = 2_000_000  # samples read per process for `work` (a stride beyond)
WORK_IPS = 16  # instructions symbolized per thread for `work`
WORK_MIN = 10  # samples (exact: transfers) a thread needs for a `work`


def _add_work(
    threads: list[dict], th: _Threads, run: RunDir, names: _Names, ev: Events, wk: dict
) -> None:
    """`work`: the function each thread was sampled in most, with its most sampled line
    (soft and hw samples; exact: the accesses of its transfers, by volume), so that a thread
    started through a generic trampoline (std::thread, Rust's thread_start, libgomp) says
    what it ran. A sample in a system library counts at the program's call into it (its
    `caller`) where the program's code is named: a thread waiting in libgomp's
    `GOMP_critical_start` worked in the region that called it ("GOMP_critical_end" and
    "libgomp.so.1.0.0 (no symbols)" said less); a stripped program's call says less than the
    library's own function (`openssl speed` in libcrypto's sha256). "" when unknown or below
    WORK_MIN samples. threads[i] is th's thread i."""
    want = {(th.proc[i], th.tid[i]): t for i, t in enumerate(threads)}
    # (ip, the call instruction of the program's call into a system library or 0, count)
    counts: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
    for pi, p in enumerate(run.procs):
        s = strided_samples(p, WORK_SAMPLES)[0]
        s = s[s["ip"] != 0]
        if not len(s):
            continue
        # (the call instruction's own line: a return address is the line after it)
        call = np.where(s["caller"] != 0, s["caller"] - 1, 0).astype(np.int64)
        inv, first = group(s["tid"].astype(np.int64), s["ip"].astype(np.int64), call)
        c = np.bincount(inv, minlength=len(first))
        for j in np.argsort(-c, kind="stable").tolist():
            key = (pi, int(s["tid"][first[j]]))
            lst = counts.setdefault(key, [])
            if key in want and len(lst) < WORK_IPS:
                lst.append((int(s["ip"][first[j]]), int(call[first[j]]), float(c[j])))
    if not counts and len(ev.proc):  # exact: no samples, every transfer's two accesses
        for idx, ips in ((ev.dst, ev.dst_ip), (ev.src, ev.src_ip)):
            inv, first = group(idx.astype(np.int64), ips.astype(np.int64))
            v = np.bincount(inv, weights=wk["all"], minlength=len(first))
            for j in np.argsort(-v, kind="stable").tolist():
                k = int(idx[first[j]])
                if 0 <= k < len(threads) and ips[first[j]]:
                    lst = counts.setdefault((th.proc[k], th.tid[k]), [])
                    if len(lst) < WORK_IPS:
                        lst.append((int(ips[first[j]]), 0, float(v[j])))
    keys = [(p, a) for (p, _tid), lst in counts.items() for r in lst for a in r[:2] if a]
    locs = dict(zip(keys, names.code(keys))) if keys else {}
    for t in threads:
        t["work"] = ""
    for (p, tid), lst in counts.items():
        t = want.get((p, tid))
        if t is None:
            continue
        by_fn: Counter = Counter()
        where: dict[str, str] = {}
        for ip, call, c in lst:
            loc = locs.get((p, call)) if call else None
            if loc is None or not loc.function:
                loc = locs.get((p, ip))
            if loc is not None and loc.function:
                by_fn[loc.function] += c
                where.setdefault(loc.function, loc.short() or loc.function)
            else:
                # Code without symbols (a stripped library's loop, [vdso]) counts too, by its
                # module: `liblzma.so.5 (no symbols)` (xz's workers read "": their samples
                # were all there; sysbench's were named by the 12 % that had a name).
                module, plus, _off = names.site(p, ip)["function"].rpartition("+0x")
                if plus and module:
                    by_fn[module] += c
                    where.setdefault(module, f"{module} (no symbols)")
        # A handful of samples (a thread that mostly waits) names nothing reliably.
        if by_fn and sum(by_fn.values()) >= WORK_MIN:
            t["work"] = where[by_fn.most_common(1)[0][0]]


CT_NO_COPY_BIT = 1  # LOCUS_CT_NO_COPY_BIT (locus_format.h)
CT_UNTRACKED = 2  # LOCUS_CT_UNTRACKED
CT_TICKED = 4  # LOCUS_CT_TICKED
CT_EXPIRY = 8  # LOCUS_CT_EXPIRY
CT_EXPIRY_DENIED = 16  # LOCUS_CT_EXPIRY_DENIED
WATCH_SWITCHES = 8  # detect.c: a watch on the tick ends after this many switches
EXACT_COPY_BITS = 64  # threads the exact model keeps copies for at once (exact.c XS_BITS)
EXACT_THREADS = 1024  # threads it tracks at once (exact.c XS_MAX)


# What recording one malloc/free pair costs under the comm lens (bench/alloc.py: 14 -> 94
# ns a pair on this project's VM), per record.
ALLOC_RECORD_S = 40e-9
ALLOC_NOTE_SHARE = 0.05


def _heap_blocks(run: RunDir) -> dict:
    """The heap allocation records of the run (`blocks` recorded, `frees` recorded) and the
    blocks whose records the runtime dropped (`short_lived`: no record named them, proc.bin
    `heap_dropped`), with the threads' summed lifetime (`thread_s`)."""
    blocks = frees = dropped = 0
    life = 0.0
    for p in run.procs:
        blocks += int((read_records(p.file("heap.bin"), HEAP_DTYPE)["site"] != 0).sum())
        frees += int((read_records(p.file("frees.bin"), FREE_DTYPE)["addr"] != 0).sum())
        dropped += int(p.hdr["heap_dropped"])
        if len(p.thread_start_s):
            span = p.thread_end_s - p.thread_start_s
            life += float(np.nansum(span[span > 0]))
    return {"blocks": blocks, "frees": frees, "short_lived": dropped, "thread_s": life}


def _allocation_cost_note(hb: dict) -> str | None:
    """A program that allocates constantly pays for every heap record, which the overhead
    line (measured slow paths) does not count: openssl speed ran 3-4x slower beside "1.9 %
    of thread time". Estimated from the records and the measured cost of one; a block whose
    records the runtime dropped (no record named it: proc.bin `heap_dropped`) cost about
    one record too (its malloc record, written and unwritten)."""
    n, dropped, life = hb["blocks"] + hb["frees"], hb["short_lived"], hb["thread_s"]
    cost = (n + dropped) * ALLOC_RECORD_S
    if not life or cost < ALLOC_NOTE_SHARE * life:
        return None
    rate = f"{(n + dropped) / life:,.0f} per second of thread time"
    if dropped:
        rate = (
            f", and {dropped:,} short-lived blocks whose records were dropped (no record "
            f"named them; {rate}, of either)"
        )
    else:
        rate = f" ({rate})"
    return (
        f"{n:,} heap allocation and free records{rate}: recording them cost at least "
        f"{cost:.2g} s ({100 * cost / life:.0f} % of thread time, at the ~40 ns a record "
        "bench/alloc.py measures), which the overhead line does not count; a program that "
        "allocates this often runs at least that much slower under the comm and numa lenses"
    )


def _untracked_threads_note(ct: np.ndarray) -> str | None:
    """The exact threads the model did not track at all (none of their accesses seen)."""
    n = int(((ct["flags"] & CT_UNTRACKED) != 0).sum()) if len(ct) else 0
    if not n:
        return None
    return (
        f"exact: {n} thread(s) were not tracked at all (they started while {EXACT_THREADS} "
        "others were live, the most the model tracks at once): none of their accesses are "
        "counted, in `samples` or anywhere else"
    )


def _untracked_note(ct: np.ndarray, counters: dict) -> str:
    """Why the exact backend did not track some accesses (its `skipped`, part of `samples`)."""
    nobit = (ct["flags"] & CT_NO_COPY_BIT) != 0
    n_nobit, k_nobit = int(nobit.sum()), int(ct["skipped"][nobit].sum())
    share = 100 * counters["skipped"] / max(counters["samples"], 1)
    text = f"exact: {counters['skipped']:,} accesses ({share:.1f} % of them) were not tracked"
    if n_nobit:
        text += (
            f"; {k_nobit:,} of them are the loads of {n_nobit} thread(s) that started while "
            f"{EXACT_COPY_BITS} others were live: the model keeps the copies of "
            f"{EXACT_COPY_BITS} threads at once (a 64-bit copy set), so transfers to these "
            "threads by their loads are not counted (their stores are, and transfers from "
            "them); fewer threads at once, or threads that end, are tracked whole"
        )
    if counters["skipped"] > k_nobit:
        text += (
            f"; {counters['skipped'] - k_nobit:,} were outside the shadow table (addresses "
            "beyond its reserved region, LOCUS_EXACT_SHADOW_MB) or made by a signal handler "
            "inside the model"
        )
    return text


def _note_stripped(objs: _Objects, obj: np.ndarray, wk: dict, notes: list) -> None:
    """Say how much of the volume is in static data without symbols, and how to name it."""
    ids = [i for i, info in enumerate(objs.info) if info.get("stripped")]
    total = float(wk["all"].sum()) if len(obj) else 0.0
    if not ids or total <= 0:
        return
    share = float(wk["all"][np.isin(obj, ids)].sum()) / total
    mods = sorted({objs.info[i]["stripped"] for i in ids})
    notes.append(
        f"{share:.0%} of the volume is in static data without symbols (stripped: "
        f"{', '.join(mods[:5])}): such objects are cache lines named by their address in the "
        "module; install its debug symbols (Debian: the -dbgsym package, into /usr/lib/debug) "
        "to name the variables"
    )


# LLVM's GlobalOpt turns the one block a static pointer `st` is ever given (`st =
# malloc(sizeof *st)`, the pointer not escaping) into a global `st.body`, and splits that into
# the parts the code uses, `st.body.0`, `st.body.1`, ... in the order of their offsets.
_PROMOTED = re.compile(r"(?P<ptr>[A-Za-z_$][\w$]*)\.body(?:\.\d+)?")


def _promoted_note(objects: list[dict]) -> str | None:
    """Say what clang's `X.body` objects are: the block the program allocated for `X`."""
    names = [o["name"] for o in objects if o["kind"] == "static" and _PROMOTED.fullmatch(o["name"])]
    if not names:
        return None
    ptrs = sorted({_PROMOTED.fullmatch(n).group("ptr") for n in names})
    shown = ", ".join(f"`{n}`" for n in names[:4]) + (", ..." if len(names) > 4 else "")
    split = any(not n.endswith(".body") for n in names)
    return (
        f"{shown}: the compiler (clang, LLVM's GlobalOpt) replaced the one block the static "
        f"pointer{'s' if len(ptrs) > 1 else ''} {', '.join(f'`{p}`' for p in ptrs[:4])} "
        "points to with a global of that name"
        + (
            ", and split it into the parts the code uses (.0, .1, ...: in the order of their "
            "offsets in the block)"
            if split
            else ""
        )
        + ": the fields are those of the type the pointer points to, to pad there (alignas(64) "
        "on each field)"
    )


def unique_rows(a: np.ndarray) -> np.ndarray:
    """np.unique(a, axis=0) for non-negative integer columns, through one packed key (much
    faster than sorting rows)."""
    if len(a) == 0:
        return a.reshape(0, a.shape[1] if a.ndim == 2 else 0)
    _inv, first = group(*(a[:, k] for k in range(a.shape[1])))
    return a[np.sort(first)] if len(first) else a[:0]


def _union(spans: list[tuple[int, int]]) -> list[list[int]]:
    """Byte spans [lo, hi) merged into [[lo, hi-1], ...] (inclusive, as printed)."""
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi - 1)
        else:
            out.append([lo, hi - 1])
    return out


def _missing_events(run: RunDir, ct_list: list, ev_proc: np.ndarray, notes: list[str]) -> None:
    """Said on stderr and in a note: a process whose threads counted far more detections
    than its comm.events.bin holds lost part of that file (cut at a whole record, partly
    copied). The runtime counts a detection once its record is written (one it could not
    write is counted as dropped instead), so the events found are never fewer."""
    found = np.bincount(ev_proc, minlength=len(run.procs)) if len(ev_proc) else None
    for i, (p, c) in enumerate(zip(run.procs, ct_list)):
        counted = int(c["detections"].sum()) if len(c) else 0
        have = int(found[i]) if found is not None else 0
        if counted - have - (int(c["dropped"].sum()) if len(c) else 0) > max(10, counted // 10):
            msg = (
                f"procs/{p.key}/comm.events.bin holds {have} of the {counted} detections the "
                "process's threads counted: the run's event file is incomplete (truncated or "
                "partly copied?); the volumes cover the events found"
            )
            print(f"locus: warning: {msg}", file=sys.stderr)
            notes.append(msg)


def _rse(n: float) -> float | None:
    """Relative standard error of a volume estimated from n sampled detections (Poisson)."""
    return None if n <= 0 else 1.0 / float(np.sqrt(n))


def _effective(count: np.ndarray, group: np.ndarray | None = None, n: int = 0):
    """The number of detections a volume's error is that of (Poisson: n with every event
    standing for one detection; (sum k)^2 / sum k^2 with thinned events of 1-in-k): per
    group (np.bincount's labels, n groups) or of them all."""
    k = count.astype(np.float64)
    if group is None:
        s2 = float((k * k).sum())
        return float(k.sum()) ** 2 / s2 if s2 else 0.0
    s1 = np.bincount(group, weights=k, minlength=n)
    s2 = np.bincount(group, weights=k * k, minlength=n)
    return np.divide(s1 * s1, s2, out=np.zeros(n), where=s2 > 0)


def analyze(run: RunDir, opts: Options | None = None) -> dict:
    """The `lenses.comm` object of the report (full tables, sorted by volume desc)."""
    opts = opts or Options()
    if not recorded(run):
        have = ", ".join(run.lenses) if run.lenses else "none"
        raise LocusError(f"lens 'comm' was not recorded in {run.path} (recorded: {have})")
    notes: list[str] = []
    th = _Threads(run)
    ct_list = []
    for p in run.procs:
        c = p.comm_threads()
        ct_list.append(drop_damaged(p, "comm.threads.bin", c, valid_threads(c), notes))
    ct = np.concatenate(ct_list) if ct_list else np.zeros(0)
    for i, c in enumerate(ct_list):
        th.lookup(np.full(len(c), i, dtype=np.int64), c["tid"])
    ev = load_events(run, th, notes)
    _missing_events(run, ct_list, ev.proc, notes)
    cfg = _config(run, ct, ev, notes)
    shared = _between(run)
    _home_lines(ev, shared)
    if cfg["backend"] in ("soft", "hw") and cfg["between_processes"] != "runtime":
        more = between_processes(run, th, cfg["line_size"], shared, ev)
        if more is not None:
            ev = concat_events(ev, more)
    self_ev = ev.src == ev.dst
    if self_ev.any():
        # A thread re-reading its own write is no communication (a runtime that wrote one
        # anyway is buggy): dropped everywhere, so every table adds up to the matrices.
        notes.append(f"{int(self_ev.sum())} event(s) from a thread to itself were ignored")
        ev = Events(**{k: getattr(ev, k)[~self_ev] for k in Events.__dataclass_fields__})
    threads_total = len(th)
    # Before the compaction, which drops the registered threads that took no sample (they
    # read as tasks the runtime never saw: any run of over 64 threads got that note).
    unseen = unseen_tasks_note(run, th)
    if len(th) > LIST_ALL_THREADS:
        th, ev = _compact_threads(th, ev, ct_list, notes)
    sc = scaling(cfg)
    w = weights(ev, sc["scale"])
    is_true = (ev.flags & CE_TRUE) != 0
    sampled = (ev.flags & CE_EXACT) == 0
    nth = len(th)
    n_ev = len(w)

    wk = {"all": w, "true": np.where(is_true, w, 0.0), "false": np.where(is_true, 0.0, w)}

    # Matrices by thread, core (CPU), NUMA node.
    cpus_seen = int(max(ev.src_cpu.max(initial=-1), ev.dst_cpu.max(initial=-1))) + 1
    ncpu = max(run.cpus or 0, cpus_seen, 1)
    node_of = cpu_nodes(run, ncpu, notes)
    nnode = int(node_of.max()) + 1 if len(node_of) else 1
    numa_meta = run.meta.get("numa") if isinstance(run.meta.get("numa"), dict) else {}
    if numa_meta.get("emulated"):
        notes.insert(
            0,
            f"EMULATED NUMA topology (--fake-numa): the node matrix's {nnode} nodes are blocks "
            "of this machine's CPUs, not memory nodes; it says where threads ran, not what "
            "a real multi-node machine would move between its nodes",
        )
    known_cpu = (ev.src_cpu >= 0) & (ev.dst_cpu >= 0)
    sn = np.where(ev.src_cpu >= 0, node_of[np.clip(ev.src_cpu, 0, ncpu - 1)], -1)
    dn = np.where(ev.dst_cpu >= 0, node_of[np.clip(ev.dst_cpu, 0, ncpu - 1)], -1)
    # By process: a pid's images (before and after an exec) are one process.
    processes, proc_of = _process_rows(run, th)
    matrices = {
        "thread": {k: symmetric(nth, ev.src, ev.dst, v) for k, v in wk.items()},
        "core": {k: symmetric(ncpu, ev.src_cpu, ev.dst_cpu, v) for k, v in wk.items()},
        "node": {k: symmetric(nnode, sn, dn, v) for k, v in wk.items()},
        "process": {
            k: symmetric(len(processes), proc_of[ev.src], proc_of[ev.dst], v) for k, v in wk.items()
        },
    }
    if n_ev and not known_cpu.all():
        pct = 100.0 * float(w[~known_cpu].sum()) / max(float(w.sum()), 1e-300)
        notes.append(
            f"{int((~known_cpu).sum())} detection(s) ({pct:.0f} % of the volume) have no CPU "
            "recorded: they are missing from the core and node matrices"
        )

    totals = {k: float(v.sum()) for k, v in wk.items()}
    # Detections made (a thinned event counts those it stands for); written: the records.
    totals["detections"] = int(ev.count.sum())
    totals["detections_written"] = n_ev
    # The volume of detections without a CPU: in the totals, in no core or node matrix.
    totals["no_cpu"] = float(w[~known_cpu].sum()) if n_ev else 0.0
    # How the sampling backends' detections were made: a sample's lookup (step 1), a trap on
    # a published store (step 2), a trap on a store to a line another thread loaded.
    trap = (ev.flags & CE_TRAP) != 0
    loaded = (ev.flags & CE_LOADED) != 0
    totals["detections_lookup"] = int(ev.count[sampled & ~trap].sum())
    totals["detections_trap"] = int(ev.count[trap & ~loaded].sum())
    totals["detections_loaded"] = int(ev.count[loaded].sum())
    # Traps whose access the decoder did not find: the watched bytes, taken as a load.
    totals["traps_undecoded"] = int(ev.count[(ev.flags & CE_GUESSED) != 0].sum())
    # ... of which between processes: by the runtime's board between them, or (runs before
    # it) by step 1 at report time (between_processes).
    between = (ev.flags & CE_PROCS) != 0
    totals["detections_between_processes"] = int(ev.count[between].sum())
    totals["traps_between_processes"] = int(ev.count[between & trap].sum())
    totals["between_processes"] = float(w[between].sum())
    # Bytes: exact, the transfers counted; count-based sampling, ComDetective's scaled
    # lines; time-based or rate sampling, a lower bound: a sample's detection finds a line
    # another thread wrote since the detecting thread's previous sample, so at least one
    # transfer of it happened in that interval, and a thread's intervals do not overlap
    # (traps give no such proof: a thread may have taken the line before the trap).
    if sc["unit"] == "lines":
        totals["bytes"] = totals["all"] * cfg["line_size"]
        totals["bytes_method"] = "counted" if cfg["backend"] == "exact" else "scaled"
    else:
        lookups = int(ev.count[(ev.flags & (CE_TRAP | CE_EXACT)) == 0].sum())
        totals["bytes"] = float(lookups * cfg["line_size"])
        totals["bytes_method"] = "lower_bound"
    n_sampled = _effective(ev.count[sampled])
    totals["rse"] = _rse(n_sampled) if n_sampled else (0.0 if n_ev else None)

    # Runtime counters.
    cnt_keys = (
        "signals",
        "samples",
        "skipped",
        "undecoded",
        "kernel",
        "published",
        "armed",
        "traps",
        "detections",
        "dropped",
        "self_ns",
    )
    counters = {k: int(ct[k].sum()) if len(ct) else 0 for k in cnt_keys}
    wp_open = sorted(set(ct["watchpoints"].tolist())) if len(ct) else []
    watchpoints = min(wp_open) if wp_open else cfg["watchpoints"]
    if len(ct) == 0:
        notes.append(
            "no per-thread comm counters (comm.threads.bin): samples, skipped accesses and "
            "overhead are unknown (killed run?)"
        )
    if counters["dropped"]:
        notes.append(f"{counters['dropped']} comm record(s) could not be written (dropped)")
    traps_all = totals["detections_trap"] + totals["detections_loaded"]
    if traps_all >= 10 and totals["traps_undecoded"] > GUESSED_NOTE * traps_all:
        notes.append(
            f"{totals['traps_undecoded']} of {traps_all} watchpoint traps took an access the "
            "decoder did not find (traps_undecoded): their side is the 8 watched bytes, taken "
            "as a load, at the trap's pc; their true/false verdicts and byte ranges are a "
            "guess"
        )
    thinned = thinning_noted(
        run,
        cfg["backend"],
        counters["samples"],
        notes,
        "every sample was still looked up and published on the bulletin board (the "
        "detections are thinned on their own: a note below says when); the bytes each "
        "thread touched on a line and the shared words are read from the written "
        "samples",
    )
    seen = counters["samples"] + counters["skipped"]
    if cfg["backend"] != "exact" and seen and counters["skipped"] > SKIPPED_NOTE * seen:
        k, u = counters["kernel"], counters["undecoded"]
        nomem = counters["skipped"] - k - u
        notes.append(
            f"{100 * counters['skipped'] / seen:.0f} % of the sampler's interrupts gave no "
            f"access ({nomem} found no memory operand by running ahead or single-stepping, "
            f"or landed in locus's own records, {u} undecodable, {k} in the kernel): the "
            "threads spent "
            "that time in register-only code (arithmetic, branches, spinning) or in system "
            "calls (a timer signal arrives as the call returns); the volumes cover the time "
            "in memory accesses only"
        )

    names = _Names(run, opts)
    objs = _Objects()
    obj, obj_off, sib, src_obj_off = _attribute(run, ev, th, names, objs)

    threads = thread_rows(run, th, names)
    # `created`: the thread's place in creation order among all threads; `index` is its
    # row in the matrices, the same unless threads without samples were left out.
    created = getattr(th, "created", None) or list(range(len(threads)))
    for t, k in zip(threads, created):
        t["created"] = k
    add_os_names(threads, run, th, ct_list)
    # A process's command: its main thread's name as the system shows it (the last image's,
    # after an exec), else its first thread's.
    for t, pi, main in zip(threads, proc_of.tolist(), th.main):
        if t.get("os_name") and (main or not processes[pi]["command"]):
            processes[pi]["command"] = t["os_name"]
    _add_work(threads, th, run, names, ev, wk)
    uses: dict = {}  # per process: its sampled accesses, read once (_sampled_uses)
    objects = _object_rows(
        ev, wk, obj, obj_off, sib, objs, threads, names, cfg, sampled, opts, uses
    )
    lines = _line_rows(ev, wk, obj, (obj_off, src_obj_off), objs, threads, names, opts)
    sites, unnamed, unnamed_pids = _site_rows(ev, wk, names, opts)
    if unnamed >= JIT_NOTE_MIN:
        notes.append(
            f"{100 * unnamed:.0f} % of the code sites' volume is in code outside every loaded "
            f"object ({', '.join(unnamed_pids[:3])}): code a JIT compiled at run time, "
            "shown as addresses. It is named when the program writes a perf map "
            "(/tmp/perf-PID.map, copied into the run): java -XX:+UnlockDiagnosticVMOptions "
            "-XX:+DumpPerfMapAtExit, node --perf-basic-prof, python3 -X perf (3.12+); see "
            "docs/lenses/comm.md, Code compiled at run time"
        )
    advice = _advice(objects, cfg, names)
    wrapped = sorted({o["_wrapper"] for o in objects if o["_wrapper"]})
    _strip_private(objects)
    # `objects` keeps the contract's kinds (heap, static, stack); what no object holds is
    # summed apart.
    unattributed = _unattributed(objects)
    if wrapped:
        notes.append(
            f"heap objects are named by an allocation wrapper ({', '.join(wrapped[:3])}): "
            "record with --call-stack to name the code that called it (and tell apart the "
            "objects it allocates)"
        )
    _note_stripped(objs, obj, wk, notes)
    promoted = _promoted_note(objects)
    if promoted:
        notes.append(promoted)
    shm = _between_processes_note(run, cfg, uses, totals, shared)
    if shm:
        notes.append(shm)
    handoff = _handoff_note(run, cfg, uses, totals["detections"], counters["samples"])
    if handoff:
        notes.append(handoff)
    if unseen:
        notes.append(unseen)
    ticked = int(((ct["flags"] & CT_TICKED) != 0).sum()) if len(ct) else 0
    rate = _switch_rate(run)
    switching = (
        _ticked_note(
            ticked,
            rate,
            expiry=int(((ct["flags"] & CT_EXPIRY) != 0).sum()),
            denied=int(((ct["flags"] & CT_EXPIRY_DENIED) != 0).sum()),
        )
        if ticked
        else _switching_note(run, cfg, rate)
    )
    if switching:
        notes.append(switching)
    crowded = _crowded_note(run, cfg)
    if crowded:
        notes.append(crowded)

    # Scaling and its uncertainty, honestly.
    if n_sampled:
        rse = totals["rse"] or 0.0
        # A trap stands for more than one period (detect.c): the paper's L/(D M).
        traps = (
            f"; a detection by watchpoint trap stands for {cfg['line_size']}/(8 M) periods "
            f"(the line's bytes over the 8 M its M watchpoints covered: "
            f"{cfg['line_size'] // 32} with 4), times k for a thread that armed only 1 time in "
            "k because its armings seldom trapped"
            if totals.get("detections_trap")
            else ""
        )
        if sc["unit"] == "s":
            notes.append(
                f"time-based sampling ({cfg['backend']}, one sample per {sc['period']} ns of "
                "a thread's CPU time): each detection by lookup stands for that much CPU time "
                f"spent in accesses to lines another thread wrote{traps}; volumes are that "
                "time in seconds, not a number of cache lines"
            )
        elif sc["unit"] == "lines":
            notes.append(
                f"count-based sampling: each detection by lookup stands for {sc['period']} "
                f"communications (ComDetective scaling){traps.replace(' periods', ' times that')}"
            )
        elif sc["unit"] == "samples":
            notes.append(
                "hw sampling at a rate (the kernel adapts the number of accesses between "
                "samples to the rate of events): a detection is one sampled access, not a "
                "number of lines or seconds; compare shares, not totals across runs, or give "
                "--period N (one sample every N accesses) for volumes in lines"
            )
        else:
            notes.append("sampling period unknown: volumes are raw detections (not scaled)")
        thin = ev.count[sampled]
        thinned_ev = bool((thin > 1).any())
        if thinned_ev:
            notes.append(
                f"detections thinned like the samples (--keep-samples), on the clock of their "
                f"thread's samples taken: 1 in 2 written, then 1 in 4, ... (up to 1 in "
                f"{int(thin.max())} here), chosen at random, each written one's volume counting "
                f"those left out; {len(thin)} written stand for {int(thin.sum())}: the volumes "
                f"stay unbiased, with the error of {n_sampled:.0f} detections, not of "
                f"{int(thin.sum())}"
            )
        notes.append(
            f"volumes are estimated from {n_sampled:.0f} sampled detection(s): relative "
            f"standard error about {100 * rse:.1f} % of the total (1/sqrt(detections), "
            f"Poisson{'; thinned detections count (sum k)^2 / sum k^2' if thinned_ev else ''}"
            f"); a cell or row with fewer than {MIN_DETECTIONS} detections is indicative only"
        )
    if cfg["backend"] == "exact" and cfg.get("exact_hooks"):
        partial = bool(counters["skipped"]) or bool(
            len(ct) and ((ct["flags"] & CT_UNTRACKED) != 0).any()
        )
        every = (
            "every access of the code that `locus cc` compiled counted"
            + (" but those not tracked (below)" if partial else "")
            + "; code in libraries built without it (libc's pthread_mutex_* and other lock "
            "functions, a system library's loops) is not seen: false sharing of two locks, "
            "or inside such a library, needs the soft backend"
        )
        notes.append(
            "exact backend, the hit test inlined into the program (only misses call "
            f"liblocus.so): {every}"
            if cfg["exact_hooks"] == "inlined"
            else "exact backend, one call per access into liblocus.so (a default `locus cc` "
            f"build inlines the hit test and runs 1.5-2x faster): {every}"
        )
    if cfg["backend"] == "exact" and cfg.get("exact_copies") is False:
        notes.append(
            "the program's memcpy, memmove and memset calls are not counted: this build "
            "(link-time optimised) does not route them through liblocus.so, so data that "
            "threads pass by copying is missing; a build without LTO counts them"
        )
    hb = _heap_blocks(run)
    heavy = _allocation_cost_note(hb)
    if heavy:
        notes.append(heavy)
    if cfg["instrumented"] and cfg["backend"] != "exact":
        notes.append(
            f"{os.path.basename(cfg['instrumented'])} is built with `locus cc`: its exact "
            "backend's hooks ran (and slowed the program) under this sampling backend; "
            "`--backend exact` counts every transfer"
        )
    if cfg["backend"] == "exact" and counters["skipped"]:
        notes.append(_untracked_note(ct, counters))
    untracked = _untracked_threads_note(ct) if cfg["backend"] == "exact" else None
    if untracked:
        notes.append(untracked)
    if not run.complete and cfg["backend"] == "exact":
        notes.append(
            "incomplete run: a process ended without its exit handlers (killed, or a raw "
            "exit): the exact backend writes a thread's transfers while it transfers (after "
            "100 ms, then at doubling intervals up to 10 s), when it ends, and at the "
            "process's exit, so that process's running threads' transfers are missing (up "
            "to their last interval)" + (" (none were recorded)" if n_ev == 0 else "")
        )
    elif n_ev == 0:
        notes.append("no communication was detected")
    if not run.complete and cfg["backend"] != "exact":
        notes.append(
            "incomplete run: a process ended without finishing its records (killed, or a raw "
            "exit without exit handlers): its events are kept, its threads' counters are "
            "those of their last checkpoint (every 256 sampler signals, and at least every "
            "20 ms while they sample)"
        )

    return {
        "backend": cfg["backend"],
        "period": sc["period"],
        "period_unit": sc["period_unit"],
        "scale": sc["scale"],
        "unit": sc["unit"],
        "line_size": cfg["line_size"],
        "watchpoints": watchpoints,
        "watchpoints_configured": cfg["watchpoints"],
        "watch_loads": cfg["watch_loads"],
        "exact_hooks": cfg["exact_hooks"],
        "bind": cfg["bind"],
        "samples": counters["samples"],
        "skipped": counters["skipped"],
        "thinning": thinned,
        "ticked_threads": ticked,
        "counters": counters,
        "overhead_s": counters["self_ns"] / 1e9,
        "overhead_rse": None if cfg["backend"] == "exact" else handler_cost_rse(counters),
        "heap_blocks": {k: hb[k] for k in ("blocks", "frees", "short_lived")},
        "threads": threads,
        "threads_total": threads_total,
        "processes": processes,
        "cpus": ncpu,
        "cpu_node": node_of.tolist(),
        "matrices": {by: {k: m.tolist() for k, m in mk.items()} for by, mk in matrices.items()},
        "totals": totals,
        "objects": objects,
        "unattributed": unattributed,
        "lines": lines,
        "sites": sites,
        "advice": advice,
        "notes": notes,
    }


LIST_ALL_THREADS = 64


def _process_rows(run: RunDir, th: _Threads) -> tuple[list[dict], np.ndarray]:
    """The run's processes ({index, pid}: by pid, in the order the run lists them, a pid's
    images before and after an exec being one process), and the process index of each of
    th's threads."""
    index: dict[int, int] = {}
    rows: list[dict] = []
    for p in run.procs:
        if p.pid not in index:
            index[p.pid] = len(rows)
            rows.append({"index": len(rows), "pid": p.pid, "command": ""})
    proc_of = np.array([index[run.procs[int(pi)].pid] for pi in th.proc], dtype=np.int64)
    return rows, proc_of


def _compact_threads(th: _Threads, ev: Events, ct_list: list, notes: list):
    """Above LIST_ALL_THREADS threads, list only the main threads and the threads that took
    a sample or appear in an event: a thread that did neither is an all-zero row and column,
    and N x N matrices of thousands of short-lived threads would be hundreds of megabytes."""
    keep = np.zeros(len(th), dtype=bool)
    keep[np.asarray(th.main, dtype=bool)] = True
    keep[ev.src] = True
    keep[ev.dst] = True
    for i, c in enumerate(ct_list):
        busy = c[c["samples"] > 0]
        if len(busy):
            idx = np.array([th.index.get((i, int(t)), -1) for t in busy["tid"].tolist()])
            keep[idx[idx >= 0]] = True
    if keep.all():
        return th, ev
    new = _Threads.__new__(_Threads)
    new.proc, new.tid, new.routine, new.main, new.index = [], [], [], [], {}
    new.created = []  # each kept thread's index among all of them (creation order)
    remap = np.full(len(th), -1, dtype=np.int64)
    for k in np.flatnonzero(keep).tolist():
        remap[k] = new.add(th.proc[k], th.tid[k], th.routine[k], th.main[k])
        new.created.append(k)
    fields = {f: getattr(ev, f) for f in Events.__dataclass_fields__}
    fields["src"], fields["dst"] = remap[ev.src], remap[ev.dst]
    notes.append(
        f"{int((~keep).sum())} of {len(th)} threads took no sample and exchanged nothing: "
        "they are left out of `threads` and the matrices (`threads_total` counts them)"
    )
    return new, Events(**fields)


def _sums(ids: np.ndarray, n: int, wk: dict) -> dict:
    return {k: np.bincount(ids, weights=v, minlength=n) for k, v in wk.items()}


def _object_rows(ev, wk, obj, obj_off, sib, objs, threads, names, cfg, sampled, opts, uses):
    n = len(objs.info)
    if n == 0:
        return []
    tids = np.array([t["tid"] for t in threads] + [-1], dtype=np.int64)
    S = _sums(obj, n, wk)
    det = _effective(np.where(sampled, ev.count, 0), obj, n)
    order = np.lexsort((-S["false"], -S["all"]))[: opts.top_objects]
    heaps = [objs.info[o] for o in order.tolist() if objs.info[o]["kind"] == "heap"]
    heaps += objs.writer_blocks[:VICTIM_WRITERS_LOOKED]
    alloc_prefetch(names, [(i["proc"], i["site"], i["frames"]) for i in heaps])
    line_off = obj_off - ev.dst_off
    out = []
    advisable = 0
    for o in order.tolist():
        info = objs.info[o]
        m = np.flatnonzero(obj == o)
        kind = info["kind"]
        site = ""
        size = None
        wrapper = ""  # the allocation wrapper that names a heap object (no call stack)
        loc = None
        if kind == "heap":
            name, loc, via = _heap_name(info, names)
            site = _site_str(loc) if info["site"] else ""
            if not via and info["site"] and is_alloc_wrapper(loc["function"]):
                wrapper = loc["function"]
            size = info["size"]
        elif kind == "stack":
            name = _obj_label(info, threads, names)
            size = info["size"]
        elif kind == "static":
            name = info["name"]
            size = names.data_size(info["proc"], info.get("var", name))
        else:
            name = "(unattributed)"
        # Thread pairs, unordered, by volume.
        a, b = np.minimum(ev.src[m], ev.dst[m]), np.maximum(ev.src[m], ev.dst[m])
        pinv, pfirst = group(a, b)
        pw = np.bincount(pinv, weights=wk["all"][m], minlength=len(pfirst))
        pf = np.bincount(pinv, weights=wk["false"][m], minlength=len(pfirst))
        po = np.argsort(-pw, kind="stable")[:20]
        pairs = [
            {
                "threads": [int(a[pfirst[j]]), int(b[pfirst[j]])],
                "all": float(pw[j]),
                "false": float(pf[j]),
            }
            for j in po
        ]
        # The false-sharing accesses (both sides) in object offsets, for the advice, of
        # the objects that can get one.
        fa: list = []
        written: set = set()
        fm = m[:0]
        timed_fields = None
        # Mostly false sharing, or one of its lines is (a struct whose shared counter's
        # true sharing hides the per-thread fields on its next line: 17 % false overall,
        # that line 100 %).
        lines_false = _false_line(ev, m, wk)
        if (
            (S["false"][o] >= ADVICE_MIN_FALSE * S["all"][o] > 0 or lines_false)
            and kind != "unknown"
            and advisable < 10
        ):
            advisable += 1
            # An object may start in the middle of a line (a static array is rarely
            # line-aligned): the accesses that fall before it belong to its neighbours.
            fm = m[(ev.flags[m] & CE_TRUE) == 0]
            # Rows (thread, offset, length, line of the object, false volume): the line is
            # counted from the one the object starts in (which starts at most a line before it).
            lidx = (line_off[fm] + cfg["line_size"]) // cfg["line_size"]
            # An exact event's writer range is the hull of all it wrote since taking the
            # line (32- and 56-byte "words" in the advice): its access length is taken to be
            # the reader's.
            exact_ev = (ev.flags[fm] & CE_EXACT) != 0
            src_len = np.where(exact_ev, ev.dst_len[fm], ev.src_len[fm])
            parts = [
                np.stack([tids, line_off[fm] + offs, np.maximum(lens, 1), lidx], axis=1)
                for tids, offs, lens in (
                    (ev.src[fm], ev.src_off[fm], src_len),
                    (ev.dst[fm], ev.dst_off[fm], ev.dst_len[fm]),
                )
            ]
            # The (thread, offset) pairs written: the writer's side, and stores among the
            # accessing side (a read of another thread's field does not make it shared).
            dst_w = (ev.dst_flags[fm] & AC_STORE) != 0
            written = {
                (int(t), int(x))
                for t, x in zip(
                    np.concatenate([ev.src[fm], ev.dst[fm][dst_w]]).tolist(),
                    np.concatenate(
                        [line_off[fm] + ev.src_off[fm], (line_off[fm] + ev.dst_off[fm])[dst_w]]
                    ).tolist(),
                )
                if x >= 0 and (not size or x < size)
            }
            if len(fm):
                fa = np.concatenate(parts)
                fw = np.concatenate([wk["false"][fm], wk["false"][fm]])
                inside = fa[:, 1] >= 0
                if size:
                    inside &= fa[:, 1] < size
                fa, fw = fa[inside], fw[inside]
                if kind == "stack" and len(fa):
                    ft = np.concatenate([ev.t[fm], ev.t[fm]])[inside]
                    fc = (
                        np.concatenate([ev.proc[fm], ev.proc[fm]])[inside],
                        np.concatenate([ev.src_ip[fm], ev.dst_ip[fm]])[inside],
                    )
                    stack = _layout_by(_layout_key(info, name, names), names)
                    timed_fields = _timed_fields(stack, fa, ft, fw, names, fc)
                if len(fa):
                    inv, first = group(*(fa[:, k] for k in range(4)))
                    w = np.bincount(inv, weights=fw, minlength=len(first))
                    fa = [[*r, x] for r, x in zip(fa[first].tolist(), w.tolist())]
                else:
                    fa = []
        stores = bool(len(fm)) and bool(((ev.dst_flags[fm] & AC_STORE) != 0).all())
        handoff = _handoff_share(ev, wk, m, fm)
        # False sharing between blocks of this site, each thread on its own (per-thread
        # counters from one malloc call): its share of the false volume, and the blocks'
        # usual distance.
        fsum = float(wk["false"][fm].sum()) if len(fm) else 0.0
        sibling = (
            (float(wk["false"][fm][sib[fm] > 0].sum()) / fsum, int(np.median(sib[fm][sib[fm] > 0])))
            if fsum > 0 and (sib[fm] > 0).any()
            else (0.0, 0)
        )
        # Only read here, while what moved the line was written next to it (`ITER` beside
        # two threads' counters): the object suffers its neighbours' false sharing.
        # (a writer range that overlaps the object at all: an exact one is a hull)
        src_at = line_off[fm] + ev.src_off[fm]
        src_end = src_at + np.maximum(ev.src_len[fm], 1)
        victim = (
            bool(size)
            and bool(len(fm))
            and not bool(((src_end > 0) & (src_at < (size or 0))).any())
            and sibling[0] < SIBLING_BLOCKS
        )
        reads = bool(len(fm)) and bool(((ev.dst_flags[fm] & AC_STORE) == 0).all())
        # The share of the false volume whose two accesses are both in the object: the rest
        # is shared with data beside it (a lock on the line of a flag other threads read).
        dst_at = line_off[fm] + ev.dst_off[fm]
        both_in = (src_end > 0) & (dst_at + np.maximum(ev.dst_len[fm], 1) > 0)
        if size:
            both_in &= (src_at < size) & (dst_at < size)
        own_false = float(wk["false"][fm][both_in].sum()) / fsum if fsum > 0 else 0.0
        # A victim's writers by name: the static variables at the writes' addresses (an
        # atomic counter all threads update has only true sharing of its own, and no
        # false-sharing row to be found by).
        writers: list[str] = []
        if victim:
            # (an exact event's range is a hull of the writer's bytes: one word at most)
            one = fm[ev.src_len[fm] <= WORD]
            src = np.unique(ev.line[one].astype(np.uint64) + ev.src_off[one].astype(np.uint64))
            found = names.data(info["proc"], src[:VICTIM_WRITERS_LOOKED].tolist())
            writers = list(dict.fromkeys(split_offset(v)[0] for v in found.values() if v))
            # Heap blocks written beside it (a vector of per-thread counters next to a
            # block only read): by their allocation site.
            wb = objs.writer_block[fm]
            for k in dict.fromkeys(wb[wb >= 0].tolist()):
                wname = _heap_name(objs.writer_blocks[k], names)[0]
                if wname != name and wname not in writers:
                    writers.append(wname)
        # The busiest false-sharing access, whose source file tells the advice's language:
        # the instruction with the most false volume (not the one heaviest event: a trap
        # weighs more than a lookup, and one in an exit handler reusing the stack named C).
        top = -1
        if len(fm):
            key = ev.dst_ip[fm].astype(np.uint64) | (ev.dst_proc[fm].astype(np.uint64) << 48)
            uk, kinv = np.unique(key, return_inverse=True)
            vol = np.bincount(kinv.reshape(-1), weights=wk["false"][fm], minlength=len(uk))
            top = int(fm[np.flatnonzero(key == uk[int(np.argmax(vol))])[0]])
        top_ip = (int(ev.dst_proc[top]), int(ev.dst_ip[top])) if top >= 0 else None
        # ... and its program's call into the system library it is in (a lock function).
        fc = fm[(ev.dst_caller[fm] != 0) & (ev.dst_ip[fm] == ev.dst_ip[top])] if len(fm) else fm
        top_caller = None
        if len(fc):
            inv, first = group(ev.dst_caller[fc])
            j = int(fc[first[np.argmax(np.bincount(inv, weights=wk["false"][fc]))]])
            top_caller = (int(ev.dst_proc[j]), int(ev.dst_caller[j]) - 1)
        shared = (
            _shared_words(names.run.procs[info["proc"]], ev, m, fm, tids, cfg["line_size"], uses)
            if len(fm)
            else (0, 0, {})
        )
        layout_key = _layout_key(info, name, names, loc, top_ip)
        out.append(
            {
                "name": name,
                "kind": "unknown" if kind == "unknown" else kind,
                "site": site,
                "size": size,
                "pid": names.run.procs[info["proc"]].pid,
                "all": float(S["all"][o]),
                "true": float(S["true"][o]),
                "false": float(S["false"][o]),
                "detections": int(ev.count[m].sum()),
                "rse": _rse(det[o]) if det[o] else 0.0,
                "lines": int(len(np.unique(ev.line[m]))),
                "threads": np.unique(np.concatenate([ev.src[m], ev.dst[m]])).tolist(),
                "pairs": pairs,
                "_false_accesses": fa,
                "_false_own": own_false,
                "_timed_fields": timed_fields,
                "_false_lines": (int(names.run.procs[info["proc"]].pid), set(ev.line[fm].tolist())),
                "_false_stores": stores,
                "_false_line": lines_false,
                "_false_written": written,
                "_victim": victim,
                "_sibling": sibling,
                "_handoff": handoff,
                "_victim_reads": reads,
                "_victim_writers": writers,
                "_shared_words": shared,
                "_wrapper": wrapper,
                "_top_ip": top_ip,
                "_top_caller": top_caller,
                "_layout": layout_key,
                **(
                    {
                        "locals": _stack_locals(
                            names, layout_key, obj_off[m], ev.t[m], (ev.proc[m], ev.dst_ip[m])
                        )
                    }
                    if kind == "stack"
                    else _pointer(_layout_by(layout_key, names))
                    if kind == "heap" and layout_key is not None
                    else {}
                ),
                **(
                    {"thread_local": True, "copy": info["copy"] if info["copy"] >= 0 else None}
                    if "copy" in info
                    else {}
                ),
                "_var": info.get("shown"),
                "_stack_lo": info.get("lo"),
                # A mapping (mmap'd: a file's, shared memory, an allocator's arena):
                # page-aligned, not a malloc'd block.
                "_mapped": bool(info.get("file") or info.get("mmap")),
                # Made by C++ operator new: alignas in the type aligns its blocks (C++17).
                "_new": bool(info.get("new")),
            }
        )
    return out


# Words used by two threads, one writing, that mark an object as shared over time: one is
# proof (per-thread fields never have one), but a heap site's blocks reused by another
# thread at the same address would give a stray one.
SHARED_WORDS_MIN = 2
WORD = 8  # bytes: the granule of _shared_words


SHARED_SAMPLES = 4_000_000  # sampled accesses read per process for _shared_words (a stride)


# The run's own files, which the runtime maps MAP_SHARED in every process: its record files
# and the board between processes. Not the program's memory.
RUN_FILE = re.compile(r"(?:/procs/\d+(?:\.\d+)?/[\w.]+\.bin|/comm\.board)$")
SHARED_NOTE_MIN = 0.01  # of the sampled accesses: memory shared between processes


ALWAYS = (0, 1 << 64)  # the lifetime of a mapping a process's maps list
# The `file` of an object that is an anonymous MAP_SHARED mapping (allocs.bin ALF_SHARED),
# or a System V segment (ALF_SHARED | ALF_SYSV).
SHARED_ANON = ("MAP_SHARED",)
SHARED_SYSV = ("shmat",)


def _shared_mappings(proc) -> list[tuple[int, int, str, str, int, tuple[int, int]]]:
    """(lo, hi, key, path, file offset of lo, (t0, t1)) of the process's writable MAP_SHARED
    mappings, the run's own files left out: those its maps list at its start and at its end
    (for its whole life), and the files it mapped so meanwhile (allocs.bin, LOCUS_ALF_SHARED:
    from the mmap to the munmap, in its ticks; an MPI rank maps its shared-memory segments
    after it starts and unmaps them before it ends). `key` is device:inode, the same in every
    process that maps the memory (an anonymous shared mapping is "/dev/zero (deleted)" with
    an inode of its own)."""
    out = []
    for ln in proc.maps_text().splitlines():
        f = ln.split(None, 5)
        if len(f) < 5 or len(f[1]) < 4 or f[1][1] != "w" or f[1][3] != "s":
            continue
        path = f[5].strip() if len(f) > 5 else ""
        if RUN_FILE.search(path) or f[4] == "0":
            continue
        lo, _, hi = f[0].partition("-")
        m = (int(lo, 16), int(hi, 16), f"{f[3]}:{f[4]}", path, int(f[2], 16), ALWAYS)
        if m not in out:
            out.append(m)
    al = proc.records("allocs.bin", ALLOC_DTYPE)
    want = ALF_FILE | ALF_SHARED
    if not len(al) or not ((al["flags"] & want) == want).any():
        return out
    b, end = heap_blocks(al)
    keep = ((b["flags"] & want) == want) & (b["size"] > 0)
    files = proc.mapped_files()
    for r, e in zip(b[keep].tolist(), end[keep].tolist()):
        t, addr, size, off, ino, dev = r[0], r[1], r[2], r[4][0], r[4][1], r[9]
        key = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
        out.append((addr, addr + size, key, files.get((dev, ino), ""), off, (t, e)))
    return out


def _homes(shared: tuple) -> dict[str, tuple[int, int, int]]:
    """Where each memory several processes map is shown: key -> (the first process that maps
    it, its address there, the offset in the memory of that address). `shared`: _between."""
    maps, between = shared
    home: dict[str, tuple[int, int, int]] = {}
    for i, ms in enumerate(maps):
        for lo, _hi, key, _path, off, _life in ms:
            if key in between and key not in home:
                home[key] = (i, lo, off)
    return home


def _home_lines(ev: Events, shared: tuple) -> None:
    """The runtime's events between processes (CE_PROCS), at the destination process's
    address of their line, moved to the address of the first process that maps the memory
    (by the memory and offset each event carries, ev.objects), as between_processes places
    its own: a line is then one line in every table. `shared`: _between(run)."""
    objects = getattr(ev, "objects", {})
    if not objects:
        return
    home = _homes(shared)
    # Memory no process's maps or mmap records show shared by two (mapped and unmapped
    # mid-run, a System V segment): its home is where the first event's process has it.
    order = sorted(objects, key=lambda i: (int(ev.dst_proc[i]), int(ev.t[i])))
    for i in order:
        key, off = objects[i]
        if key not in home:
            home[key] = (int(ev.dst_proc[i]), int(ev.line[i]), off)
    for i in order:
        key, off = objects[i]
        hp, hlo, hoff = home[key]
        ev.proc[i] = hp
        ev.line[i] = hlo - hoff + off


def _between(run: RunDir) -> tuple[list, set[str]]:
    """Each process's shared mappings, and the keys of those that two processes or more of
    the run map."""
    maps = [_shared_mappings(p) for p in run.procs] if len(run.procs) >= 2 else []
    owners: dict[str, set[int]] = {}
    for i, ms in enumerate(maps):
        for m in ms:
            owners.setdefault(m[2], set()).add(i)
    return maps, {k for k, v in owners.items() if len(v) >= 2}


def between_processes(
    run: RunDir, th: _Threads, line: int, shared: tuple, online: Events
) -> Events | None:
    """Step 1 of the method between the processes of the run, at report time, from their
    recorded samples: the runtime's bulletin board is one per process, so a line that passes
    between processes through memory they map shared (MAP_SHARED: fork-inherited anonymous
    memory, a shared-memory file, an MPI shared-memory segment) is never looked up there.
    A sampled access to such memory is keyed by the mapping's device:inode and its offset in
    it, the same in every process wherever each maps it; in time order over all processes, a
    sample whose line's latest sampled store (before it) is by a thread of another process,
    and newer than the sampling thread's previous sample (t_prev), is a communication from
    that thread, weighted by the sample's periods: what a board shared by the processes
    would have detected in step 1. Steps 2 and 3 (watchpoints) need the board at run time:
    they are not made between processes. None when there is no such memory or detection.
    The events' `proc` and `line` are the first process that maps the memory and the
    line's address there, so a line is one line in every table. A sample the runtime
    detected already (an older store of its own process on the line, in `online`) is not
    counted again. `shared`: _between(run)."""
    maps, between = shared
    if not between:
        return None
    keys = {k: j for j, k in enumerate(sorted(between))}
    home = {keys[k]: v for k, v in _homes(shared).items()}  # key index -> (proc, lo, offset)
    clocks = {int(p.hdr["clock"]) for p in run.procs}
    parts = []
    for i, p in enumerate(run.procs):
        rs = [(lo, hi, keys[k], off, life) for lo, hi, k, _path, off, life in maps[i] if k in keys]
        if not rs:
            continue
        s = p.comm_samples()
        s = s[(s["addr"] != 0) & (s["len"] != 0)]
        if not len(s):
            continue
        s = s[np.lexsort((s["t"], s["tid"]))]
        # Time of each sample's previous sample in its thread (0: none).
        t = (
            s["t"].astype(np.int64)
            if len(clocks) == 1
            else (p.seconds(s["t"]) * 1e9).astype(np.int64)
        )
        prev = np.zeros(len(s), dtype=np.int64)
        same = s["tid"][1:] == s["tid"][:-1]
        prev[1:] = np.where(same, t[:-1], 0)
        left = np.ones(len(s), dtype=bool)
        for lo, hi, k, off, (t0, t1) in rs:
            m = left & (s["addr"] >= np.uint64(lo)) & (s["addr"] < np.uint64(hi))
            if (t0, t1) != ALWAYS:
                m &= (s["t"] >= np.uint64(t0)) & (s["t"] < np.uint64(min(t1, (1 << 64) - 1)))
            if not m.any():
                continue
            left &= ~m
            fo = (s["addr"][m] - np.uint64(lo) + np.uint64(off)).astype(np.int64)
            parts.append(
                (np.full(int(m.sum()), i), np.full(int(m.sum()), k), fo, s[m], t[m], prev[m])
            )
    if not parts:
        return None
    proc, key, fo, smp, t, prev = (np.concatenate([q[j] for q in parts]) for j in range(6))
    lno = fo // line
    o = np.lexsort((t, lno, key))
    proc, key, fo, smp, t, prev, lno = proc[o], key[o], fo[o], smp[o], t[o], prev[o], lno[o]
    # The latest sampled store on each sample's line before it.
    n = len(smp)
    st = np.where((smp["flags"] & AC_STORE) != 0, np.arange(n), -1)
    before = np.concatenate([[-1], np.maximum.accumulate(st)[:-1]])
    b = np.maximum(before, 0)
    hit = (
        (before >= 0)
        & (key[b] == key)
        & (lno[b] == lno)
        & (proc[b] != proc)
        & (t[b] > prev)
        & (t[b] < t)
    )
    # (a store of the same process is the runtime's to detect: its board holds it)
    d = np.flatnonzero(hit)
    dst = th.lookup(proc[d].astype(np.int64), smp["tid"][d])
    again = _detected(online, proc[d].astype(np.int64), dst, smp["t"][d])
    d, dst = d[~again], dst[~again]
    if not len(d):
        return None
    w = b[d]
    hp = np.array([home[int(k)][0] for k in key[d].tolist()], dtype=np.int64)
    base = np.array([home[int(k)][1] - home[int(k)][2] for k in key[d].tolist()], dtype=np.int64)
    lstart = lno[d] * line
    src_off, dst_off = fo[w] - lstart, fo[d] - lstart
    src_len = np.minimum(smp["len"][w].astype(np.int64), line - src_off)
    dst_len = np.minimum(smp["len"][d].astype(np.int64), line - dst_off)
    true = (src_off < dst_off + dst_len) & (dst_off < src_off + src_len)
    ev = Events(
        proc=hp,
        src_proc=proc[w].astype(np.int64),
        dst_proc=proc[d].astype(np.int64),
        t=smp["t"][d],
        line=(base + lstart).astype(np.uint64),
        src_ip=smp["ip"][w],
        dst_ip=smp["ip"][d],
        volume=np.maximum(smp["periods"][d], 1).astype(np.float64),
        src=th.lookup(proc[w].astype(np.int64), smp["tid"][w]),
        dst=dst,
        src_cpu=smp["cpu"][w].astype(np.int64),
        dst_cpu=smp["cpu"][d].astype(np.int64),
        src_off=src_off,
        src_len=src_len,
        dst_off=dst_off,
        dst_len=dst_len,
        flags=np.where(true, CE_TRUE | CE_PROCS, CE_PROCS).astype(np.uint16),
        dst_flags=(smp["flags"][d] & AC_KNOWN).astype(np.uint32),
        src_caller=smp["caller"][w],
        dst_caller=smp["caller"][d],
        count=np.ones(len(d), dtype=np.int64),
    )
    return ev


def _detected(online: Events, proc: np.ndarray, dst: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Which of the samples (process, thread index, raw time) a lookup event of the runtime
    has: the sample's detection, with the sample's time."""
    lk = np.flatnonzero((online.flags & (CE_TRAP | CE_LOADED | CE_EXACT)) == 0)
    n = len(proc)
    if not len(lk) or not n:
        return np.zeros(n, dtype=bool)
    P = np.concatenate([online.proc[lk], proc])
    D = np.concatenate([online.dst[lk], dst])
    T = np.concatenate([online.t[lk].astype(np.uint64), np.asarray(t, dtype=np.uint64)])
    mine = np.concatenate([np.zeros(len(lk), dtype=bool), np.ones(n, dtype=bool)])
    o = np.lexsort((mine, T, D, P))  # an online row before an equal sample
    eq = (P[o][1:] == P[o][:-1]) & (D[o][1:] == D[o][:-1]) & (T[o][1:] == T[o][:-1])
    hit = np.zeros(len(P), dtype=bool)
    hit[o[1:]] = eq & mine[o][1:] & ~mine[o][:-1]
    return hit[len(lk) :]


def concat_events(a: Events, b: Events) -> Events:
    if not len(a.proc):
        return b
    fields = Events.__dataclass_fields__
    return Events(**{k: np.concatenate([getattr(a, k), getattr(b, k)]) for k in fields})


def _between_processes_note(
    run: RunDir, cfg: dict, uses: dict, totals: dict, shared: tuple
) -> str | None:
    """A note when a share of the sampled accesses went to memory that several processes of
    the run map shared (stress-ng's cacheline workers, MPI shared-memory transports): what
    was detected there between processes, and how (between_processes), or, with the exact
    backend, that it is not measured: "no communication" would mislead. `shared`:
    _between(run)."""
    maps, between = shared
    if not between or cfg["backend"] not in ("soft", "hw", "exact"):
        return None
    if cfg["backend"] == "exact":
        paths = sorted({m[3] or "anonymous" for ms in maps for m in ms if m[2] in between})
        return (
            f"processes of this run share memory (MAP_SHARED: {', '.join(paths[:3])}"
            f"{', ...' if len(paths) > 3 else ''}): the exact backend counts the transfers "
            "between the threads of one process, so cache lines passing between processes "
            "through it are not counted here"
        )
    hit = total = stores = 0
    procs: set[int] = set()
    paths: set[str] = set()
    for i, ms in enumerate(maps):
        rs = {(lo, hi, path) for lo, hi, key, path, _off, _life in ms if key in between}
        if not rs:
            continue
        smp = _sampled_uses(run.procs[i], cfg["line_size"], uses)[1]
        a = smp["addr"]
        total += len(a)
        inside = np.zeros(len(a), dtype=bool)
        for lo, hi, path in rs:
            m = (a >= np.uint64(lo)) & (a < np.uint64(hi))
            if m.any():
                inside |= m
                paths.add(path or "anonymous")
        if inside.any():
            hit += int(inside.sum())
            stores += int(((smp["flags"][inside] & AC_STORE) != 0).sum())
            procs.add(run.procs[i].pid)
    if not total or hit < SHARED_NOTE_MIN * total:
        return None
    shown = ", ".join(sorted(paths)[:3]) + (", ..." if len(paths) > 3 else "")
    n = totals["detections_between_processes"]
    share = totals["between_processes"] / max(totals["all"], 1e-300)
    if cfg["between_processes"] == "runtime":
        return (
            f"{100 * hit / total:.0f} % of the sampled accesses of {len(procs)} process(es) "
            f"went to memory that processes of this run share (MAP_SHARED: {shown}). The "
            "method runs between them on a bulletin board the run's processes share, where a "
            "line is keyed by the shared memory and its offset (wherever each process maps "
            f"it): {n:,} detection(s) between processes ({totals['traps_between_processes']:,} "
            f"by watchpoint traps), {100 * share:.0f} % of the volume"
            + (
                f". None of those {hit:,} samples was a store: the method needs a sampled "
                "store to publish, and a load of a line another process writes stalls and "
                "takes the time samples, while a store that runs seldom among the program's "
                "instructions (an interpreter's) is almost never sampled: a shorter --period "
                "samples more of them"
                if not n and not stores
                else ""
            )
        )
    return (
        f"{100 * hit / total:.0f} % of the sampled accesses of {len(procs)} process(es) went "
        f"to memory that processes of this run share (MAP_SHARED: {shown}). Between "
        f"processes, step 1 of the method is made when the report is made, on the recorded "
        f"samples ({n:,} detection(s), {100 * share:.0f} % of the volume): a sample whose line "
        "(the same offset of the same shared memory, wherever each process maps it) another "
        "process's thread was last sampled storing to since the sampling thread's previous "
        "sample. No watchpoints are armed between processes (step 2 needs the board at run "
        "time), so a volume between processes counts sample coincidences only: more samples "
        "(a shorter --period) find more of it"
    )


def _sampled_uses(proc, line: int, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """(line address, record) of a process's sampled accesses with an address: at most
    SHARED_SAMPLES of them, read once per process into `cache`."""
    if id(proc) not in cache:
        s = strided_samples(proc, SHARED_SAMPLES)[0]
        s = s[s["addr"] != 0]
        cache[id(proc)] = (s["addr"] - s["addr"] % np.uint64(line), s)
    return cache[id(proc)]


SWITCH_NOTE_RATE = 5_000  # context switches per second of the run that get the note
# A thread that switches context more often than this, per second of its CPU time, is
# sampled at the scheduler's tick (soft.c switch_high), and above the second pair without
# its watchpoints (soft.c wp_park_high; 8x LOCUS_COMM_SWITCH_RATE when that is set).
SWITCH_RATE_VM, SWITCH_RATE_METAL = 2_000, 50_000
WP_PARK_VM, WP_PARK_METAL = 80_000, 400_000


def _switch_rate(run: RunDir) -> int | None:
    """LOCUS_COMM_SWITCH_RATE as the run had it (None: the runtime's default)."""
    v = (run.meta.get("env") or {}).get("LOCUS_COMM_SWITCH_RATE")
    try:
        return int(v) if v not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _ticked_note(n: int, rate: int | None = None, expiry: int = 0, denied: int = 0) -> str:
    """The threads the soft sampler moved to the scheduler's tick (LOCUS_CT_TICKED); of
    them, `expiry` ended their watches after WATCH_SWITCHES switches (LOCUS_CT_EXPIRY) and
    `denied` could not (LOCUS_CT_EXPIRY_DENIED: no kernel events)."""
    limit = (
        f"{rate:,} times a second of their CPU time (LOCUS_COMM_SWITCH_RATE)"
        if rate
        else f"{SWITCH_RATE_VM:,} times a second of their CPU time ({SWITCH_RATE_METAL:,} on "
        "bare metal; LOCUS_COMM_SWITCH_RATE)"
    )
    park = (
        f"above {8 * rate:,}" if rate else f"above {WP_PARK_VM:,} ({WP_PARK_METAL:,} on bare metal)"
    )
    return (
        f"{n} thread(s) switched context more than {limit} and were "
        "sampled meanwhile at the scheduler's tick (a POSIX CPU-time timer: at most HZ "
        f"samples a second, each counted for the periods it stands for; {park} "
        "without watchpoints): perf's task clock costs at every switch (10-14 us in a VM; "
        "sysbench threads ran 12x slower for it). Those threads have fewer samples: their "
        "volumes are coarser"
        + (
            f". {expiry} of them ended each watch that had not trapped after "
            f"{WATCH_SWITCHES} of their context switches (a perf context-switch counter): "
            "an armed breakpoint costs at every switch"
            if expiry
            else ""
        )
        + (
            f". {denied} of them kept each watch until their next sample: the counter that "
            f"ends it after {WATCH_SWITCHES} context switches counts in the kernel, which "
            "needs kernel.perf_event_paranoid <= 1 or CAP_PERFMON, and an armed breakpoint "
            "costs at every switch (sysbench mutex in a VM: x1.12-1.14 of its own time, "
            "x1.08-1.09 with the counter)"
            if denied
            else ""
        )
    )


# A sampling run whose machine had more runnable tasks than CPUs in at least this share of
# the launcher's samples gets _crowded_note.
CROWDED_SHARE = 0.25


def _crowded_note(run: RunDir, cfg: dict) -> str | None:
    """A note when threads took turns on the CPUs for much of a sampling run: the launcher's
    system rows (sched.bin, tid 0) hold procs_running, which counts the launcher's own
    sampling thread as it reads it. A time sample cannot tell a thread's first access after
    another thread's store (a transfer) from the hits after it, and threads time-sliced
    against each other see most of their accesses to each other's lines so: comm_readwrite
    with 3 readers and a writer on 2 CPUs read 1.1-1.2x its 1-reader volume by soft, 0.5x
    by exact (docs/lenses/comm.md, Accuracy)."""
    cpus = run.cpus
    if cfg["backend"] == "exact" or not cpus:
        return None
    s = run.sched()
    running = s["service_ns"][s["tid"] == 0].astype(np.int64) - 1
    if len(running) < 10:
        return None
    share = float((running > cpus).mean())
    if share < CROWDED_SHARE:
        return None
    return (
        f"more tasks were runnable than the machine's {cpus} CPUs in {share:.0%} of the "
        "launcher's samples: threads took turns on the CPUs. A time sample cannot tell a "
        "thread's first access after another thread's store (the transfer) from the hits "
        "after it, so volumes between threads that take turns can exceed the transfers (3 "
        "readers and a writer on 2 CPUs: 1.2x the volume of 1 reader and a writer, against "
        "0.5x the transfers); with no more runnable threads than CPUs volumes compare across "
        "runs"
    )


def _switching_note(run: RunDir, cfg: dict, rate: int | None = None) -> str | None:
    """A note when the threads switch context often (they block and wake: a queue under a
    mutex and condition variables, sched_yield): each switch also stops and restarts the
    thread's sampling timer (a perf event), a cost in the kernel that the handlers' time
    does not count, which grows as the period shrinks. Such runs were 2-13x slower under
    soft sampling (a mutex+condvar queue, sysbench threads with yields) with a comm cost
    under 1 %; with the period at 60 s the queue ran as fast as without locus."""
    if cfg["backend"] == "exact":
        return None
    dur = run.meta.get("duration_s") or 0.0
    n = task_switches(run)
    if not dur or n < SWITCH_NOTE_RATE * dur:
        return None
    return (
        f"the threads switched context {n:,.0f} times ({n / dur:,.0f}/s): each switch also "
        "stops and restarts the thread's sampling timer (a perf event), a cost in the kernel "
        "that the comm cost above does not count, larger the shorter the period (a queue "
        "under a mutex and condition variables, 33,000 switches/s in a VM: 2.1x slower at "
        "the default 1 ms, 1.3x at 5 ms, 1.04x at 10 ms): a longer --period (10ms) keeps "
        "such a program's timing, with fewer samples "
        + (
            "(LOCUS_COMM_SWITCH_RATE=0 kept every thread on the task clock; without it a "
            "thread that switches that often is moved to the scheduler's tick by itself)"
            if rate == 0
            else f"(a thread that switches more than {rate or SWITCH_RATE_VM:,} times a second "
            "of its CPU time"
            + ("" if rate else f" in a VM, {SWITCH_RATE_METAL:,} on bare metal,")
            + " is moved to the scheduler's tick by itself)"
        )
    )


def _handoff_note(run: RunDir, cfg: dict, uses: dict, detections: int, samples: int) -> str | None:
    """A note when many sampled accesses went to lines that several threads use and one of
    them writes, yet few detections came of them: a hand-off spun on with loads (a flag, a
    queue's indices) publishes few sampled stores, and the timer rarely lands on them."""
    if cfg["backend"] == "exact" or not samples:
        return None
    hot = total = 0
    for p in run.procs:
        base, s = _sampled_uses(p, cfg["line_size"], uses)
        if not len(s):
            continue
        total += len(s)
        inv, first = group(base)
        pairs = np.unique(np.stack([inv, s["tid"].astype(np.int64)], 1), axis=0)
        users = np.bincount(pairs[:, 0], minlength=len(first))
        # Written: a sampled store on the line's page (the stores of a hand-off are few,
        # its indices and slots are near each other), to a line several threads use: each
        # thread's store to its own padded counter beside a bound they all read (written
        # once, before them) is no hand-off.
        page = base >> np.uint64(12)
        shared_store = ((s["flags"] & AC_STORE) != 0) & (users >= 2)[inv]
        written = np.isin(page, page[shared_store])
        hot += int(((users >= 2)[inv] & written).sum())
    if not total:
        return None
    est = samples * hot / total
    if est < HANDOFF_MIN_SAMPLES or detections >= HANDOFF_MAX_RATE * est:
        return None
    if cfg.get("watch_loads"):
        why = (
            "with --watch-loads too (it needs the storing thread sampled on the word it "
            "hands off: in a token ring each thread only stores to the next one's)"
        )
    elif cfg.get("watchpoints") != 0:
        why = "; `--watch-loads on` (the soft backend's default) watches what other threads load"
    else:
        why = ""
    return (
        f"{100 * hot / total:.0f} % of the sampled accesses (about {est:,.0f}) went to lines "
        f"that several threads use and one of them writes, yet {detections} detection(s) came "
        "of them: either the threads use those lines at different times (no communication), "
        "or a hand-off spun on with loads (a flag, a queue's indices) publishes few sampled "
        f"stores and this backend sees little of it{' ' if why.startswith('with') else ''}"
        f"{why}; `--backend exact` (a `locus cc` build) counts every transfer"
    )


def _false_line(ev: Events, m: np.ndarray, wk: dict) -> bool:
    """Whether one line of an object (events m) is mostly false sharing and carries at least
    ADVICE_LINE_SHARE of the object's false-sharing volume."""
    if not len(m):
        return False
    inv, _first = group(ev.line[m])
    f = np.bincount(inv, weights=wk["false"][m])
    a = np.bincount(inv, weights=wk["all"][m])
    hot = (f >= ADVICE_MIN_FALSE * a) & (f > 0) & (f >= ADVICE_LINE_SHARE * f.sum())
    return bool(hot.any())


# Exact backend: the true transfers of a word that make it shared data (more than this).
EXACT_SHARED_WORD_MIN = 2


def _shared_words(
    proc, ev: Events, m: np.ndarray, fm: np.ndarray, tids: np.ndarray, line: int, cache: dict
) -> tuple[int, int, int]:
    """(shared, seen, handed) 8-byte words of the lines of the false-sharing events fm (of
    an object whose events are m): a word is *shared* when the run shows two threads using
    it, one of them writing it, at any time; *handed* ({writer's thread index: words}) when
    one thread alone writes it and others read it (a queue's slots and indices, a flag: data
    handed from one thread to another). Per-thread fields that only share lines never have
    one; an array that threads sweep in turn, or an array of locks, does: false sharing
    there comes with true sharing of the same elements. Sampling backends: from every
    sampled access to those lines (comm.samples.bin) and both sides of the detections on
    them (tids: thread index -> tid); exact: the words of the true-sharing transfers on
    those lines (their bytes overlap a word the writer wrote; handed: not told, {})."""
    lines = np.unique(ev.line[fm].astype(np.uint64))
    if (ev.flags[m] & CE_EXACT).all():
        on = m[np.isin(ev.line[m].astype(np.uint64), lines)]
        t = on[(ev.flags[on] & CE_TRUE) != 0]
        vol: Counter = Counter()
        for i in t:
            vol[(int(ev.line[i]), int(ev.dst_off[i]) // WORD)] += float(ev.volume[i])
        # A word moved once or twice is not data the threads share (the main thread reading
        # each worker's result after the joins): shared words are moved more often.
        words = {w for w, v in vol.items() if v > EXACT_SHARED_WORD_MIN}
        seen = {
            (int(ev.line[i]), int(o) // WORD) for i in on for o in (ev.dst_off[i], ev.src_off[i])
        }
        return len(words), len(seen | words), {}
    base, smp = _sampled_uses(proc, line, cache)
    smp = smp[np.isin(base, lines)]
    # Uses: (first byte, length, thread, written) of the sampled accesses, and of both sides
    # of the object's detections on those lines (the writer's side is a store).
    on = m[np.isin(ev.line[m].astype(np.uint64), lines)]
    ln = ev.line[on].astype(np.int64)
    a = np.concatenate([smp["addr"].astype(np.int64), ln + ev.src_off[on], ln + ev.dst_off[on]])
    n = np.concatenate([smp["len"], ev.src_len[on], ev.dst_len[on]]).astype(np.int64)
    who = np.concatenate([smp["tid"].astype(np.int64), tids[ev.src[on]], tids[ev.dst[on]]])
    wr = np.concatenate(
        [smp["flags"] & AC_STORE != 0, np.ones(len(on), bool), ev.dst_flags[on] & AC_STORE != 0]
    )
    if not len(a):
        return 0, 0, {}
    # By byte: two threads' 2-byte fields in one word are not the same data (a word's
    # "two users" claimed true sharing there); a word is shared when one of its bytes is.
    nb = np.clip(n, 1, 64)
    k = np.arange(int(nb.max()))
    sel = k[None, :] < nb[:, None]
    b = (a[:, None] + k[None, :])[sel]
    who = np.broadcast_to(who[:, None], sel.shape)[sel]
    wr = np.broadcast_to(wr[:, None], sel.shape)[sel]
    ub, inv = np.unique(b, return_inverse=True)
    inv = inv.reshape(-1)
    pairs = np.unique(np.stack([inv, who], axis=1), axis=0)
    users = np.bincount(pairs[:, 0], minlength=len(ub))
    written = np.bincount(inv, weights=wr.astype(float), minlength=len(ub)) > 0
    wpairs = np.unique(np.stack([inv[wr], who[wr]], axis=1), axis=0)
    writers = np.bincount(wpairs[:, 0], minlength=len(ub)) if len(wpairs) else users * 0
    both = (users >= 2) & written
    shared = np.unique(ub[both] // WORD)
    # A word is handed when none of its shared bytes has two writers: by its writer's thread
    # index (the words' one writer each).
    handed = np.setdiff1d(shared, np.unique(ub[both & (writers >= 2)] // WORD))
    index = {int(t): k for k, t in enumerate(tids.tolist())}
    one = wpairs[np.isin(ub[wpairs[:, 0]] // WORD, handed)] if len(wpairs) else wpairs
    by: Counter = Counter()
    for _word, tid in {(int(ub[b] // WORD), int(t)) for b, t in one.tolist()}:
        by[index.get(tid, -1)] += 1
    return int(len(shared)), int(len(np.unique(ub // WORD))), dict(by)


def _line_rows(ev, wk, obj, offsets, objs, threads, names, opts) -> list:
    """The hottest lines. offsets: each event's (reader's, writer's) offset in its object."""
    if len(ev.line) == 0:
        return []
    obj_off, src_obj_off = offsets
    inv, first = group(ev.proc, ev.line)
    n = len(first)
    S = _sums(inv, n, wk)
    order = np.lexsort((-S["false"], -S["all"]))[: opts.top_lines]
    rank = np.full(n, -1, dtype=np.int64)
    rank[order] = np.arange(len(order))
    keep = np.flatnonzero(rank[inv] >= 0)
    r = rank[inv[keep]]
    # Byte ranges each thread touched on each line, both roles. An exact transfer's writer
    # range is the hull of every byte it wrote while it held the line (two fields with one
    # between read as three): a thread's own reads and writes of the line, where it has
    # some, are its accesses one by one.
    src = np.stack([r, ev.src[keep], ev.src_off[keep], np.maximum(ev.src_len[keep], 1)], 1)
    dst = np.stack([r, ev.dst[keep], ev.dst_off[keep], np.maximum(ev.dst_len[keep], 1)], 1)
    hull = (ev.flags[keep] & CE_EXACT) != 0
    if hull.any():
        width = int(max(ev.src.max(initial=0), ev.dst.max(initial=0))) + 1
        hull &= np.isin(r * width + ev.src[keep], r * width + ev.dst[keep])
        src = src[~hull]
    acc = np.concatenate([src, dst])
    acc = unique_rows(acc)
    spans: dict[int, dict[int, list]] = {}
    for li, t, o, ln in acc.tolist():
        spans.setdefault(li, {}).setdefault(t, []).append((o, o + ln))
    # Code sites of each line; one in a system library with the program's call that led
    # there ("site ← caller": the caller's call instruction, a return address minus one).
    ips = np.concatenate(
        [
            np.stack(
                [r, ev.src_proc[keep], ev.src_ip[keep], ev.src_caller[keep].astype(np.int64)], 1
            ),
            np.stack(
                [r, ev.dst_proc[keep], ev.dst_ip[keep], ev.dst_caller[keep].astype(np.int64)], 1
            ),
        ]
    )
    ips = unique_rows(ips[ips[:, 2] != 0].astype(np.uint64)).astype(np.int64)
    names.code(
        [(int(p), int(ip)) for _li, p, ip, _c in ips.tolist()]
        + [(int(p), int(c) - 1) for _li, p, _ip, c in ips.tolist() if c]
    )
    line_sites: dict[int, list[str]] = {}
    for li, p, ip, c in ips.tolist():
        s = _site_str(names.site(int(p), int(ip)))
        if c:
            s += f" ← {_site_str(names.site(int(p), int(c) - 1))}"
        lst = line_sites.setdefault(li, [])
        if s not in lst:
            lst.append(s)
    # Dominant object of each line.
    ow = np.bincount(
        r * (len(objs.info) or 1) + obj[keep],
        weights=wk["all"][keep],
        minlength=len(order) * max(len(objs.info), 1),
    ).reshape(len(order), max(len(objs.info), 1))
    dom = ow.argmax(axis=1)
    # Offset of each line's start in its dominant object: negative when the object starts
    # inside the line (a static array is rarely line-aligned).
    lo_all = obj_off[keep] - ev.dst_off[keep]
    ok = (obj[keep] == dom[r]) & (obj_off[keep] >= 0)
    big = np.iinfo(np.int64).max
    line_lo = np.full(len(order), big, dtype=np.int64)
    np.minimum.at(line_lo, r[ok], lo_all[ok])
    # The fields: each access's bytes at its own offset in the line's object (the blocks
    # of one allocation site that the allocator packs on a line each have theirs).
    mine = obj[keep] == dom[r]
    wrote = mine & ~hull
    at = np.concatenate(
        [
            np.stack([r, ev.dst[keep], obj_off[keep], np.maximum(ev.dst_len[keep], 1)], 1)[mine],
            np.stack([r, ev.src[keep], src_obj_off[keep], np.maximum(ev.src_len[keep], 1)], 1)[
                wrote
            ],
        ]
    )
    obj_spans: dict[tuple[int, int], list] = {}
    for li, t, o, ln in unique_rows(at).tolist():
        obj_spans.setdefault((li, t), []).append((o, o + ln - 1))
    # (each row's time: a stack whose frames' locals took the same bytes in turn names
    # them by it, _fields_timed)
    when = np.concatenate([ev.t[keep][mine], ev.t[keep][wrote]])
    # (and the instruction's process and address, for its function: _fields_timed)
    code = (
        np.concatenate([ev.proc[keep][mine], ev.proc[keep][wrote]]),
        np.concatenate([ev.dst_ip[keep][mine], ev.src_ip[keep][wrote]]),
    )
    timed_rows: dict[tuple[int, int], list] = {}
    n_det = np.bincount(inv, weights=ev.count.astype(np.float64), minlength=n).astype(np.int64)
    out = []
    for li, g in enumerate(order.tolist()):
        e = first[g]
        o = int(dom[li])
        info = objs.info[o] if objs.info else {}
        label = _obj_label(objs.info[o], threads, names) if objs.info else ""
        key = _layout_key(info, label, names) if line_lo[li] != big else None
        layout = _layout_by(key, names)
        out.append(
            {
                "address": f"{int(ev.line[e]):#x}",
                "pid": names.run.procs[int(ev.proc[e])].pid,
                "object": label,
                "offset": int(line_lo[li]) if line_lo[li] != big else None,
                "all": float(S["all"][g]),
                "true": float(S["true"][g]),
                "false": float(S["false"][g]),
                "detections": int(n_det[g]),
                "verdict": _verdict(float(S["true"][g]), float(S["false"][g])),
                "threads": [
                    {
                        "thread": t,
                        "bytes": _union(sp),
                        "fields": _fields_timed(
                            layout, _rows_at(timed_rows, at, when, li, t, names, code)
                        )
                        if getattr(layout, "timed", None)
                        else _fields_at(layout, obj_spans.get((li, t), []))
                        + _beside(objs, names, o, obj_spans.get((li, t), []), layout),
                    }
                    for t, sp in sorted(spans.get(li, {}).items())
                ],
                "sites": line_sites.get(li, []),
            }
        )
    return out


def _rows_at(
    rows: dict, at: np.ndarray, when: np.ndarray, li: int, t: int, names, code: tuple
) -> list:
    """The accesses (offset, size, time, function) of thread t to line li, from the rows
    `at` (line, thread, offset, size), their times and their instructions `code` (processes,
    addresses): grouped into `rows` at the first call."""
    if not rows:
        fns = names.functions(*code)
        for (r, th, o, ln), w, fn in zip(at.tolist(), when.tolist(), fns):
            rows.setdefault((r, th), []).append((o, ln, w, fn))
        rows[(-1, -1)] = []  # (grouped)
    return rows.get((li, t), [])


def _fields_timed(layout, rows: list) -> list[str]:
    """The fields accesses (offset, size, time, function) reached in a stack whose recorded
    frames' locals took the same bytes in turn, each by the frame live at its time or of its
    function (StackLayout.at)."""
    times: dict[tuple[int, int], set] = {}
    for o, ln, w, fn in rows:
        times.setdefault((o, ln), set()).add((w, fn))
    out: list[str] = []
    for (o, ln), ts in sorted(times.items()):
        for off in range(max(o, 0), o + ln):
            for f in layout.fields_at(off, ts):
                if f and f not in out:
                    out.append(f)
    return out


def _fields_at(layout, ranges: list) -> list[str]:
    """The fields of a variable (dwarf.Layout) that byte ranges [a, b] of it cover; []
    without a layout."""
    if layout is None:
        return []
    out: list[str] = []
    for a, b in ranges:
        for off in range(a, b + 1):
            f = layout.field(off) if off >= 0 else ""
            if f and f != layout.name and f not in out:
                out.append(f)
    return out


def _beside(objs, names, o: int, ranges: list, layout) -> list[str]:
    """What the byte ranges [a, b] (relative to static object o's start) reach of the static
    variables beside it on its line, outside it: `sa.misses`, or a scalar's name, for a
    thread on the line of `sb` that wrote the `sa` before it (the most common false sharing:
    two variables side by side). [] for other objects, or bytes in no known variable."""
    info = objs.info[o] if 0 <= o < len(objs.info) else {}
    if info.get("kind") != "static" or not info.get("addr") or not ranges:
        return []
    size = (layout.size if layout is not None else None) or names.data_size(
        info["proc"], info["name"]
    )
    if not size:
        return []
    out: list[str] = []
    layouts: dict[int, object] = {}  # (each neighbour's, by its start)
    for a, b in ranges:
        for off in range(a, b + 1):
            if 0 <= off < size:
                continue
            hit = _static_at(objs, names, info["proc"], info["addr"] + off)
            if hit is None:
                continue
            other, start = hit
            if start not in layouts:
                layouts[start] = _layout_by(_layout_key(other, other["name"], names), names)
            lay = layouts[start]
            f = lay.field(info["addr"] + off - start) if lay is not None else other["name"]
            if f and f not in out:
                out.append(f)
    return out


def _static_at(objs, names, proc: int, addr: int) -> tuple[dict, int] | None:
    """(info, start) of the static object of process `proc` that holds address addr (its
    symbol's size), or None."""
    if objs._static_spans is None:
        objs._static_spans = {}
    spans = objs._static_spans
    if proc not in spans:
        rows = []
        for info in objs.info:
            if info.get("kind") == "static" and info.get("proc") == proc and info.get("addr"):
                size = names.data_size(proc, info["name"]) or 0
                if size:
                    rows.append((info["addr"], info["addr"] + size, info))
        rows.sort(key=lambda r: r[0])
        spans[proc] = ([r[0] for r in rows], rows)
    starts, rows = spans[proc]
    k = bisect.bisect_right(starts, addr) - 1
    if k >= 0 and rows[k][0] <= addr < rows[k][1]:
        return rows[k][2], rows[k][0]
    return None


def _verdict(true: float, false: float) -> str:
    """perf c2c's question for a line: "false" or "true" sharing when one kind makes at
    least 90 % of its volume, else "mixed"."""
    total = true + false
    if total <= 0:
        return "none"
    if false >= 0.9 * total:
        return "false"
    if true >= 0.9 * total:
        return "true"
    return "mixed"


def _obj_label(info: dict, threads, names) -> str:
    k = info["kind"]
    if k == "static":
        return info["name"]
    # The same names as the objects table, so a line can be looked up by its object.
    if k == "stack":
        t = info["thread"]
        return (
            f"stack of thread {t} (tid {info['tid']})" if t >= 0 else f"stack of tid {info['tid']}"
        )
    if k == "heap":
        return _heap_name(info, names)[0]
    return "(unattributed)"


def _heap_name(info: dict, names) -> tuple[str, dict, list[str]]:
    """(name, allocating site, wrappers passed) of a heap object: the objects table's and
    the lines' (they differed: a line named the wrapper or the library header)."""
    loc, via = alloc_site(names, info["proc"], info["site"], info["frames"])
    if in_system_header(loc["file"]):  # std::vector's allocate, without a stack
        loc = dict(loc, function=short_function(loc["function"]))
    site = _site_str(loc) if info["site"] else ""
    name = f"heap block from {site}" if site else "heap block (site unknown)"
    if info.get("file") in (SHARED_ANON, SHARED_SYSV):
        name = f"shared memory from {site}" if site else "shared memory (site unknown)"
        sysv = info.get("file") == SHARED_SYSV
        name += " (System V, shmat)" if sysv else " (MAP_SHARED | MAP_ANONYMOUS)"
    elif info.get("file"):
        path = _mapped_file(names.run.procs[info["proc"]], *info["file"])
        name = f"file mapping from {site}" if site else "file mapping (site unknown)"
        name += f" ({path})" if path else f" (inode {info['file'][1]})"
    elif loc["function"] in GO_ARENA:
        # The Go runtime maps its heap in arenas of 64 MiB (through cgo's x_cgo_mmap when
        # built with cgo): every Go object is "from" that mmap, at offsets of megabytes.
        name = f"Go heap arena (mapped by {site})"
    elif loc["function"].startswith(JVM_HEAP):
        # HotSpot reserves and commits its whole heap: every Java object is "from" that
        # mmap, at offsets of hundreds of megabytes.
        name = f"Java heap (mapped by {site})"
    return name + via_text(via), loc, via


def _mapped_file(proc, dev: int, inode: int) -> str:
    """The path of a mapped file: as the runtime read it at the mmap (mapped_files.txt),
    else the maps' path of that inode (at start, at exit, before a dlclose), else ""."""
    path = proc.mapped_files().get((dev, inode))
    if path:
        return path
    for ln in proc.maps_text().splitlines():
        f = ln.split(None, 5)
        if inode and len(f) > 5 and f[4] == str(inode):
            return f[5].strip()
    return ""


# Where the Go runtime maps its heap: an object in it is a Go value, not this allocation.
# HotSpot's functions that map its heap (libjvm.so).
JVM_HEAP = ("os::pd_commit_memory", "os::pd_reserve_memory", "os::commit_memory",
            "os::reserve_memory", "os::pd_attempt_reserve_memory")  # fmt: skip
# How to give each thread's field its own line in Java (no alignas).
JAVA_ALIGN = (
    " (@jdk.internal.vm.annotation.Contended on the fields, with -XX:-RestrictContended for "
    "classes outside the JDK, or padding fields between them)"
)

GO_ARENA = {
    "x_cgo_mmap",
    "runtime.sysAlloc",
    "runtime.sysReserve",
    "runtime.sysMap",
    "runtime.mmap",
}


def _site_rows(ev, wk, names, opts) -> tuple[list, float, list[str]]:
    """Volume per code site (function, file, line): an event counts for its writer's and its
    detector's instruction, once when both are the same site (an unrolled or inlined loop
    has several instructions on one line). Also the share of the sites' volume at code
    outside every loaded object that no perf map names (a JIT's), and those processes
    ("pid N")."""
    n = len(ev.proc)
    if n == 0:
        return [], 0.0, []
    procs = np.concatenate([ev.dst_proc, ev.src_proc])
    ips = np.concatenate([ev.dst_ip, ev.src_ip])
    inv, first = group(procs, ips)
    m = len(first)
    # Symbolize the instructions by volume, the busiest first; the long tail keeps its
    # address as its site.
    vol = np.bincount(inv, weights=np.concatenate([wk["all"], wk["all"]]), minlength=m)
    named = set(np.argsort(-vol, kind="stable")[: max(4 * opts.top_sites, 2000)].tolist())
    keys = [(int(procs[f]), int(ips[f])) for f in first]
    names.code([k for j, k in enumerate(keys) if k[1] and j in named])
    site_id = np.full(m, -1, dtype=np.int64)
    ids: dict[tuple, int] = {}
    rows: list[dict] = []
    unnamed: set[int] = set()  # rows of code outside every module, no perf map naming it
    unnamed_procs: set[int] = set()
    for j, (p, a) in enumerate(keys):
        if not a:
            continue
        if j in named:
            s = names.site(p, a)
            key: tuple = (s["function"], s["file"], s["line"])
        else:
            s = {"function": f"{a:#x}", "file": "", "line": 0}
            key = ("ip", p, a)
        if key not in ids:
            ids[key] = len(rows)
            rows.append(dict(s, all=0.0, true=0.0, false=0.0, address=f"{a:#x}"))
        site_id[j] = ids[key]
        if j in named and s["function"] == f"{a:#x}" and names.sym(p) is not None:
            unnamed.add(ids[key])
            unnamed_procs.add(p)
    dst, src = site_id[inv[:n]], site_id[inv[n:]]
    own = dst >= 0
    extra = (src >= 0) & (src != dst)
    e_idx = np.concatenate([np.flatnonzero(own), np.flatnonzero(extra)])
    sid = np.concatenate([dst[own], src[extra]])
    for k, v in wk.items():
        if k not in KINDS:
            continue
        tot = np.bincount(sid, weights=v[e_idx], minlength=len(rows))
        for r, x in zip(rows, tot.tolist()):
            r[k] = float(x)
    callers = np.concatenate([ev.dst_caller[own], ev.src_caller[extra]])
    cproc = np.concatenate([ev.dst_proc[own], ev.src_proc[extra]])
    site_callers(rows, "callers", sid, cproc, callers, wk["all"][e_idx], lambda r: r["all"], names)
    total = sum(r["all"] for r in rows)
    share = sum(rows[i]["all"] for i in unnamed) / total if total > 0 else 0.0
    pids = [f"pid {names.run.procs[p].pid}" for p in sorted(unnamed_procs)]
    rows.sort(key=lambda r: (-r["all"], -r["false"]))
    return rows[: opts.top_sites], share, pids


# The share of the code sites' volume at code no module holds and no perf map names, from
# which the report says how to name it.
JIT_NOTE_MIN = 0.1

ADVICE_MIN_DETECTIONS = 10
# The share of the traps whose access was not decoded from which a note says so.
GUESSED_NOTE = 0.1
# An object in lock code no larger than this is one lock, not an array of them (glibc's
# pthread_mutex_t: 40 bytes; rwlock 56; a C++ std::mutex wraps the former).
LOCK_MAX = 64
# The same few locks taken by every thread (a queue's mutex and condition variables): how
# many named locks at most, and the threads' locks in common at least (_same_locks).
SAME_LOCKS_MAX = 4
COND_FIELDS = ("__wseq", "__g1_start", "__g_refs", "__g_size", "__g1_orig_size", "__wrefs",
               "__g_signals")  # fmt: skip
SAME_LOCKS_SHARED = 0.5
# An object whose false sharing is at least this much in one of its lines gets advice about
# that line only.
HOT_LINE_SHARE = 0.75
# Lines of an object with false sharing, further apart than this many lines per line on
# average: unrelated places of one large object (not one array), advised one at a time.
SCATTERED_LINES = 4
# ... and from this many such lines, none with this share of the object's false sharing:
# the same memory swept by the threads at once, not places of their own.
DIFFUSE_LINES = 32
DIFFUSE_SHARE = 0.1
# The false share of an object's volume from which it gets advice: a lock array or a queue
# whose head and tail share a line is half true sharing (the lock, the index itself), and
# padding still removes the other half (sysbench mutex: 47 % false).
ADVICE_MIN_FALSE = 0.25
# The hand-off note: at least this many samples on lines several threads use and one
# writes, with fewer detections than this share of them.
HANDOFF_MIN_SAMPLES = 200
HANDOFF_MAX_RATE = 0.02
# ... or one of its lines is, with at least this share of its false-sharing volume.
ADVICE_LINE_SHARE = 0.5
# An object whose false sharing is below this share of the largest object's gets no advice:
# one stray transfer next to millions (the exact backend counts every one) is not a finding.
ADVICE_MIN_SHARE = 0.01
# Exact counts: an object whose false sharing is below this share of the run's volume gets no
# advice (xz: 3 false transfers of 868 k got a line).
ADVICE_EXACT_MIN = 0.001
# A thread with less than this share of an object's false-sharing volume is left out of its
# advice (the main thread reading every worker's result once, after the joins).
ADVICE_THREAD_MIN = 0.02
# ... or than this share of an equal share, where that is less: with 64 threads sharing an
# array evenly, each has 1.6 % of its volume, and the advice named 7 of them.
ADVICE_THREAD_EQUAL = 0.25


# Source files in Fortran: its advice names Fortran's means (a padded array dimension, a
# reduction), not C's alignas.
FORTRAN_SOURCES = (".f", ".for", ".ftn", ".f77", ".f90", ".f95", ".f03", ".f08")


def _top_site(o: dict, names) -> dict | None:
    """The site (function, file, line) of the object's busiest false-sharing access."""
    if names is None or not o.get("_top_ip"):
        return None
    return names.site(*o["_top_ip"])


def _top_caller(o: dict, names) -> dict | None:
    """The site of the program's call that led to the object's busiest false-sharing access,
    when that access is in a system library (a lock function); else None."""
    if names is None or not o.get("_top_caller"):
        return None
    names.code([o["_top_caller"]])
    return names.site(*o["_top_caller"])


def _align(
    site: dict | None,
    line: int,
    size: int = 8,
    heap: str | None = None,
    fields: bool = False,
    elements: bool = False,
) -> str:
    """How the source's language aligns data to a line, in parentheses: C and C++
    alignas (for a malloc'd block, `heap` "malloc", with the block from aligned_alloc:
    malloc aligns to 16, and an aligned type in a malloc'd block is not on a line; C++'s
    operator new, "new", aligns to an over-aligned type since C++17), Rust's repr(align),
    Go's padding field ("" for Fortran, which has none). `fields`: what to pad is each
    field of a structure (alignas on the fields); `elements`: each element of an array
    inside a structure (`s.v[0]` beside `s.v[1]`), which only a type wrapped around it can
    pad."""
    ext = os.path.splitext(site["file"])[1].lower() if site is not None else ""
    if ext in FORTRAN_SOURCES:
        return ""
    if ext == ".rs":
        return f" (#[repr(align({line}))] on a wrapper type)"
    if ext == ".go":
        pad = max(line - size, 8)
        return f" (a `_ [{pad}]byte` field after each, or golang.org/x/sys/cpu.CacheLinePad)"
    where = "on each field" if fields else "in the type"
    lead = ""
    if elements:  # an element of a member array cannot take alignas: wrap each in a type
        lead, where = "an array of one-element structures, ", "in their type"
    if heap == "new":
        return f" ({lead}alignas({line}) {where}: operator new aligns its blocks to it, C++17)"
    if heap:
        return f" ({lead}alignas({line}) {where}, the block from aligned_alloc({line}, ...))"
    return f" ({lead}alignas({line}) {where})" if fields or elements else f" (alignas({line}))"


def _allocator(o: dict) -> str | None:
    """How a heap object's blocks were made, when not a mapping: "new" (C++ operator new,
    which aligns to the type's alignment), "malloc" (malloc and friends, aligned to 16
    only); else None."""
    if o["kind"] != "heap" or o.get("_mapped"):
        return None
    return "new" if o.get("_new") else "malloc"


def _is_fortran(site: dict | None) -> bool:
    """Whether `site` (_top_site) is in a Fortran source."""
    return site is not None and os.path.splitext(site["file"])[1].lower() in FORTRAN_SOURCES


# Code that only touches synchronisation words: glibc's mutexes, spin locks, rwlocks,
# condition variables and semaphores (inlined helpers lll_*, futex waits), OpenMP locks and
# critical sections (libgomp), C++ std::mutex. An object whose busiest false-sharing access
# is there holds locks next to each other.
LOCK_CODE = re.compile(
    r"pthread_(mutex|spin|rwlock|cond)_|(^|_)lll_|futex|(^|_)sem_(wait|post|timedwait)|"
    r"omp_(set|unset|test)_(nest_)?lock|gomp_(mutex|sem|ptrlock)|GOMP_critical|std::mutex::|"
    r"__gthread_mutex"
)


def _layout_of(o: dict, names):
    """The fields of an object (_layout_key), else None."""
    return _layout_by(o.get("_layout"), names)


def _layout_by(key: tuple | None, names):
    """The layout _layout_key describes, from `names`; for a stack whose recorded frames'
    locals took the same bytes in turn, the locals its accesses reached (_stack_locals)."""
    if not key or names is None:
        return None
    reached = getattr(names, "reached", {}).get(key)
    return reached if reached is not None else getattr(names, key[0])(*key[1])


def _layout_key(info: dict, name: str, names, loc=None, top_ip=None) -> tuple | None:
    """(the Names method, its arguments) that give an object's fields: a static's DWARF
    type (dwarf.Layout), a heap block's from the pointer its allocating line declares, a
    stack's from the locals of the frames its thread recorded (dwarf.StackLayout); else
    None. `loc`: a heap object's allocating site (_heap_name), when known; `top_ip` its
    busiest false-sharing access, whose source line names the member that clang's part of
    a promoted block is (_promoted_field)."""
    if info.get("addr"):
        part = _PROMOTED.fullmatch(info["name"])
        parts = getattr(names, "part_keys", {})
        if part and not info["name"].endswith(".body"):
            member = _promoted_field(top_ip, part.group("ptr"), names)
            if member:
                ptr, _, field = member.partition("->")
                key = "part_layout", (info["proc"], info["addr"], ptr, field)
                parts[info["proc"], info["addr"]] = key
                return key
        if (info["proc"], info["addr"]) in parts:
            return parts[info["proc"], info["addr"]]
        return "layout", (info["proc"], info["name"], info["addr"])
    if info.get("var"):
        return "tls_layout", (info["proc"], info["var"], info["tls"], info["tls_off"])
    if info.get("kind") == "stack":
        return "stack_layout", (info["proc"], info["tid"], info["lo"], info["size"], name)
    if info.get("kind") != "heap" or info.get("file") or info.get("mmap"):
        return None
    if loc is None:
        loc = _heap_name(info, names)[1]
    # The call that names the block (alloc_site: past the program's allocation wrappers,
    # through their inlining or the call stack): its return address and line.
    if not loc.get("pc"):
        return None
    return "heap_layout", (info["proc"], loc["pc"], loc.get("line") or 0, info.get("size") or 0)


def _pointer(layout) -> dict:
    """A heap object's `pointer`: what its allocating line declares or assigns its block to
    (`st`, `c->stats`, `ctr[i]`), where that names its fields."""
    return {"pointer": layout.name} if layout is not None and layout.name else {}


def _locals_text(o: dict, names, offs: list[int]) -> str:
    """What the stack offsets `offs` are: the locals the recorded frames name (`sums`, a
    local of main at pi.c:10), else a local nobody can name. Where locals of several frames
    took the same bytes in turn, the object's `locals` (resolved by the accesses' times)
    name them."""
    layout = _layout_of(o, names)
    found = {}
    for x in offs:
        v = layout.local(x) if layout is not None else None
        if v is not None:
            found.setdefault((v.name, v.lo), v)
        else:
            for w in o.get("locals", []):
                if w["offset"] <= x < w["offset"] + w["size"]:
                    found.setdefault((w["name"], w["offset"], w["function"]), w)
    if not found:
        return "a local variable other threads reach by its address"
    parts = [
        f"`{_attr(v, 'name')}`, a local of {_attr(v, 'function')}"
        + (f" at {_attr(v, 'decl')}" if _attr(v, "decl") else "")
        for v in list(found.values())[:2]
    ]
    more = ", ..." if len(found) > 2 else ""
    return f"{'; '.join(parts)}{more}, which other threads reach by its address"


def _attr(v, key: str):
    """A local's field, from a dwarf.Local or its JSON row."""
    return v[key] if isinstance(v, dict) else getattr(v, key)


def _stack_locals(
    names, key: tuple | None, offs: np.ndarray, times: np.ndarray, code: tuple
) -> list[dict]:
    """A stack object's locals that its accesses (offsets into the stack, at `times`, by
    the instructions `code`: (processes, addresses)) fall in, as the recorded frames name
    them (its dwarf.StackLayout by _layout_key `key`): [{name, function, decl, offset,
    size}]. Bytes that several frames' locals took in turn are named by the local of the
    frame recorded last before each access, or of the function the access ran in
    (StackLayout.at); where they did, the layout of the locals reached is the object's from
    then on (names.reached), for its lines' fields and its advice."""
    layout = _layout_by(key, names)
    if layout is None:
        return []
    found: dict[tuple, object] = {}
    offs = np.asarray(offs)
    order = np.argsort(offs, kind="stable")
    uo, first = np.unique(offs[order], return_index=True)
    bounds = [*first.tolist(), len(order)]
    # (the accesses' functions tell clashing locals apart: StackLayout.at)
    fns = names.functions(*code) if layout.timed else [""] * len(offs)
    for k, x in enumerate(uo[:LOCALS_LOOKED].tolist()):
        v = layout.local(int(x))
        if v is not None:
            found.setdefault((v.lo, v.name, v.function), v)
        else:
            sel = order[bounds[k] : bounds[k + 1]].tolist()
            for w in layout.at(int(x), {(int(times[i]), fns[i]) for i in sel}):
                found.setdefault((w.lo, w.name, w.function), w)
    if layout.timed:
        from locus.dwarf import StackLayout

        # (the reached locals' records with their times: where two of them still share
        # bytes, each access is told apart by its time, _fields_timed)
        timed = [(t, v) for t, v in layout.timed if (v.lo, v.name, v.function) in found]
        seen = {(w.lo, w.name, w.function) for _t, w in timed}
        rest = [v for k, v in found.items() if k not in seen]
        names.reached[key] = StackLayout(
            layout.name,
            layout.base,
            rest + [v for _t, v in timed],
            [0] * len(rest) + [t for t, _v in timed],
        )
    return [
        {
            "name": v.name,
            "function": v.function,
            "decl": v.decl,
            "offset": v.lo - layout.base,
            "size": v.size,
        }  # fmt: skip
        for _lo, v in sorted(found.items())
    ]


LOCALS_LOOKED = 4096  # distinct stack offsets looked up for a stack object's locals


def _same_locks(o: dict, names, per: dict[int, Counter]) -> bool:
    """Whether the threads take the same few locks of the object (a queue's mutex and two
    condition variables, taken by every thread at every item), by the locks' names in the
    static variable's DWARF type (`q.lock` of `q.lock.__data.__lock`): at most
    SAME_LOCKS_MAX of them, the threads' sets of them alike (mean pairwise shared over
    either's at least SAME_LOCKS_SHARED). An array of locks, each thread at its own or at
    random ones, names many (`locks[3]`); without DWARF (a heap block) it is not known."""
    layout = _layout_of(o, names)
    if not layout:
        return False
    sets = [{lk for x in c if (lk := lock_of(layout.field(x)))} for c in per.values()]
    every = set().union(*sets)
    pairs = [(a, b) for i, a in enumerate(sets) for b in sets[i + 1 :] if a | b]
    if not every or len(every) > SAME_LOCKS_MAX or not pairs:
        return False
    # A condition variable among them (glibc's pthread_cond_t fields): a queue's waits and
    # signals under its mutex. Two mutexes the threads take by turns, each its own at any
    # moment, read alike over the run, and padding them apart does help.
    offs = (x for c in per.values() for x in c)
    if not any(f in layout.field(x) for x in offs for f in COND_FIELDS):
        return False
    return sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs) >= SAME_LOCKS_SHARED


def _in_omp_region(site: dict | None) -> bool:
    """Whether a code site (_top_site) is in the body of an OpenMP region (dwarf's names of
    the outlined functions: gcc's `main._omp_fn.0`, clang's `.omp_outlined.`)."""
    return site is not None and omp_outlined(site.get("function") or "")


ONE_DIMENSION = re.compile(r"^[^\[]*\[(\d+)\]$")


def _omp_reduction(o: dict, names, site: dict | None, offs: list[int], fortran: bool) -> str:
    """For words that threads update in turn inside an OpenMP region (a histogram's bins
    under `omp atomic`): ": an OpenMP reduction, reduction(+: hist[:16])" where the words
    are one array variable's (C, C++; Fortran reduces a whole array, `reduction(+: hist)`),
    ": an OpenMP reduction" otherwise; "" outside OpenMP regions."""
    if not _in_omp_region(site):
        return ""
    layout = _layout_of(o, names)
    var = n = None
    if layout is not None and hasattr(layout, "local"):
        # (the array among the locals reached: clang's region also reads the pointers it
        # was handed, `data`, from the caller's frame beside it)
        found = {v.name: v for x in offs if (v := layout.local(x))}
        arrays = [
            (v.name, m.group(1))
            for v in found.values()
            if (m := ONE_DIMENSION.match(v.layout.type))
        ]
        if len(arrays) == 1:
            var, n = arrays[0]
    elif layout is not None and o["kind"] == "static":
        var, m = layout.name, ONE_DIMENSION.match(layout.type)
        n = m.group(1) if m else None
    if var and fortran:
        return f": an OpenMP reduction, reduction(+: {var})"
    if var and n:
        return f": an OpenMP reduction, reduction(+: {var}[:{n}]) (OpenMP 4.5)"
    return ": an OpenMP reduction"


def _bit_fields(o: dict, names, offs: list[int]) -> bool:
    """Whether every false-sharing offset of the object is in a bit field (its DWARF
    type: a static variable)."""
    layout = _layout_of(o, names)
    return bool(layout and offs and hasattr(layout, "bit_field")) and all(
        layout.bit_field(x) for x in offs
    )


def _lock_fields(o: dict, names, offs: list[int]) -> bool:
    """Whether the object's false-sharing offsets are mostly in a libc lock's private fields
    (`q.not_full.__data.__g1_orig_size`, by the static variable's DWARF type)."""
    layout = _layout_of(o, names)
    if not layout or not offs:
        return False
    fields = [layout.field(x) for x in offs]
    return sum(".__data." in f or "__lock" in f for f in fields) * 2 > len(fields)


# The bytes of one lock of each kind (glibc, x86-64), by its code's name: the most that its
# words span on a line that holds one lock.
LOCK_BYTES = (
    ("pthread_mutex_", 40),
    ("lll_", 40),
    ("std::mutex", 40),
    ("__gthread_mutex", 40),
    ("pthread_rwlock_", 56),
    ("pthread_cond_", 48),
    ("sem_", 32),
)


# ... and the least share of their false volume whose two accesses are both in the object
# for the locks' words to be what passes (nor may another object have false sharing on
# their lines): a lock whose line also holds a flag other threads read (`s.m2` beside
# `phase`) shares that line with the flag, which padding removes.
LOCK_OWN_MIN = 0.75


def _lock_bytes(lock: str) -> int:
    """The size of the lock `lock` (_lock_code) takes: LOCK_BYTES, else a 4-byte word
    (spinlocks, futexes, libgomp's locks)."""
    return next((n for k, n in LOCK_BYTES if k in lock), 4)


def _lock_instance(field: str) -> str | None:
    """The lock a DWARF field path is in: the path before glibc's private members
    (`s.m1.__data.__kind` -> `s.m1`, `locks[3].mutex.__data.__lock` -> `locks[3].mutex`);
    None when the path names no lock's member."""
    parts = field.split(".")
    at = next((i for i, p in enumerate(parts) if p.startswith("__")), 0)
    return ".".join(parts[:at]) if at else None


def _lock_a_line(acc, size: int, layout=None) -> bool:
    """Whether each line of the false-sharing accesses `acc` ((thread, offset, length, line
    index, weight)) holds one lock's words only. With the object's DWARF `layout`, by the
    lock each offset's field is in: `s.m1.__data.__kind` and `s.m2.__data.__lock`, 24 bytes
    apart, are two locks. Without it, by the bytes accessed on each line spanning at most a
    lock's `size`: two adjacent mutexes' lock words are 40 bytes apart; a lock padded to
    lines of its own spans its own words only."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    locks: dict[int, set] = {}
    for _t, off, ln, li, _w in acc:
        lo[li] = min(lo.get(li, off), off)
        hi[li] = max(hi.get(li, off + ln), off + ln)
        if layout is not None:
            locks.setdefault(li, set()).add(_lock_instance(layout.field(off)))
    if locks and all(None not in s for s in locks.values()):
        return all(len(s) == 1 for s in locks.values())
    return bool(lo) and all(hi[li] - lo[li] <= size for li in lo)


def _lock_code(site: dict | None) -> str | None:
    """The lock function `site` (_top_site) is in, else None."""
    if site is None:
        return None
    func = site["function"] or ""
    return func if LOCK_CODE.search(func) else None


def _fortran_padding(o: dict, line: int, size: int, names=None) -> str:
    """How to give each thread's element its own line, in Fortran (no alignas)."""
    n = max(line // max(size, 1), 1)
    local = o.get("locals") or []
    var = (
        o["name"].rsplit("::", 1)[-1]
        if o["kind"] == "static"
        else local[0]["name"]
        if len(local) == 1
        else "a"
    )
    layout = _layout_of(o, names)
    if layout is not None and layout.type.startswith("COMMON /"):
        # A COMMON block's symbol (`cblock_`) is not a name in the source: its member is.
        acc = o.get("_false_accesses") or []
        off = acc[0][1] if acc else 0
        var = layout.field(off).split("(", 1)[0] or var
        return (
            f"give each thread's element its own {line}-byte line (declare {n} per thread, "
            f"{var}({n}, nthreads) in {layout.type}, and use {var}(1, t)) or accumulate in a "
            "private variable (an OpenMP reduction)"
        )
    return (
        f"give each thread's element its own {line}-byte line (declare {n} per thread, "
        f"{var}({n}, nthreads), and use {var}(1, t)) or accumulate in a private variable "
        "(an OpenMP reduction)"
    )


def _timed_fields(
    layout, fa: np.ndarray, times: np.ndarray, weights: np.ndarray, names, code: tuple
):
    """Of a stack whose recorded frames' locals took the same bytes in turn (its layout has
    `timed` records): each thread's false-sharing weight by the element each access reached
    at its time, or in its function (rows of `fa`: thread, offset, ...; `code`: their
    instructions' processes and addresses), for _fields_of; else None."""
    if layout is None or not getattr(layout, "timed", None):
        return None
    per: dict[int, Counter] = {}
    fns = names.functions(*code)
    _u, fid = np.unique(fns.astype(str), return_inverse=True)
    inv, first = group(fa[:, 0], fa[:, 1], times.astype(np.int64), fid.reshape(-1))
    w = np.bincount(inv, weights=weights, minlength=len(first))
    for (t, off), tm, fn, x in zip(
        fa[first, :2].tolist(), times[first].tolist(), fns[first].tolist(), w.tolist()
    ):
        for f in layout.fields_at(off, [(tm, fn)]):  # (offsets are >= 0 here: `inside`)
            per.setdefault(t, Counter())[f] += x
    return per


def _thread_fields(o: dict, layout, t: int, offs: Counter) -> list[str]:
    """The fields of object o (its layout) that thread t's false-sharing accesses reached,
    most weight first: each offset's (`offs`: weight by offset), or, for a stack whose
    frames' locals took the same bytes in turn, those its accesses' times name
    (_timed_fields). Bytes the type says nothing of read as the variable's name (a stack's,
    between its named locals): left out."""
    timed = o.get("_timed_fields")
    weight: Counter = Counter()
    if timed is not None:
        weight.update(timed.get(t, {}))
    else:
        for off, w in offs.items():
            weight[layout.field(off)] += w
    return sorted((f for f in weight if f != layout.name), key=lambda f: (-weight[f], f))


def _fields_of(o: dict, names, per: dict[int, Counter]) -> str:
    """` (thread 1 stats[0].hits; thread 2 stats[0].misses)`: the fields each thread
    accessed (FIELDS_THREADS threads, two fields each, the most false sharing first), from
    the static variable's DWARF type; "" without one, or when the type says no more than
    the variable's name. A stack whose frames' locals took the same bytes in turn names them
    by the accesses' times (_timed_fields)."""
    layout = _layout_of(o, names)
    if layout is None:
        return ""
    parts = []
    for t in sorted(per)[:FIELDS_THREADS]:
        fields = _thread_fields(o, layout, t, per[t])
        if not fields:
            return ""
        shown = ", ".join(fields[:2]) + (", ..." if len(fields) > 2 else "")
        parts.append(f"thread {t} {shown}")
    more = ", ..." if len(per) > FIELDS_THREADS else ""
    return f" ({'; '.join(parts)}{more})"


FIELDS_THREADS = 4  # threads whose fields the advice lists


def _padded_element(o: dict, names, per: dict[int, Counter], line: int) -> str:
    """' `struct stats`': the element type of a static array of structures smaller than a
    line (from DWARF) when each thread's fields are in elements no other thread's are in, so
    that padding that type separates the threads; "" otherwise (the fields are what to pad)."""
    layout = _layout_of(o, names)
    shift = 0  # the variable's offset in the object: a stack's local's
    if layout is not None and hasattr(layout, "local"):
        found = {v.lo: v for offs in per.values() for x in offs if (v := layout.local(x))}
        if len(found) != 1:
            return ""
        (v,) = found.values()
        layout, shift = v.layout, v.lo - layout.base
    e = layout.element() if layout is not None else None
    if e is None or e[1] >= line:
        return ""
    owner: dict[int, int] = {}
    for t, offs in per.items():
        for idx in {(off - shift) // e[1] for off in offs if off >= shift}:
            if owner.setdefault(idx, t) != t:
                return ""
    return f" `{e[0]}`"


# A field that is an element of an array member: `s.v[1]`, `p->m[0][3]` (the member `v`, `m`).
MEMBER_ELEMENT = re.compile(r"(?:\.|->)([A-Za-z_]\w*)(?:\[\d+\])+$")


def _member_fields(o: dict, names, per: dict[int, Counter]) -> str:
    """What to pad when the threads' bytes are fields of a structure (`pp->a`, `s.b`,
    `st[0].misses` where two threads share an element) by the object's DWARF layout: each
    field (" field"), not the structure; each element of one array member (" element of
    `v`": `s.v[0]` beside `s.v[1]`); "" when they are not fields of a structure."""
    layout = _layout_of(o, names)
    if layout is None:
        return ""
    fields = {layout.field(x) if x >= 0 else "" for offs in per.values() for x in offs}
    if not fields or not all("." in f or "->" in f for f in fields):
        return ""
    arrays = {m.group(1) if (m := MEMBER_ELEMENT.search(f)) else None for f in fields}
    if len(arrays) == 1 and None not in arrays:
        return f" element of `{arrays.pop()}`"
    return " field"


def _element_size(acc, line: int) -> int:
    """The bytes each thread spans (first accessed byte to last), when every thread spans
    the same number and it fits a line: the size of a per-thread element such as a struct
    of counters; 0 otherwise."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for t, off, ln, *_rest in acc:
        lo[t] = min(lo.get(t, off), off)
        hi[t] = max(hi.get(t, off + ln), off + ln)
    spans = {hi[t] - lo[t] for t in lo}
    if len(spans) != 1:
        return 0
    span = spans.pop()
    return span if 0 < span <= line else 0


def _per_thread(acc) -> tuple[dict[int, Counter], Counter]:
    """Of the false-sharing accesses `acc` ((thread, offset, size, line index, weight)):
    each thread's weight by offset, and how many accesses had each size."""
    per: dict[int, Counter] = {}
    sizes: Counter = Counter()
    for t, off, ln, _li, w in acc:
        per.setdefault(t, Counter())[off] += w
        sizes[ln] += 1
    return per, sizes


def _main_threads(per: dict[int, Counter]) -> dict[int, Counter]:
    """The threads with at least ADVICE_THREAD_MIN of the weight, or ADVICE_THREAD_EQUAL of
    an equal share where that is less (many threads: 64 sharing an array evenly have 1.6 %
    each): a thread with a sliver of it (the main thread reading the results once after the
    joins) is not one the advice is about."""
    weight = {t: sum(c.values()) for t, c in per.items()}
    total = sum(weight.values())
    least = min(ADVICE_THREAD_MIN, ADVICE_THREAD_EQUAL / max(len(per), 1)) * total
    return {t: c for t, c in per.items() if weight[t] >= least}


def _cyclic(per: dict[int, Counter], sizes: Counter, acc, line: int) -> bool:
    """Whether the false-sharing accesses `acc` (per thread and sizes: _per_thread) are
    each thread's own elements of one array in turn (_interleave), each thread at more than
    one place in the lines: a cyclic distribution, advised as such, not as a sweep by every
    thread."""
    if len(per) < 2 or not sizes:
        return False
    # (each thread at several places in the lines: the same two fields in many objects, a
    # database's locks each beside another, are not an array dealt out)
    if any(len({off % line for off in c}) < 2 for c in per.values()):
        return False
    return bool(_interleave(per, sizes.most_common(1)[0][0], sorted({r[1] for r in acc}), line))


def _interleave(per: dict, size: int, offs: list[int], line: int) -> int:
    """k when k threads each access elements of `size` bytes k apart (thread offsets all
    congruent modulo k x size, a different residue each) across more than two lines: a
    cyclic distribution of an array; 0 otherwise."""
    k = len(per)
    step = k * size
    if k < 2 or size <= 0 or step > line or offs[-1] - offs[0] < 2 * line:
        return 0
    residues = []
    for o in per.values():
        r = {off % step for off in o}
        if len(r) != 1 or len(o) < 2:
            return 0
        residues.append(r.pop())
    return k if len(set(residues)) == k else 0


def _ordinal(k: int) -> str:
    """2 -> '2nd', 11 -> '11th', 23 -> '23rd'."""
    if 11 <= k % 100 <= 13:
        return f"{k}th"
    return f"{k}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th') }"


def _advice(objects: list[dict], cfg: dict, names=None, limit: int = 5) -> list[str]:
    """One plain-language line per top false-sharing object. A sampled object needs
    ADVICE_MIN_DETECTIONS detections: advice from one or two samples would be noise; any
    object needs ADVICE_MIN_SHARE of the largest false-sharing volume, and two threads
    accessing it (the accesses of the other side may fall outside the object). The means
    are Fortran's where the busiest access is in a Fortran source (names: the symbolizer)."""
    out = []
    alone: list[tuple[dict, int]] = []
    line = cfg["line_size"]
    top = max((o["false"] for o in objects if o["kind"] != "unknown"), default=0.0)
    run_all = sum(o["all"] for o in objects)
    for o in objects:
        if len(out) >= limit:
            break
        if o["false"] <= 0 or o["kind"] == "unknown":
            continue
        if o["false"] < ADVICE_MIN_FALSE * o["all"] and not o.get("_false_line"):
            continue
        if o["false"] < ADVICE_MIN_SHARE * top:
            continue
        if not o.get("rse", 0) and o["false"] < ADVICE_EXACT_MIN * run_all:
            # Counted (exact): a handful of transfers beside hundreds of thousands.
            continue
        if o.get("rse", 0) and o["rse"] ** -2 < ADVICE_MIN_DETECTIONS - 1e-9:
            continue
        acc = o["_false_accesses"]
        if not acc:
            continue
        # Most of a large object's false sharing in one of its lines (a queue's head and
        # tail beside its ring): the advice is about that line.
        by_line: Counter = Counter()
        for _t, _off, _ln, li, w in acc:
            by_line[li] += w
        hot, hot_w = by_line.most_common(1)[0]
        # Lines far apart in a large object (the locks and counters of a database's shared
        # memory, 140 MB): "adjacent fields at offsets 17156-142944660" is no advice; the
        # busiest line is, with how many others there are.
        at = {off // line for _t, off, _ln, _li, _w in acc}
        spread = max(at) - min(at) + 1 if at else 0
        scattered = len(by_line) > 1 and spread > SCATTERED_LINES * len(by_line)
        # (each thread's own elements in turn over a large block: the cyclic advice, on
        # all of its lines, not one line's)
        per, sizes = _per_thread(acc)
        cyclic = scattered and _cyclic(per, sizes, acc, line)
        focus = (
            len(by_line) > 1
            and not cyclic
            and (hot_w >= HOT_LINE_SHARE * sum(by_line.values()) > 0 or scattered)
        )
        total_w = sum(by_line.values())
        if (
            scattered
            and not cyclic
            and len(by_line) >= DIFFUSE_LINES
            and hot_w < DIFFUSE_SHARE * total_w
        ):
            # Many lines far apart, none standing out: the threads sweep the same memory at
            # once (each memsets or copies it, or loops over the whole array), which
            # padding one line does not part (stress-ng memthrash read "pad each to 64
            # bytes" for the busiest of 171 lines with 1 % of it).
            who = sorted(_main_threads(per))
            verb = "write" if o["_false_stores"] else "access"
            most = 100 * hot_w / total_w
            most_text = f"more than {most:.0f} %" if most >= 1 else "even 1 %"
            out.append(
                f"threads {_ranges(who)} {verb} {len(by_line)} lines of {_quoted(o)}"
                f"{_declared(o, names)} spread over {nbytes(spread * line)} of it, none with "
                f"{most_text} of its false sharing: they work "
                "over the same memory at the same time (each sweeps or copies it: the code "
                "sites say where), which padding cannot part; give each thread its own part "
                f"of it, in whole {line}-byte lines, or let one thread do that work"
            )
            continue
        if focus:
            acc = [r for r in acc if r[3] == hot]
            per, sizes = _per_thread(acc)
        big = _main_threads(per)
        if len(big) >= 2:
            acc = [r for r in acc if r[0] in big]
            per = big
        if len(per) < 2 and o.get("_victim") and o.get("_victim_reads"):
            # One thread only reads it, and writes beside it move its line.
            victim = _quoted(o) + _declared(o, names)
            out.append(_victim_advice(o, objects, _ranges(list(per)), victim, line, names))
            continue
        if len(per) < 2:
            # One thread's variable: its false sharing is with a neighbour on its line
            # (two counters side by side), said below for both.
            alone.append((o, next(iter(per))))
            continue
        # Each thread's own bytes: no two threads write the same offsets (what they only
        # read, another thread's field read once, does not make a field shared).
        wr: dict[int, set] = {}
        hot_at = {off // line for _t, off, _ln, _li, _w in acc} if focus else None
        for u, x in o.get("_false_written", ()):
            if u in per and (hot_at is None or x // line in hot_at):
                wr.setdefault(u, set()).add(x)
        if len(wr) == 1 and (beside := _read_beside(o, names, per, wr, line)):
            # One thread writes, the others only read other fields of the line.
            out.append(beside)
            continue
        writers = len(wr) >= 2  # every thread named below writes its bytes
        if len(wr) < 2:  # fewer than two writers: what the threads access
            wr = {t: set(c) for t, c in per.items()}
        elif len(wr) < len(per):
            # Threads that only read beside two or more writers (results read after the
            # joins) are not whom the padding is for.
            per = {t: c for t, c in per.items() if t in wr}
            acc = [r for r in acc if r[0] in per]
        own = all(not (wr[a] & wr[b]) for a in wr for b in wr if a < b)
        thr = _ranges(list(per))
        if o["_sibling"][0] >= SIBLING_BLOCKS and o["kind"] == "heap":
            out.append(_sibling_advice(o, thr, line))
            continue
        if o["_handoff"] >= HANDOFF_ADVICE and o["true"] >= HANDOFF_TRUE * o["all"]:
            out.append(_handoff_advice(o, thr, line))
            continue
        offs = sorted({r[1] for r in acc})
        size = sizes.most_common(1)[0][0]
        # (a reader left out, the main thread summing results after the joins, does not
        # make the writers' advice "access")
        verb = "write" if o["_false_stores"] or writers else "access"
        name = _quoted(o) + _declared(o, names)
        if o.get("_victim") and not own:
            out.append(_victim_advice(o, objects, thr, name, line, names))
            continue
        java = o["kind"] == "heap" and o["name"].startswith("Java heap")
        arena = o["kind"] == "heap" and (o["name"].startswith("Go heap arena") or java)
        if (o["kind"] == "stack" or arena) and o.get("_stack_lo") is not None:
            # Offsets into a stack (or a Go or Java heap) of megabytes mean nothing: the
            # addresses, and what they are.
            lo = o["_stack_lo"]
            span = (
                f"{lo + offs[0]:#x}-{lo + offs[-1]:#x}" if len(offs) > 1 else f"{lo + offs[0]:#x}"
            )
            what = (
                f"a {'Java object' if java else 'Go value'}: the code sites say which"
                if arena
                else _locals_text(o, names, offs)
            )
            where = f"at {span} ({what})"
        else:
            where = f"at offsets {offs[0]}-{offs[-1]}" if len(offs) > 1 else f"at offset {offs[0]}"
        if focus:
            pct = 100 * hot_w / sum(by_line.values())
            where += f", the {line}-byte line with {pct:.0f} % of its false sharing"
            if scattered:
                where += (
                    f" (the busiest of {len(by_line)} such lines, spread over "
                    f"{nbytes(spread * line)} of it: each is a case of its own)"
                )
        where += _fields_of(o, names, per)
        shared, seen, handed = o["_shared_words"]
        share = f"{100 * o['false'] / o['all']:.0f} % of its volume"
        site = _top_site(o, names)
        caller = _top_caller(o, names)
        # The program's language from its own call when the access is in a library.
        fortran = _is_fortran(caller or site)
        align = JAVA_ALIGN if java else _align(caller or site, line, size, heap=_allocator(o))
        lock = _lock_code(site)
        if lock is not None and caller is not None:
            lock += f", called from {_site_str(caller)}"
        inside = lock is not None or _lock_fields(o, names, offs)
        if inside and not own and o.get("size", 0) > LOCK_MAX and _same_locks(o, names, per):
            # The same locks taken by every thread (a queue's mutex and condition
            # variables, beside what they guard): their words and the data pass between the
            # threads at every hand-over. Padding them apart adds a line to each hand-over
            # (a queue padded so ran 1.4-1.7x slower); fewer hand-overs remove it.
            how = f" (in {lock})" if lock else ""
            out.append(
                f"threads {thr} take the same locks in {name} {where}{how}: their words, and "
                f"the data they guard, pass between the threads at every hand-over ({share} "
                "reads as false sharing, different words of the same locks): that is "
                "contention, which padding does not remove (it adds a line to every "
                "hand-over); hand over less often (batch the work a lock protects), or split "
                "it between locks that different threads take (--lens locks measures the "
                "waits)"
            )
            continue
        if lock is not None and not own and o.get("size") and o["size"] <= LOCK_MAX:
            # One lock (a pthread_mutex_t is 40 bytes), every thread at the same words: its
            # fields (the lock word, the owner, the waiters) move between the threads that
            # take it. That is contention, and padding cannot remove it.
            out.append(
                f"threads {thr} take the one lock {name} {where} (in {lock}): its words (the "
                f"lock, its owner) pass between them at every acquisition ({share} reads as "
                "false sharing, different words of one lock): that is the lock's contention, "
                "which padding does not remove; hold it less, or split what it protects "
                "(--lens locks measures the waits)"
            )
            continue
        if (
            lock is not None
            and not own
            and _lock_a_line(acc, _lock_bytes(lock), _layout_of(o, names))
            and o.get("_false_own", 1.0) >= LOCK_OWN_MIN
            and not _line_mates(o, objects)
        ):
            # Locks padded apart already (sysbench mutex's 296-byte elements, every thread
            # at random ones): each line's words are one lock's, which its takers pass on.
            out.append(
                f"threads {thr} take locks of {name} {where} (in {lock}) that each have a line "
                f"of their own: a lock's words (the lock, its owner) pass between the threads "
                f"that take it ({share} reads as false sharing, different words of one lock): "
                "that is the locks' contention, which padding does not remove; hold them less, "
                "or spread the work over more locks (--lens locks measures the waits)"
            )
            continue
        if lock is not None:
            true = (
                "; the true part is each lock passing between the threads that take it (its "
                "contention: --lens locks)"
                if o["true"] > 0
                else ""
            )
            out.append(
                f"threads {thr} use different locks that share {line}-byte lines in {name} "
                f"{where} (in {lock}): taking one moves its neighbours' line too (false "
                f"sharing, {share}); give each lock its own {line}-byte line{align}, or pad "
                f"the element that holds it to {line} bytes{true}"
            )
        elif shared >= SHARED_WORDS_MIN:
            out.append(
                f"threads {thr} {verb} neighbouring {size}-byte words of {name} {where} at "
                f"the same time (false sharing, {share}) and the same words at other times "
                f"(true sharing: {shared} of {seen} {'sampled ' if o.get('rse') else ''}words "
                "used by two threads): "
                f"padding each word to {line} bytes{align} removes the false "
                + (
                    "part; the true part is data one thread writes and others read (a "
                    "queue's slots and indices, a flag: the hand-over itself), which only "
                    "fewer hand-overs reduce (hand over in batches of whole lines)"
                    if sum(handed.values()) * 2 > shared
                    else "part; the true part needs fewer threads on the same words (give "
                    "each thread its own block of whole lines, or a private copy combined at "
                    f"the end{_omp_reduction(o, names, site, offs, fortran)})"
                )
            )
        elif own and _bit_fields(o, names, offs):
            # Bit-fields of one storage unit: alignas cannot reach them, and C makes the
            # unit one memory location (concurrent writes to it are a data race).
            out.append(
                f"threads {thr} {verb} different bit-fields of {name} {where} (false "
                f"sharing, {share}): a bit-field cannot be padded, and bit-fields of one unit "
                "are one memory location in C (writing them from two threads is a data race): "
                f"make each thread's a field of its own (a whole integer), on a {line}-byte "
                f"line of its own{align}"
            )
        elif own and (k := _interleave(per, size, offs, line)):
            # A cyclic distribution (OpenMP schedule(static,1), i += nthreads): padding
            # every element would be wasteful; whole lines per thread remove it.
            chunk = max(line // max(size, 1), 1)
            how = f"schedule(static) in OpenMP, or a chunk size of at least {chunk} elements"
            out.append(
                f"threads {thr} {verb} interleaved {size}-byte elements of {name} {where}: "
                f"each thread every {_ordinal(k)} element (a cyclic distribution, as with "
                f"OpenMP schedule(static,1) or i += nthreads), so every {line}-byte line is "
                f"shared; give each thread contiguous blocks of whole lines instead ({how})"
            )
        elif own and fortran:
            out.append(
                f"threads {thr} {verb} adjacent {size}-byte elements of {name} {where}; "
                + _fortran_padding(o, line, size, names)
            )
        elif own:
            # Each thread's own element (struct) seen as several fields: name the element.
            elem = _element_size(acc, line)
            what = (
                f"{elem}-byte elements ({size}-byte fields)"
                if elem > size
                else f"{size}-byte fields"
            )
            each = _padded_element(o, names, per, line)
            if not each and not java and (each := _member_fields(o, names, per)):
                # Fields of one structure: alignas on each field, not on the type (on a
                # type around each element of an array member).
                align = _align(
                    caller or site,
                    line,
                    size,
                    heap=_allocator(o),
                    fields=each == " field",
                    elements=each != " field",
                )
                if each != " field" and elem <= size:
                    what = f"{size}-byte elements"
            # (inside an OpenMP region, the tutorials' `sum[id] += ...`: the better fix)
            omp = (
                "; or, where each thread only accumulates into its own, accumulate in a "
                "private variable and combine once at the end (an OpenMP reduction)"
                if _in_omp_region(site)
                else ""
            )
            out.append(
                f"threads {thr} {verb} adjacent {what} of {name} {where}; "
                f"pad each{each} to {line} bytes{align} or give each thread its own line{omp}"
            )
        elif mixed := _mixed_words(o, names, wr):
            # Per-thread fields beside a word they all write (a shared counter): padding
            # the per-thread fields is not enough, and the shared word is true sharing.
            mine, common, who = mixed
            out.append(
                f"threads {thr} write their own fields of {_quoted(o)} ({mine}) on the line of "
                f"{common}, which {who} write: the own fields share the line falsely "
                f"({share}), {common} truly; give each thread's field its own {line}-byte "
                f"line{align}, and {common} a line of its own (it still moves between the "
                "threads at every write: count per thread and combine at the end)"
            )
        else:
            out.append(
                f"threads {thr} {verb} different bytes of the same {line}-byte line(s) of "
                f"{name} {where}; separate what each thread writes onto its own line"
            )
    return out + _neighbours_advice(alone, line, names, limit - len(out))


def _read_beside(o: dict, names, per: dict[int, Counter], wr: dict[int, set], line: int):
    """Advice when one thread writes part of an object's line and the others only read
    other bytes of it (a read-mostly setting beside a hot counter in one struct): the
    readers are the victims, and what they read wants a line apart; None otherwise."""
    ((w, wo),) = wr.items()
    readers = sorted(t for t in per if t != w)
    read = {x for t in readers for x in per[t]}
    if not readers or not read or read & wo:
        return None
    share = f"{100 * o['false'] / o['all']:.0f} % of its volume"
    they = f"thread {readers[0]} only reads" if len(readers) == 1 else (
        f"threads {_ranges(readers)} only read"
    )  # fmt: skip
    written = _fields_text(o, names, sorted(wo), "bytes")
    shown = _fields_text(o, names, sorted(read), "bytes")
    of = "" if written.startswith("`") else f" of {_quoted(o)}"
    shared, _seen, handed = o.get("_shared_words") or (0, 0, {})
    layout = _layout_of(o, names)
    arrays = {
        re.sub(r"\[\d+\].*$", "", layout.field(x)) if "[" in layout.field(x) else None
        for x in (*wo, *read)
    } if layout else set()  # fmt: skip
    # (a queue's reader moves along the slots: one element read all along is a victim's,
    # `counter[1]` beside the `counter[0]` another thread bumps)
    moving = layout is not None and len({layout.field(x) for x in read}) > 1
    if (shared >= SHARED_WORDS_MIN and handed.get(w, 0) * 2 > shared) or (
        len(arrays) == 1 and None not in arrays and moving
    ):
        # What the readers read, the writer wrote before (a queue's slots: the writer
        # writes elements of the array the readers read): a hand-over, whose reader
        # reaches the line the writer is still filling.
        return (
            f"thread {w} writes {written}{of} beside {shown}, which {they} after thread {w} "
            "wrote them (data handed from one thread to another: a queue's slots): each "
            f"write takes the line from the reader{'s' if len(readers) > 1 else ''} (false "
            f"sharing, {share}); let the reader{'s' if len(readers) > 1 else ''} trail the "
            f"writer by whole {line}-byte lines (hand over in batches of a line or more), or "
            f"pad each element to {line} bytes"
        )
    return (
        f"thread {w} writes {written}{of} beside {shown}, which {they}: each "
        f"write takes the line from the reader{'s' if len(readers) > 1 else ''} (false "
        f"sharing, {share}); give what is only read a {line}-byte line apart from what is "
        "written (or a copy of it in each thread)"
    )


def _fields_text(o: dict, names, offs: list[int], what: str) -> str:
    """Offsets of an object named by its DWARF fields (a static variable's type), else by
    their range."""
    layout = _layout_of(o, names)
    fields = list(dict.fromkeys(layout.field(x) for x in offs)) if layout else []
    if fields and fields != [layout.name]:
        return ", ".join(f"`{f}`" for f in fields[:4]) + (", ..." if len(fields) > 4 else "")
    span = f"{offs[0]}-{offs[-1]}" if len(offs) > 1 else f"{offs[0]}"
    return f"{what} at offset{'s' if len(offs) > 1 else ''} {span}"


def _mixed_words(o: dict, names, wr: dict[int, set]) -> tuple[str, str, str] | None:
    """(own fields, shared words, who writes them) when two or more threads each write
    offsets no other thread writes and some offsets are written by several of them: per-
    thread fields beside a shared counter. Named by the static variable's DWARF type when
    there is one, else by offsets."""
    writers = Counter(x for offs in wr.values() for x in offs)
    common = sorted(x for x, n in writers.items() if n >= 2)
    own = sorted({x for offs in wr.values() for x in offs if writers[x] == 1})
    owners = sum(1 for offs in wr.values() if any(writers[x] == 1 for x in offs))
    if not common or owners < 2:
        return None
    n = max(writers[x] for x in common)
    who = "all of them" if n == len(wr) else f"{n} of them"
    return _fields_text(o, names, own, "bytes"), _fields_text(o, names, common, "the word"), who


def _quoted(o: dict) -> str:
    """An object as the advice names it: a static variable in backquotes (`stats`), a heap
    block or stack by its description."""
    if o.get("_var"):  # a thread-local variable: `tally` (thread-local, thread 2's copy)
        return f"`{o['_var']}`" + o["name"][len(o["_var"]) :]
    return f"`{o['name']}`" if o["kind"] == "static" else o["name"]


def _declared(o: dict, names) -> str:
    """ " (declared at s.c:5)" for a static variable whose DWARF says where (where to put
    the padding); "" otherwise."""
    layout = _layout_of(o, names) if o["kind"] == "static" else None
    decl = getattr(layout, "decl", "")
    return f" (declared at {decl})" if decl else ""


VICTIM_WRITERS_LOOKED = 16  # distinct write addresses looked up for a victim's writers


def _handoff_share(ev: Events, wk: dict, m: np.ndarray, fm: np.ndarray) -> float:
    """The share of an object's false volume that went to a reader's loads at a word where
    the same writer's stores also reached it as true sharing, on the same line: a flag the
    reader polls, which the writer sets after writing the payload beside it (a mailbox). The polls
    between the payload's store and the flag's take the line early (false sharing by the
    bytes), but the payload is read right after: on its own line it would move anyway, as a
    second miss. Classic false sharing (each thread at its own field) and a shared counter
    beside per-thread fields (the false transfers land on the fields, the true on the
    counter) have none."""
    if not len(fm):
        return 0.0
    tm = m[(ev.flags[m] & CE_TRUE) != 0]
    if not len(tm):
        return 0.0
    word = ev.dst_off // WORD
    true_keys = set(
        zip(ev.src[tm].tolist(), ev.dst[tm].tolist(), ev.line[tm].tolist(), word[tm].tolist())
    )
    keys = zip(ev.src[fm].tolist(), ev.dst[fm].tolist(), ev.line[fm].tolist(), word[fm].tolist())
    # Polled: loaded (a histogram's bins, incremented by every thread, are true and false
    # at the same words too, but by stores).
    loads = (ev.dst_flags[fm] & AC_STORE) == 0
    polled = np.array([k in true_keys for k in keys], dtype=bool) & loads
    total = float(wk["false"][fm].sum())
    return float(wk["false"][fm][polled].sum()) / total if total > 0 else 0.0


def _handoff_advice(o: dict, thr: str, line: int) -> str:
    """Advice for a hand-off whose polls read as false sharing (_handoff_share): padding
    would not remove a transfer, only add a miss on the payload."""
    return (
        f"threads {thr} hand data over through {_quoted(o)}: a reader polls a word the writer "
        f"sets (true sharing) while the writer's stores to its neighbours on the same "
        f"{line}-byte line take it away early ({100 * o['false'] / o['all']:.0f} % of the "
        "volume reads as false sharing); the neighbours are read after the flag, so padding "
        "them apart would not save a transfer but add a cache miss to every hand-over: keep "
        "the flag and its data on one line, and to move less, hand over less often (batch)"
    )


def _sibling_advice(o: dict, thr: str, line: int) -> str:
    """Threads each on their own block of one allocation site, the blocks packed on shared
    lines by the allocator: offsets in a block say nothing (every thread writes offset 0 of
    its own), and alignas cannot reach a malloc'd block."""
    share, gap = o["_sibling"]
    verb = "write" if o["_false_stores"] else "use"
    size = o.get("size") or 0
    what = f"{size}-byte blocks " if size else "blocks "
    name = o["name"]
    blocks = (
        f"heap blocks {name[len('heap block ') :]}"
        if name.startswith("heap block ")
        else f"blocks of {name}"
    )
    return (
        f"threads {thr} {verb} their own {blocks} "
        f"({what}{gap} bytes apart: the allocator packs small blocks on shared {line}-byte "
        f"lines; false sharing, {100 * o['false'] / o['all']:.0f} % of its volume, "
        f"{100 * share:.0f} % of it between blocks); allocate each thread's block on a "
        f"{line}-byte line of its own ("
        + (
            f"a type declared alignas({line}): operator new aligns its blocks to it, C++17"
            if o.get("_new")
            else f"aligned_alloc({line}, size rounded up to {line}), posix_memalign"
        )
        + f"), or keep the threads' data in one array with each element padded to {line} bytes"
    )


def _promoted_field(top_ip: tuple | None, ptr: str, names) -> str | None:
    """The field of what `ptr` points to that a part of clang's promoted block (`ptr.body.N`)
    is: the one `ptr->FIELD` (or `(*ptr).FIELD`, `ptr[0].FIELD`) that the source line of its
    busiest access (`top_ip`: process, address) names; None where the line names none, or
    several, or cannot be read."""
    if not top_ip or names is None:
        return None
    site = names.site(*top_ip)
    if not site.get("line"):
        return None
    proc, ip = top_ip[:2]
    text = names.source_text(proc, ip, site["line"]) if hasattr(names, "source_text") else ""
    p = re.escape(ptr)
    found = set(
        re.findall(rf"(?<![\w$.>]){p}\s*->\s*([A-Za-z_$][\w$]*)", text)
        + re.findall(rf"\(\s*\*\s*{p}\s*\)\s*\.\s*([A-Za-z_$][\w$]*)", text)
        + re.findall(rf"(?<![\w$.>]){p}\s*\[\s*0\s*\]\s*\.\s*([A-Za-z_$][\w$]*)", text)
    )
    return f"{ptr}->{found.pop()}" if len(found) == 1 else None


def _part_member(o: dict) -> str | None:
    """`st->hits`: the member clang's part of a promoted block is, as its layout key says
    (_layout_key found it from its busiest access's source line); None without one."""
    key = o.get("_layout")
    return f"{key[1][2]}->{key[1][3]}" if key and key[0] == "part_layout" else None


def _own_field(o: dict, t: int, names) -> str | None:
    """The field of object o that thread t's false-sharing accesses reached most (`sa.misses`),
    from its layout; None without one, or where the layout says no more than its name."""
    layout = _layout_of(o, names)
    if layout is None:
        return None
    per = _per_thread(o.get("_false_accesses") or [])[0]
    fields = _thread_fields(o, layout, t, per.get(t, Counter()))
    return fields[0] if fields else None


def _line_mates(o: dict, objects: list[dict]) -> list[dict]:
    """The other objects with false sharing on one of `o`'s false-sharing lines."""
    pid, lines = o.get("_false_lines") or (None, set())
    return [
        p for p in objects if p is not o and p.get("_false_lines") and p["_false_lines"][0] == pid
        and p["_false_lines"][1] & lines
    ]  # fmt: skip


def _victim_advice(o: dict, objects: list[dict], thr: str, name: str, line: int, names) -> str:
    """An object only read, on a line that writes to its neighbours keep moving."""
    near = _line_mates(o, objects)

    def label(p: dict) -> str:
        text = _quoted(p)
        # Two blocks from one line of code (a std::vector and its buffer): their sizes.
        return text + f" ({p['size']} bytes)" if p["name"] == o["name"] and p.get("size") else text

    named = [label(p) for p in near[:3]]
    # Static variables in backquotes, heap blocks by their description (as _quoted does).
    quoted = [w if w.startswith(HEAP_NAMES) else f"`{w}`" for w in o.get("_victim_writers", ())]
    named += [w for w in quoted if w not in named]
    who = ", ".join(named[:3])
    if any(p["name"] == o["name"] for p in near[:3]) and o.get("size"):
        name += f" ({o['size']} bytes)"
    share = f"{100 * o['false'] / o['all']:.0f} % of its volume" if o["all"] else ""
    fix = (
        "keep it apart from data that is written (another module or common block)"
        if _is_fortran(_top_site(o, names))
        else f"give it a {line}-byte line of its own"
        f"{_align(_top_site(o, names), line, heap=_allocator(o))}, or "
        "keep data that is only read apart from data that is written"
    )
    one = thr.isdigit()
    how, whom = ("only read", "the readers") if o.get("_victim_reads") else ("use", "them")
    if one:
        how, whom = ("only reads", "the reader") if o.get("_victim_reads") else ("uses", "it")
    return (
        f"thread{'' if one else 's'} {thr} {how} {name}, which shares {line}-byte lines with "
        "data other "
        f"threads write{' (' + who + ')' if who else ''}: each of those writes takes the line "
        f"from {whom} (false sharing, {share}); {fix}"
    )


def _neighbours_advice(alone: list, line: int, names, limit: int) -> list[str]:
    """Advice for variables each used by one thread that share a line (`hits_a` and
    `hits_b` side by side): no object alone shows two threads, the line does."""
    by_line: dict[tuple, list] = {}
    for o, t in alone:
        pid, lines = o["_false_lines"]
        for ln in lines:
            by_line.setdefault((pid, ln), []).append((o, t))
    out, said = [], set()
    for (_pid, ln), on_line in sorted(
        by_line.items(), key=lambda kv: -sum(o["false"] for o, _ in kv[1])
    ):
        members = list({id(o): (o, t) for o, t in on_line}.values())
        if len({t for _o, t in members}) < 2 or len(out) >= limit:
            continue
        key = frozenset(id(o) for o, _t in members)
        if key in said:
            continue
        said.add(key)
        members.sort(key=lambda ot: ot[1])
        # (clang's parts of the one block a static pointer is given: _promoted_note)
        parts = [_PROMOTED.fullmatch(o["name"]) for o, _t in members]
        promoted = {m.group("ptr") for m in parts if m}
        ptr = next(iter(promoted)) if all(parts) and len(promoted) == 1 else None
        fields = [_part_member(o) if ptr else _own_field(o, t, names) for o, t in members]
        each = ", ".join(
            f"{_quoted(o)} (thread {t}{', `' + f + '`' if f else ''})"
            for (o, t), f in list(zip(members, fields))[:FIELDS_THREADS]
        )
        more = f" and {len(members) - FIELDS_THREADS} more" if len(members) > FIELDS_THREADS else ""
        thr = _ranges([t for _o, t in members])
        total = sum(o["all"] for o, _t in members)
        share = (
            f"{100 * sum(o['false'] for o, _t in members) / total:.0f} % of their volume"
            if total
            else ""
        )
        fortran = _is_fortran(_top_site(members[0][0], names))
        made = {_allocator(o) for o, _t in members}
        heap = "malloc" if "malloc" in made else "new" if "new" in made else None
        named = [f for f in fields if f]
        fix = (
            "put them in different common blocks or modules, or pad between them"
            if fortran
            else f"they are fields of what `{ptr}` points to"
            + (f" ({', '.join(f'`{f}`' for f in named)})" if len(set(named)) > 1 else "")
            + f": pad each field to {line} bytes in its type (alignas({line}) on each field)"
            if ptr
            else f"align each to {line} bytes"
            f"{_align(_top_site(members[0][0], names), line, heap=heap)} or place them apart"
        )
        verb = "write" if all(o["_false_stores"] for o, _t in members) else "use"
        out.append(
            f"threads {thr} each {verb} their own variable, {each}{more}, and these share "
            f"the {line}-byte line {ln:#x} (false sharing, {share}): {fix}"
        )
    return out


def _unattributed(objects: list[dict]) -> dict | None:
    """Removes the `(unattributed)` rows (one per process) from `objects` and returns their
    sum: {all, true, false, detections, threads}, or None when every event has an object."""
    unk = [o for o in objects if o["kind"] == "unknown"]
    if not unk:
        return None
    objects[:] = [o for o in objects if o["kind"] != "unknown"]
    return {
        "all": sum(o["all"] for o in unk),
        "true": sum(o["true"] for o in unk),
        "false": sum(o["false"] for o in unk),
        "detections": sum(o["detections"] for o in unk),
        "threads": sorted({t for o in unk for t in o["threads"]}),
    }


def _strip_private(rows: list[dict]) -> None:
    """Drop the working columns (leading `_`) the advice needed."""
    for o in rows:
        for k in [k for k in o if k.startswith("_")]:
            del o[k]
