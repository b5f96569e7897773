"""Helpers the address-sampling lenses (comm, numa) share: the thread registry in creation
order, batched symbolization of code and data addresses, the heap blocks of allocs.bin and
the lookup of the block alive at an address and a time, and the CPU -> NUMA node map."""

from __future__ import annotations

import math
import os
import re

import numpy as np

from locus.rundir import (
    AL_FRAME,
    AL_FREE,
    AL_MALLOC,
    AL_MMAP,
    AL_MUNMAP,
    ALF_FILE,
    ALF_REMAP,
    ALF_TIMED,
    ALLOC_DTYPE,
    COMM_SAMPLE_DTYPE,
    PROC_FORKED,
    THREAD_MAIN,
    RunDir,
)
from locus.sysfs import cpu_node_map


class Threads:
    """Threads in creation order (process order, then serial); index 0 is the main thread
    of the first process. Threads seen only in events are appended."""

    def __init__(self, run: RunDir):
        self.proc: list[int] = []
        self.tid: list[int] = []
        self.routine: list[int] = []
        self.main: list[bool] = []
        self.index: dict[tuple[int, int], int] = {}
        for i, p in enumerate(run.procs):
            t = p.threads
            for tid, fl, rt in zip(
                t["tid"].tolist(), t["flags"].tolist(), t["start_routine"].tolist()
            ):
                self.add(i, tid, rt, bool(fl & THREAD_MAIN))

    def add(self, proc: int, tid: int, routine: int = 0, main: bool = False) -> int:
        key = (proc, tid)
        if key not in self.index:
            self.index[key] = len(self.tid)
            self.proc.append(proc)
            self.tid.append(tid)
            self.routine.append(routine)
            self.main.append(main)
        return self.index[key]

    def lookup(self, proc: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Thread index of each (proc, tid); unknown threads are added in first-seen order."""
        if len(tid) == 0:
            return np.zeros(0, dtype=np.int64)
        key = (proc.astype(np.uint64) << np.uint64(32)) | tid.astype(np.uint64)
        uk, first, inv = np.unique(key, return_index=True, return_inverse=True)
        for j in np.argsort(first, kind="stable"):
            k = int(uk[j])
            self.add(k >> 32, k & 0xFFFFFFFF)
        idx = np.array([self.index[(int(k) >> 32, int(k) & 0xFFFFFFFF)] for k in uk])
        return idx[inv.reshape(-1)].astype(np.int64)

    def __len__(self) -> int:
        return len(self.tid)


HEAP_LAYOUTS = 24  # heap objects a report reads the allocating line's DWARF for


class Names:
    """Code and data symbols, one symbolizer per process, batched."""

    def __init__(self, run: RunDir, opts):
        self.run = run
        self.opts = opts
        self.syms: dict[int, object] = {}
        self.code_cache: dict[tuple[int, int], object] = {}
        self.stack_layouts: dict[tuple[int, int, int], object] = {}
        # (comm: a stack's layout from the locals its accesses reached, by the layout's key,
        # where recorded frames' locals took the same bytes in turn)
        self.reached: dict[tuple, object] = {}
        self.frames: dict[int, np.ndarray] = {}  # a process's frame records (AL_FRAME)
        self.heap_keys: set[tuple] = set()  # the heap blocks heap_layout looked up
        # (comm: the layout key of clang's part of a promoted block, by (process, address):
        # found from its objects row's busiest access, used again for its lines)
        self.part_keys: dict[tuple[int, int], tuple] = {}

    def sym(self, proc: int):
        if not self.opts.symbols:
            return None
        if proc not in self.syms:
            if self.opts.symbolizer is not None:
                self.syms[proc] = self.opts.symbolizer(self.run.procs[proc])
            else:
                from locus.symbolize import for_proc

                self.syms[proc] = for_proc(self.run.procs[proc])
        return self.syms[proc]

    def data(self, proc: int, addrs: list[int]) -> dict[int, str | None]:
        s = self.sym(proc)
        return s.data(addrs) if s is not None and addrs else {}

    def data_size(self, proc: int, name: str) -> int | None:
        """Size in bytes of a data symbol data() named, if the symbolizer knows it."""
        s = self.sym(proc)
        return s.data_size(name) if s is not None and hasattr(s, "data_size") else None

    def tls(self, proc: int, site: int, offs: list[int]) -> tuple[str, dict[int, str | None]]:
        """(module, names) of offsets into a module's static TLS block (Symbolizer.tls)."""
        s = self.sym(proc)
        return s.tls(site, offs) if s is not None and hasattr(s, "tls") and offs else ("", {})

    def module_path(self, proc: int, addr: int) -> str | None:
        """The path of the module that maps `addr` in the process, or None."""
        s = self.sym(proc)
        return s.module_path(addr) if s is not None and hasattr(s, "module_path") else None

    def dynamic_tls(self, proc: int, size: int, static: set[str]) -> tuple[int, int] | None:
        """(an address in the module, its TLS alignment) whose dynamic TLS a heap block of
        `size` bytes from the loader is (Symbolizer.dynamic_tls), or None."""
        s = self.sym(proc)
        return s.dynamic_tls(size, static) if s is not None and hasattr(s, "dynamic_tls") else None

    def tls_layout(self, proc: int, name: str, site: int, off: int):
        """The fields of the thread-local variable `name` (dwarf.Layout), or None."""
        s = self.sym(proc)
        return s.tls_layout(name, site, off) if s is not None and hasattr(s, "tls") else None

    def part_layout(self, proc: int, addr: int, pointer: str, member: str):
        """The fields of clang's part of a promoted block that is `pointer->member`, or None."""
        s = self.sym(proc)
        ok = s is not None and hasattr(s, "part_layout")
        return s.part_layout(addr, pointer, member) if ok else None

    def source_text(self, proc: int, ip: int, line: int) -> str:
        """The text of source line `line` of the instruction at `ip`, or ""."""
        s = self.sym(proc)
        return s.source_text(ip, line) if s is not None and hasattr(s, "source_text") else ""

    def layout(self, proc: int, name: str, addr: int):
        """The fields of the static variable `name` at `addr` (dwarf.Layout), or None."""
        s = self.sym(proc)
        return s.data_layout(name, addr) if s is not None and hasattr(s, "data_layout") else None

    def stack_layout(self, proc: int, tid: int, lo: int, size: int, name: str):
        """The locals (dwarf.StackLayout) that the frames thread `tid` recorded (LOCUS_AL_FRAME:
        its calls to pthread_create and OpenMP parallel regions) hold in its stack [lo, lo +
        size), or None when there is none the module's DWARF names."""
        s = self.sym(proc)
        if s is None or not hasattr(s, "frame_locals"):
            return None
        key = (proc, tid, lo)
        if key not in self.stack_layouts:
            from locus.dwarf import StackLayout

            if proc not in self.frames:
                al = self.run.procs[proc].records("allocs.bin", ALLOC_DTYPE)
                self.frames[proc] = al[al["kind"] == AL_FRAME]
            fr = self.frames[proc]
            fr = fr[(fr["tid"] == tid) & (fr["addr"] >= lo) & (fr["addr"] < lo + size)]
            # Each frame's locals once; each of its records' times (a frame recorded again
            # after another took its bytes is live again from then on).
            recs = [
                (int(r["t"]), (int(r["site"]), int(r["addr"]), int(r["reserved"][0]))) for r in fr
            ]
            found = {f: s.frame_locals(*f) for f in sorted({f for _t, f in recs})}
            timed = [
                (t, v)
                for t, f in recs
                for v in found[f]
                if lo <= v.lo and v.lo + v.size <= lo + size
            ]
            # (a runtime from before LOCUS_ALF_TIMED recorded a call once: a later call's
            # record at the same depth would then name the first one's accesses after it)
            known = len(fr) and bool((fr["flags"] & ALF_TIMED).all())
            layout = StackLayout(
                name, lo, [v for _t, v in timed], [t for t, _v in timed] if known else None
            )
            self.stack_layouts[key] = layout if layout.locals or layout.timed else None
        return self.stack_layouts[key]

    def heap_layout(self, proc: int, site: int, line: int, size: int):
        """The fields of a heap block from the pointer its allocating line declares
        (dwarf.heap_layout), or None. At most HEAP_LAYOUTS distinct blocks a report (each a
        DWARF lookup of its module; the advice and the lines ask for the busiest first)."""
        s = self.sym(proc)
        if s is None or not hasattr(s, "heap_layout") or not (site and line and size):
            return None
        key = (proc, site, line, size)
        if key not in self.heap_keys and len(self.heap_keys) >= HEAP_LAYOUTS:
            return None
        self.heap_keys.add(key)
        return s.heap_layout(site, line, size)

    def section(self, proc: int, addr: int):
        """(module, section, ELF virtual address) of a module address, or None."""
        s = self.sym(proc)
        return s.section(addr) if s is not None and hasattr(s, "section") else None

    def code(self, keys: list[tuple[int, int]], return_addresses: bool = False) -> list:
        """CodeLoc (or None) of each (proc, ip). Sampled and trapped instruction addresses
        are the accessing instructions themselves, not return addresses."""
        by_proc: dict[int, list[int]] = {}
        for p, a in keys:
            if (p, a) not in self.code_cache and a:
                by_proc.setdefault(p, []).append(a)
        for p, addrs in by_proc.items():
            s = self.sym(p)
            res = s.code(addrs, return_addresses=return_addresses) if s is not None else {}
            for a in addrs:
                self.code_cache[(p, a)] = res.get(a)
        return [self.code_cache.get(k) for k in keys]

    def functions(self, proc: np.ndarray, ips: np.ndarray) -> np.ndarray:
        """The function holding each (process, instruction), as sites name it ("" where
        unknown): an object array."""
        keys = list(zip(np.asarray(proc).tolist(), np.asarray(ips).tolist()))
        uniq = list(dict.fromkeys(keys))
        fn = {
            k: (loc.function if loc is not None and loc.function else "")
            for k, loc in zip(uniq, self.code(uniq))
        }
        out = np.empty(len(keys), dtype=object)
        out[:] = [fn[k] for k in keys]
        return out

    def site(self, proc: int, ip: int) -> dict:
        """{function, file, line, address} of an instruction; module+offset when stripped."""
        loc = self.code_cache.get((proc, ip))
        fn = loc.function if loc is not None and loc.function else ""
        if not fn and ip:
            s = self.sym(proc)
            where = s.module_offset(ip) if s is not None and hasattr(s, "module_offset") else None
            fn = where or f"{ip:#x}"
        return {
            "function": fn or "?",
            "file": loc.file if loc is not None else "",
            "line": loc.line if loc is not None else 0,
        }


# The samplers' handlers time themselves on one handler in HANDLER_COST_EVERY, chosen at
# random and weighted by it (runtime/comm/comm.c, LOCUS_SELF_EVERY: reading the thread's CPU
# clock in each ended time slices at the samples). Over n handlers whose costs vary with a
# coefficient of variation c, the estimate's relative standard error is
# sqrt((k - 1) (1 + c^2) / n); c is taken as 1 (the handlers here: 2-64 us, most 4-32).
HANDLER_COST_EVERY = 16


def handler_cost_rse(counters: dict) -> float | None:
    """Relative standard error of a sampling backend's `self_ns` (None without handlers)."""
    n = int(counters.get("signals", 0)) + int(counters.get("traps", 0))
    return math.sqrt(2 * (HANDLER_COST_EVERY - 1) / n) if n > 0 else None


def site_str(s: dict) -> str:
    """ "function file.c:12"; no ":0" when the line is unknown (code built without -g: the
    file comes from the symbol table)."""
    where = s["function"]
    if s["file"]:
        where += f" {os.path.basename(s['file'])}" + (f":{s['line']}" if s.get("line") else "")
    return where


SITE_CALLERS = 3  # callers listed per site in a system library


def site_callers(rows: list[dict], key: str, row, procs, callers, w, total_of, names) -> None:
    """rows[i][key]: the program's calls into a system library (`callers`: return addresses
    the runtime's stack scan found, 0 none) that led to the events of row i (`row`: each
    event's row, -1 none; `w` its weight), the busiest first, at most SITE_CALLERS, each
    {function, file, line, address, share}: named by its call instruction (the address
    before), `share` its weight over total_of(rows[i]). [] for a row without."""
    for r in rows:
        r[key] = []
    row = np.asarray(row, dtype=np.int64)
    has = (np.asarray(callers) != 0) & (row >= 0)
    if not has.any():
        return
    cols = np.stack([row[has], np.asarray(procs)[has], np.asarray(callers)[has].astype(np.int64)])
    uniq, first, inv = np.unique(cols, axis=1, return_index=True, return_inverse=True)
    v = np.bincount(inv.reshape(-1), weights=np.asarray(w, dtype=np.float64)[has])
    keys = [(int(p), int(c) - 1) for p, c in zip(uniq[1].tolist(), uniq[2].tolist())]
    names.code(keys)
    best: dict[int, list] = {}
    for j in np.lexsort((first, -v)).tolist():  # busiest first, ties in event order
        lst = best.setdefault(int(uniq[0][j]), [])
        if len(lst) < SITE_CALLERS:
            lst.append((keys[j], float(v[j])))
    for i, lst in best.items():
        total = total_of(rows[i]) or 0.0
        rows[i][key] = [
            dict(names.site(*k), address=f"{k[1] + 1:#x}", share=x / total if total else 0.0)
            for k, x in lst
        ]


def callers_text(r: dict, key: str = "callers", of: str = "") -> str:
    """The callers (`key`) of a site in a system library, a line each under it: "\n← take
    lk.c:8 (100 %)", `of` after the share ("" when it has none)."""
    return "".join(f"\n← {site_str(k)} ({100 * k['share']:.0f} %{of})" for k in r.get(key) or [])


def cpu_nodes(run: RunDir, ncpu: int, notes: list[str]) -> np.ndarray:
    """NUMA node of each CPU 0..ncpu-1: the emulated nodes of a --fake-numa run (the numa
    lens's map: the node matrix said "in one node" beside numa's two), else meta host
    info, else this machine's sysfs."""
    host = run.host
    numa = run.meta.get("numa") if isinstance(run.meta.get("numa"), dict) else {}
    fake = numa.get("cpu_node") if numa.get("emulated") else None
    for v in (fake, host.get("cpu_node"), host.get("cpu_nodes")):
        if isinstance(v, list) and all(isinstance(x, int) for x in v):
            out = np.zeros(ncpu, dtype=np.int64)
            k = min(len(v), ncpu)
            out[:k] = np.maximum(np.asarray(v[:k], dtype=np.int64), 0)
            return out
    if host.get("numa_nodes") == 1:
        return np.zeros(ncpu, dtype=np.int64)
    out = np.zeros(ncpu, dtype=np.int64)
    here_map = cpu_node_map()[:ncpu]
    out[: len(here_map)] = here_map
    found = bool(here_map)
    recorded = host.get("numa_nodes")
    here = int(out.max()) + 1 if found else 1
    if (found and out.max() > 0) or (isinstance(recorded, int) and recorded != here):
        notes.append(
            "the run does not record which NUMA node each CPU belongs to (an older run): the "
            f"node matrix uses this machine's topology ({here} node(s) with CPUs; the run's "
            f"machine had {recorded if recorded else 'an unknown number of'})"
        )
    return out


def lock_of(field: str) -> str | None:
    """The lock a DWARF field name is inside, glibc's own fields of the lock cut off
    (`q.not_empty` of `q.not_empty.__data.__wseq`), else None (no such field)."""
    keep = []
    for part in field.split("."):
        if part.startswith("__"):
            return ".".join(keep) or None
        keep.append(part)
    return None


def inherited_allocs(run: RunDir, pi: int, addrs: np.ndarray | None = None) -> np.ndarray:
    """A process's allocation records, and for a fork child its parent's (and so on up)
    from before the fork: the blocks and mappings it inherited, which its own records never
    mention (a block malloc'd before the fork and shared by the child's threads read as
    unattributed). Not the parent's thread stacks: only the forking thread goes on, as the
    child's main thread, with a stack record of its own. `addrs`: only the inherited
    blocks that hold one of these addresses (the child's accesses) are wanted."""
    p = run.procs[pi]
    al = p.allocs()
    if not p.flags & PROC_FORKED:
        return al
    # The parent's image that forked: of its pid's (an exec starts another), the last one
    # started before the child.
    images = [k for k, q in enumerate(run.procs) if q.pid == p.ppid and k != pi]
    images = [k for k in images if run.procs[k].start_s <= p.start_s] or images
    if not images:
        return al
    parent = max(images, key=lambda k: run.procs[k].start_s)
    # The parent's blocks alive at the fork, not all its records: a parent of 400,000
    # allocations that forked 60 children took 41 s to report, each child re-reading them.
    b, bend = parent_blocks(run, parent)
    fork = p.hdr["tsc0"]
    up = b[(b["t"] < fork) & (bend > fork)]
    if addrs is not None and len(up):
        a = np.sort(np.asarray(addrs, dtype=np.uint64))
        lo, hi = up["addr"], up["addr"] + up["size"]
        up = up[np.searchsorted(a, lo) < np.searchsorted(a, hi)]
    return np.concatenate([up, al]) if len(up) else al


def parent_blocks(run: RunDir, pi: int):
    """heap_blocks of a process's inherited allocations, computed once per run."""
    cache = run.__dict__.setdefault("_inherited_blocks", {})
    if pi not in cache:
        cache[pi] = heap_blocks(inherited_allocs(run, pi))
    return cache[pi]


def heap_blocks(al: np.ndarray):
    """Heap blocks (malloc, mmap) with their lifetime [t, end) in ticks: a block ends at the
    next free, munmap or allocation at the same address. A munmap of a mapping's first part
    leaves the rest: a block of its own from then on, with the mapping's site (and file
    offset), so that the accesses to it keep their object; so does a mapping moved or
    resized by mremap."""
    ends = np.isin(al["kind"], [AL_MALLOC, AL_MMAP, AL_FREE, AL_MUNMAP])
    rows = _remapped(al[ends])
    o = np.lexsort((rows["t"], rows["addr"]))
    rows = rows[o]
    for _ in range(8):  # each pass follows one more cut off the same mapping's front
        rest = _unmapped_front_rest(rows)
        if not len(rest):
            break
        rows = np.concatenate([rows, rest])
        rows = rows[np.lexsort((rows["t"], rows["addr"]))]
    is_live = np.isin(rows["kind"], [AL_MALLOC, AL_MMAP]) & (rows["size"] > 0)
    end = np.full(len(rows), np.iinfo(np.uint64).max, dtype=np.uint64)
    if len(rows) > 1:
        same = rows["addr"][1:] == rows["addr"][:-1]
        end[:-1][same] = rows["t"][1:][same]
    b = rows[is_live]
    return b, end[is_live]


def _remapped(rows: np.ndarray) -> np.ndarray:
    """The rows with each mremap's new range (kind MMAP, ALF_REMAP, reserved[0] = the old
    address) given the object of the mapping that started at the old address: its site,
    call stack, and file (inode, device, offset). In time order, so a mapping moved twice
    keeps its first site; an mremap of a range inside a mapping keeps the mremap's call."""
    rm = np.flatnonzero((rows["kind"] == AL_MMAP) & ((rows["flags"] & ALF_REMAP) != 0))
    if not len(rm):
        return rows
    rows = rows.copy()
    starts: dict[int, list[int]] = {}
    mm = np.flatnonzero(rows["kind"] == AL_MMAP)
    for i in mm[np.argsort(rows["t"][mm], kind="stable")].tolist():
        r = rows[i]
        if int(r["flags"]) & ALF_REMAP:
            prev = starts.get(int(r["reserved"][0]), [])
            src = next((j for j in reversed(prev) if rows["t"][j] <= r["t"]), None)
            if src is not None:
                for f in ("site", "stack", "dev"):
                    r[f] = rows[src][f]
                r["flags"] = rows[src]["flags"] | ALF_REMAP
                r["reserved"] = rows[src]["reserved"]
        starts.setdefault(int(r["addr"]), []).append(i)
    return rows


def _unmapped_front_rest(rows: np.ndarray) -> np.ndarray:
    """For each munmap of the first part of a mapping (rows sorted by address then time),
    an mmap row of what is left, from the munmap's time; none already made."""
    if len(rows) < 2:
        return rows[:0]
    i = np.flatnonzero(
        (rows["kind"][1:] == AL_MUNMAP)
        & (rows["addr"][1:] == rows["addr"][:-1])
        & (rows["kind"][:-1] == AL_MMAP)
        & (rows["size"][1:] > 0)
        & (rows["size"][1:] < rows["size"][:-1])
    )
    if not len(i):
        return rows[:0]
    cut, blk = rows[i + 1], rows[i]
    rest = blk.copy()
    rest["t"] = cut["t"]
    rest["addr"] = blk["addr"] + cut["size"]
    rest["size"] = blk["size"] - cut["size"]
    file = (blk["flags"] & ALF_FILE) != 0
    rest["reserved"][file, 0] += cut["size"][file]
    # Made in an earlier pass: the same start and time is already a row.
    have = set(zip(rows["addr"].tolist(), rows["t"].tolist(), rows["kind"].tolist()))
    new = [k for k, r in enumerate(zip(rest["addr"].tolist(), rest["t"].tolist()))
           if (r[0], r[1], AL_MMAP) not in have]  # fmt: skip
    return rest[new]


def live_blocks(b: np.ndarray, bend: np.ndarray, addr: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index into `b` (heap_blocks, sorted by address then time) of the block holding each
    address at each time (ticks), -1 for none: the block with the highest start <= addr if
    it holds it and is alive, else (address reuse) an older, larger block that does."""
    n = len(addr)
    if n == 0 or len(b) == 0:
        return np.full(n, -1, dtype=np.int64)
    a = np.asarray(addr, dtype=np.uint64)
    t = np.asarray(t, dtype=np.uint64)
    lo = b["addr"]
    hi = lo + b["size"]
    j = np.searchsorted(lo, a, side="right") - 1
    jj = np.maximum(j, 0)
    ok = (j >= 0) & (a < hi[jj]) & (t >= b["t"][jj]) & (t < bend[jj])
    bidx = np.where(ok, jj, -1).astype(np.int64)
    # Misses may still lie in an older, larger block: slow path over the distinct missed
    # addresses that some block covers at all.
    miss = np.flatnonzero(~ok)
    if len(miss):
        # Blocks cover a miss only if a block starting at or below it reaches past it.
        reach = np.maximum.accumulate(hi)
        cand_miss = miss[(j[miss] >= 0) & (a[miss] < reach[jj[miss]])]
        if len(cand_miss):
            ua, uinv = np.unique(a[cand_miss], return_inverse=True)
            uinv = uinv.reshape(-1)
            by_u = np.argsort(uinv, kind="stable")
            cuts = np.searchsorted(uinv[by_u], np.arange(len(ua) + 1))
            for u, av in enumerate(ua.tolist()):
                cand = np.flatnonzero((lo <= av) & (hi > av))
                if not len(cand):
                    continue
                for e in cand_miss[by_u[cuts[u] : cuts[u + 1]]]:
                    te = t[e]
                    alive = cand[(b["t"][cand] <= te) & (bend[cand] > te)]
                    if len(alive):
                        bidx[e] = alive[-1]
    return bidx


def thread_rows(run: RunDir, th: Threads, names: Names) -> list[dict]:
    keys = [(p, r) for p, r in zip(th.proc, th.routine) if r]
    if keys:
        names.code(keys)  # one batch: site() below reads the cache
    out = []
    for i in range(len(th)):
        p, tid = th.proc[i], th.tid[i]
        routine = names.site(p, th.routine[i])["function"] if th.routine[i] else ""
        name = "main" if th.main[i] or i == 0 else trampoline_name(routine)
        pid = run.procs[p].pid if p < len(run.procs) else 0
        out.append({"index": i, "tid": tid, "pid": pid, "name": name, "routine": routine})
    return out


# Start routines that only run the real one (whose name `work` gives): the name a user
# knows them by. Matched on the function, or on the module of a stripped one.
TRAMPOLINES = (
    (("execute_native_thread_routine",), ("libstdc++.so",), "std::thread"),
    (("gomp_thread_start",), ("libgomp.so",), "OpenMP worker"),
    (
        (
            "thread_start",
            "std::sys::unix::thread::Thread::new::thread_start",
            "std::sys::pal::unix::thread::Thread::new::thread_start",
        ),
        (),
        "Rust thread",
    ),
    # runtime/cgo's start routine: every OS thread of a Go program built with cgo.
    (("threadentry",), (), "Go thread"),
    # oneTBB's worker threads (its rml server's routine, libtbb.so without symbols).
    (
        ("tbb::detail::r1::rml::private_worker::thread_routine(void*)",),
        ("libtbb.so",),
        "TBB worker",
    ),
)
# Rust's std moves its thread start between releases: std::sys::unix::thread::..., then
# std::sys::pal::unix::..., then `<std::sys::thread::unix::Thread>::new::thread_start`.
RUST_START = re.compile(r"^<?std::sys::.*\bthread_start$")


def trampoline_name(routine: str) -> str:
    """A thread's name from its start routine: the routine, or what a known trampoline
    (std::thread, libgomp, Rust's std, Go's cgo) is called."""
    module = routine.split("+0x", 1)[0] if "+0x" in routine else ""
    for functions, modules, name in TRAMPOLINES:
        if routine in functions or (module and modules and module.startswith(modules)):
            return name
    return "Rust thread" if RUST_START.match(routine) else routine


def add_os_names(threads: list[dict], run: RunDir, th: Threads, ct_list: list | None = None):
    """`os_name`: the thread's name as the system shows it (pthread_setname_np, the JVM's
    "GC Thread#0"), from the samplers' per-thread records (comm.threads.bin); "" when
    unknown (no sampler, or a run from before it was kept). threads[i] is th's thread i."""
    if ct_list is None:
        ct_list = [p.comm_threads() for p in run.procs]
    names: dict[tuple[int, int], str] = {}
    for i, c in enumerate(ct_list):
        if "name" not in (c.dtype.names or ()):
            continue
        for tid, nm in zip(c["tid"].tolist(), c["name"].tolist()):
            names[(i, int(tid))] = nm.split(b"\0", 1)[0].decode(errors="replace")
    for i, t in enumerate(threads):
        t["os_name"] = names.get((th.proc[i], th.tid[i]), "")


RANGES_MOST = 8  # parts a list of ranges shows before it is cut


def drop_damaged(proc, name: str, a: np.ndarray, ok: np.ndarray, notes: list[str] | None):
    """The rows of `a` (records of `proc`'s file `name`) that `ok` marks as the runtime's,
    with a note of how many were not (a damaged file)."""
    if not ok.all() and notes is not None:
        notes.append(
            f"{int((~ok).sum())} of {len(a)} records of {proc.file(name)} are not the "
            "runtime's (a damaged file): ignored"
        )
    return a[ok]


def ranges(idx: list[int], most: int = RANGES_MOST, count: bool = True) -> str:
    """[0,1,2,3,5] -> '0-3,5'; past `most` parts the first ones and the count, '0-63,67,70,…
    (412 in all)' ('0-63,67,70,…' without `count`), so that a thousand scattered threads
    stay one readable line."""
    idx = sorted(set(idx))
    out = []
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        out.append(f"{idx[i]}" if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    if len(out) > most:
        return ",".join(out[:most]) + (f",… ({len(idx)} in all)" if count else ",…")
    return ",".join(out)


# Allocation wrappers (xmalloc, g_malloc0, zmalloc, av_mallocz, PyMem_Malloc, xstrdup, C++
# operator new when not interposed): a heap object is named by the first frame of its call
# stack outside them.
WRAPPER = re.compile(r"alloc|strn?dup|memdup|^operator new", re.IGNORECASE)
ALLOC_NAME_DEPTH = 8  # frames of an allocation's call stack looked at for its name


def is_alloc_wrapper(function: str) -> bool:
    return bool(function) and bool(WRAPPER.search(function))


# Library code compiled into the program from system headers: at -O0, std::vector's
# allocation is ~6 frames of <bits/...> (allocate, _M_allocate, _M_create_storage, ...)
# between operator new and the line that built the vector.
SYSTEM_HEADER = re.compile(r"^/usr/(local/)?include/|/include/c\+\+/")


def in_system_header(file: str) -> bool:
    return bool(file) and bool(SYSTEM_HEADER.search(file))


def short_function(function: str) -> str:
    """'std::__new_allocator<std::atomic<int> >::allocate(unsigned long, void const*)' ->
    'std::__new_allocator::allocate': template arguments and parameters dropped."""
    out, depth = [], 0
    for ch in function:
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = " ".join("".join(out).split())
    # A template function's demangled name starts with its return type ("std::future
    # std::async", "void std::vector::_M_realloc_insert"): the last word is the function.
    words = short.split(" ")
    if len(words) > 1 and "operator" not in words:
        short = words[-1]
    return short or function


VIA_MOST = 2


def via_text(via: list[str]) -> str:
    """' (via xmalloc)': the wrappers an allocation was named past, short, at most two."""
    if not via:
        return ""
    names = list(dict.fromkeys(short_function(v) for v in via))
    more = f", +{len(names) - VIA_MOST} more" if len(names) > VIA_MOST else ""
    return f" (via {', '.join(names[:VIA_MOST])}{more})"


def stack_table(proc) -> dict[int, tuple[int, ...]]:
    """Stack id -> return addresses (innermost first) of a process's stacks.bin."""
    return {int(r["id"]): tuple(int(x) for x in r["pc"][: int(r["depth"])]) for r in proc.stacks()}


def alloc_prefetch(names: Names, items: list[tuple[int, int, tuple]]) -> None:
    """Symbolize, in one batch, what alloc_site will look at for each (proc, site, frames):
    the allocating call and the first ALLOC_NAME_DEPTH frames of its stack (return
    addresses)."""
    keys = [(p, a) for p, a, _fr in items if a]
    keys += [(p, pc) for p, _a, fr in items for pc in fr[:ALLOC_NAME_DEPTH]]
    names.code(keys, return_addresses=True)


def alloc_site(names: Names, proc: int, site: int, frames: tuple = ()) -> tuple[dict, list[str]]:
    """(names.site() of the allocating code, wrappers skipped, with its return address as
    `pc`): with a call stack (frames, innermost first, the site's return address first), the
    first frame outside the allocation wrappers, whose names are kept; else the allocating
    call itself. The frames must have been symbolized (names.code, return addresses)."""
    pcs = list(frames[:ALLOC_NAME_DEPTH])
    if site and site in pcs:
        pcs = pcs[pcs.index(site) :]
    else:  # no stack, or one that does not start at the allocating call: the call alone
        pcs = [site] if site else []
    via: list[str] = []
    for k, pc in enumerate(pcs):
        s = names.site(proc, pc)
        fn = s["function"]
        if k + 1 < len(pcs) and (is_alloc_wrapper(fn) or in_system_header(s["file"])):
            # The program's own wrappers are named; the library's internals are not news.
            if fn not in via and not in_system_header(s["file"]):
                via.append(fn)
            continue
        # A wrapper inlined into its caller (`xmalloc` in `make_stats` in `main`): the first
        # frame of the inline chain outside the wrappers.
        loc = names.code_cache.get((proc, pc))
        if is_alloc_wrapper(fn) and loc is not None and loc.inlined:
            for ofn, ofile, oline in loc.inlined:
                if ofn and not is_alloc_wrapper(ofn):
                    via.append(fn)
                    return {"function": ofn, "file": ofile, "line": oline, "pc": pc}, via
                if ofn and ofn not in via:
                    via.append(ofn)
        return dict(s, pc=pc), via
    return {"function": "?", "file": "", "line": 0, "pc": 0}, via


UNSEEN_NOTE_MIN = 0.01  # of the recorded tasks' CPU time: threads the runtime never saw


def task_service_ns(run: RunDir) -> dict[tuple[int, int], float]:
    """(pid, tid) -> the task's service (on-CPU) time in ns from the launcher's scheduler
    samples: service_ns is cumulative since the task started, so its largest value is the
    task's whole service time (last - first would miss what ran before the first sample)."""
    s = run.sched()
    return _task_max(s[s["tid"] != 0], "service_ns")


def task_switches(run: RunDir) -> float:
    """The context switches of the run's tasks (schedstat's timeslices, cumulative since each
    task started, in the scheduler samples' reserved[0]; 0 for runs without them)."""
    s = run.sched()
    s = s[s["tid"] != 0]
    return float(sum(_task_max(s, s["reserved"][:, 0]).values()))


def _task_max(s: np.ndarray, values) -> dict[tuple[int, int], float]:
    """(pid, tid) -> the largest of `values` (a field name of the samples, or a column
    beside them) over each task's samples."""
    if not len(s):
        return {}
    values = s[values] if isinstance(values, str) else values
    _keys, first, inv = np.unique(
        (s["pid"].astype(np.uint64) << np.uint64(32)) | s["tid"].astype(np.uint64),
        return_index=True,
        return_inverse=True,
    )
    hi = np.zeros(len(first))
    np.maximum.at(hi, inv.reshape(-1), np.asarray(values, dtype=np.float64))
    return {(int(s["pid"][f]), int(s["tid"][f])): float(hi[j]) for j, f in enumerate(first)}


def unseen_tasks_note(run: RunDir, th: Threads) -> str | None:
    """A note when tasks of the run used CPU time but were never registered by the runtime
    (the launcher's scheduler samples list every task of the recorded processes and their
    descendants): threads made by a raw clone rather than pthread_create, and processes
    the runtime cannot enter (static executables), are neither sampled nor watched."""
    svc = task_service_ns(run)
    if not svc or not run.procs:
        return None
    known = {(run.procs[int(p)].pid, int(t)) for p, t in zip(th.proc, th.tid)}
    hidden = [v for k, v in svc.items() if k not in known and v > 0]
    unseen, n = float(sum(hidden)), len(hidden)
    total = float(sum(svc.values()))
    if not n or unseen < UNSEEN_NOTE_MIN * total:
        return None
    return (
        f"{n} task(s) of the run used {unseen / 1e9:.3g} s of CPU "
        f"({100 * unseen / total:.0f} % of the tasks' CPU time) without the runtime seeing "
        "them (threads made by a raw clone rather than pthread_create, or processes it "
        "could not enter: a static executable): their accesses are not sampled, and are "
        "missing from every table"
    )


def strided_samples(proc, most: int) -> tuple[np.ndarray, int]:
    """(a process's used sample records, at most about `most` of them, evenly strided from a
    memory map: a long run's comm.samples.bin holds tens of millions; the stride)."""
    path = proc.file("comm.samples.bin")
    try:
        n = os.path.getsize(path) // COMM_SAMPLE_DTYPE.itemsize
    except OSError:
        n = 0
    if n == 0:
        return np.zeros(0, dtype=COMM_SAMPLE_DTYPE), 1
    stride = max(1, n // most)
    s = np.array(np.memmap(path, dtype=COMM_SAMPLE_DTYPE, mode="r", shape=(n,))[::stride])
    return s[s["kind"] != 0], stride


THINNING_READ = 200_000  # sample records a process's thinning is read from (a stride)


def thinning(run: RunDir, taken: int) -> dict | None:
    """The runtime's thinning of the samples files (struct locus_comm_sample's `thin`: of a
    thread's samples past its first --keep-samples N, 1 in 2 of the next 2N was written, 1 in
    4 of the next 4N, ..., its `periods` counting the others): None when every sample was
    written, else {"written": the records the files hold (read every `stride`-th record of
    a long file, so estimated there), "taken": the samples taken, "most": the largest
    1-in-K}."""
    written, most = 0, 1
    for p in run.procs:
        s, stride = strided_samples(p, THINNING_READ)
        written += len(s) * stride
        if len(s):
            most = max(most, int(s["thin"].max()))
    if most <= 1:
        return None
    return {"written": min(written, taken) if taken else written, "taken": taken, "most": most}


def thinning_noted(run: RunDir, backend: str, taken: int, notes: list[str], tail: str):
    """thinning() of a sampling backend's run, with the report's note on it appended to
    `notes` when there is any; `tail`: what it means in this lens."""
    t = thinning(run, taken) if backend != "exact" else None
    if t:
        notes.append(
            f"samples thinned to keep a long run's files small (--keep-samples): of each "
            f"thread's samples past its first N, 1 in 2 of the next 2N was written, 1 in 4 of "
            f"the next 4N, ... (up to 1 in "
            f"{t['most']} here), chosen at random; the samples files hold about {t['written']} "
            f"of the {t['taken']} samples taken; {tail}"
        )
    return t
