"""The numa lens: which accesses are local or remote, who first-touched each page, which
threads and pages are unpinned (NUMAPROF, Valat & Bastian, Euro-Par'18 workshops, without
Pin; docs/lenses/numa.md documents every number).

Inputs, per process: the sampled accesses (comm.samples.bin, with the page's node asked
with move_pages at sample time) or, with the exact backend, the counted ones
(numa.counts.bin), the first touches (numa.touch.bin), the pinning log (numa.pins.bin: CPU
affinity and memory policy changes, mbind, move_pages), the heap blocks (allocs.bin) and
meta["numa"] (backend, period, topology, emulation).

NUMAPROF's classes, for one sampled access by a thread T to a page P (stack accesses are
left out, as NUMAPROF does):

- T is pinned when the CPUs it may run on (at the time of the access) are all on one node,
  its node; P is pinned when its first toucher was pinned (or bound by its memory policy),
  when an mbind binds it to one node, when move_pages moved it, or when no touch of it was
  recorded (static data, brk heap, memory touched before the runtime started);
- both pinned: `local` when P's node is T's node, else `remote`; when P is on a memory-only
  node (no CPUs: HBM, CXL), `memory_only_local` if that node is attached to T's node (no
  CPU node is nearer to it), else `memory_only_remote`;
- T pinned, P not: `unpinned_page`; T not, P pinned: `unpinned_thread`; neither:
  `unpinned_both`; P's node unknown: `unknown`.

First touches are counted in pages, a transparent huge page once (LOCUS_NT_HUGE):
`first_touch` by pinned threads, `unpinned_first_touch` by unpinned ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from locus.analysis.common import (
    Names,
    Threads,
    add_os_names,
    alloc_prefetch,
    alloc_site,
    cpu_nodes,
    drop_damaged,
    handler_cost_rse,
    heap_blocks,
    inherited_allocs,
    live_blocks,
    ranges,
    site_callers,
    site_str,
    stack_table,
    thinning_noted,
    thread_rows,
    unseen_tasks_note,
)
from locus.analysis.locks import group
from locus.errors import LocusError
from locus.rundir import (
    AC_STACK,
    ALLOC_DTYPE,
    BK_EXACT,
    BK_HW,
    BK_SOFT,
    COMM_SAMPLE_DTYPE,
    CPU_MAX,
    NODE_MAX,
    NUMA_COUNT_DTYPE,
    NUMA_PIN_DTYPE,
    NUMA_TOUCH_DTYPE,
    PID_MAX,
    RunDir,
)

BACKEND_NAMES = {BK_HW: "hw", BK_SOFT: "soft", BK_EXACT: "exact"}

# LOCUS_NT_* (struct locus_numa_touch flags)
NT_UNPINNED, NT_RANGE, NT_WRITE, NT_EXACT, NT_PLACE, NT_FINAL, NT_HUGE = 1, 2, 4, 8, 16, 32, 64
NC_UNPINNED_PAGE = 0x100  # struct locus_numa_count flags: the page's first toucher was unpinned
# enum locus_numa_pin_what
NP_START, NP_SCHED, NP_PTHREAD, NP_MEMPOLICY, NP_MBIND, NP_MOVE, NP_END = range(1, 8)
WHAT_NAMES = {
    NP_START: "start",
    NP_SCHED: "sched_setaffinity",
    NP_PTHREAD: "pthread_setaffinity_np",
    NP_MEMPOLICY: "set_mempolicy",
    NP_MBIND: "mbind",
    NP_MOVE: "move_pages",
    NP_END: "end",
}
AFFINITY = (NP_START, NP_SCHED, NP_PTHREAD)
# MPOL_* modes; 0xff: not a policy record.
MODE_NONE = 0xFF
MODE_NAMES = {
    0: "default",
    1: "preferred",
    2: "bind",
    3: "interleave",
    4: "local",
    5: "preferred_many",
}
# Modes that fix a page's node when their node mask holds one node.
BINDING_MODES = (1, 2, 3, 5)

TOUCH_FIELDS = ("first_touch", "unpinned_first_touch")
CLASSES = (
    "local",
    "remote",
    "unpinned_page",
    "unpinned_thread",
    "unpinned_both",
    "memory_only_local",
    "memory_only_remote",
)
FIELDS = TOUCH_FIELDS + CLASSES + ("unknown",)
NF = len(FIELDS)
F = {k: i for i, k in enumerate(FIELDS)}
STACK = NF  # the class code of a stack access: counted in totals only
ACCESS = slice(F["local"], F["unknown"] + 1)  # the fields that are accesses

# Below this many samples a row is not advised on (relative standard error above ~30 %).
ADVICE_MIN_SAMPLES = 10
MAX_ADVICE = 6
MAX_REMOTE_SITES = 2


@dataclass
class Options:
    symbols: bool = True
    # proc -> an object with .data(addrs) and .code(addrs, return_addresses=) (tests give
    # a fake one); None = locus.symbolize.Symbolizer over the process's maps.
    symbolizer: Callable | None = None
    top_sites: int = 500
    top_allocations: int = 500


def recorded(run: RunDir) -> bool:
    if "numa" in run.lenses:
        return True
    names = ("numa.touch.bin", "numa.pins.bin", "numa.counts.bin")
    return any(os.path.exists(p.file(n)) for p in run.procs for n in names)


# ---- vectorised lookups ----


def last_at_or_before(rk, rt, qk, qt) -> np.ndarray:
    """For each query (key qk, time qt): the index of the record with the same key and the
    latest time <= qt (equal times: the later record in input order); -1 when none.

    Records and queries are ranked by (key, time) packed into one integer when the key
    count and the time span fit 63 bits (always, in practice: the records' keys only are
    sorted, the queries are binary-searched), else sorted together."""
    n, m = len(rk), len(qk)
    out = np.full(m, -1, dtype=np.int64)
    if n == 0 or m == 0:
        return out
    rk, qk = np.asarray(rk, dtype=np.int64), np.asarray(qk, dtype=np.int64)
    rt, qt = np.asarray(rt, dtype=np.uint64), np.asarray(qt, dtype=np.uint64)
    uk, rrank = np.unique(rk, return_inverse=True)
    rrank = rrank.reshape(-1)
    if 0 <= uk[0] and uk[-1] < max(4 * m, 1024):
        # Small keys (thread indices): a table instead of a binary search.
        table = np.full(int(uk[-1]) + 2, -1, dtype=np.int64)
        table[uk] = np.arange(len(uk))
        qrank = table[np.clip(qk, 0, int(uk[-1]) + 1)]
        has = qrank >= 0
        qrank = np.maximum(qrank, 0)
    else:
        qrank = np.minimum(np.searchsorted(uk, qk), len(uk) - 1)
        has = uk[qrank] == qk
    if len(uk) == n:
        # One record per key (pages touched once): the key's record, if not later.
        rec = np.empty(n, dtype=np.int64)
        rec[rrank] = np.arange(n)
        r = rec[qrank]
        ok = has & (rt[r] <= qt)
        out[ok] = r[ok]
        return out
    t0 = min(rt.min(), qt.min())
    tbits = int(max(rt.max(), qt.max()) - t0).bit_length()
    if tbits + len(uk).bit_length() <= 63:
        sh = np.uint64(tbits)
        rkey = (rrank.astype(np.uint64) << sh) | (rt - t0)
        o = np.argsort(rkey, kind="stable")
        sk = rkey[o]
        qkey = (qrank.astype(np.uint64) << sh) | (qt - t0)
        j = np.searchsorted(sk, qkey, side="right") - 1
        ok = has & (j >= 0)
        jj = np.maximum(j, 0)
        ok &= (sk[jj] >> sh) == qrank.astype(np.uint64)
        out[ok] = o[jj[ok]]
        return out
    k = np.concatenate([rk, qk])
    t = np.concatenate([rt, qt])
    isq = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(m, dtype=np.int8)])
    o = np.lexsort((isq, t, k))
    is_rec = o < n
    last = np.maximum.accumulate(np.where(is_rec, np.arange(n + m), -1))
    rec = np.where(last >= 0, o[np.maximum(last, 0)], -1)
    ok = rec >= 0
    ok[ok] = k[rec[ok]] == k[o][ok]
    q = ~is_rec
    out[o[q] - n] = np.where(ok, rec, -1)[q]
    return out


def latest_covering(lo, hi, rt, qa, qt) -> np.ndarray:
    """For each query address qa at time qt: the index of the latest record (by time, at or
    before qt) whose range [lo, hi) holds it; -1 when none. The records are few (mbind,
    move_pages, range touches): each updates the contiguous slice of the address-sorted
    queries it covers, in time order, so the latest one wins."""
    out = np.full(len(qa), -1, dtype=np.int64)
    if len(lo) == 0 or len(qa) == 0:
        return out
    qa, qt = np.asarray(qa, dtype=np.uint64), np.asarray(qt, dtype=np.uint64)
    if len(lo) <= 16:
        # A few records: one pass over the queries each beats sorting them.
        for r in np.argsort(rt, kind="stable").tolist():
            hit = (qa >= np.uint64(lo[r])) & (qa < np.uint64(hi[r])) & (qt >= np.uint64(rt[r]))
            out[hit] = r
        return out
    o = np.argsort(qa, kind="stable")
    sa, st = qa[o], qt[o]
    for r in np.argsort(rt, kind="stable").tolist():
        a = int(np.searchsorted(sa, np.uint64(lo[r]), side="left"))
        b = int(np.searchsorted(sa, np.uint64(hi[r]), side="left"))
        if a < b:
            sel = o[a:b][st[a:b] >= np.uint64(rt[r])]
            out[sel] = r
    return out


def single_node(mask: np.ndarray) -> np.ndarray:
    """Node of each one-node mask (bit i = node i), -1 for zero or several nodes."""
    m = np.asarray(mask, dtype=np.uint64)
    one = (m != 0) & ((m & (m - np.uint64(1))) == 0)
    # A power of two is exact in a double: its exponent is the bit's index.
    node = np.frexp(m.astype(np.float64))[1].astype(np.int64) - 1
    return np.where(one, node, -1)


def mask_nodes(mask: int) -> list[int]:
    return [i for i in range(64) if (int(mask) >> i) & 1]


def _num(x) -> int | float:
    """A weighted count as an int when it is one (the usual case: weight 1 per sample)."""
    x = float(x)
    return int(x) if x.is_integer() else x


# ---- configuration and topology ----


class Topology:
    """NUMA nodes of the run (meta["numa"]; else the host's CPU -> node map)."""

    def __init__(self, run: RunDir, cfg: dict, notes: list[str]):
        nodes = cfg.get("nodes") if isinstance(cfg.get("nodes"), list) else []
        nodes = [n for n in nodes if isinstance(n, dict) and isinstance(n.get("id"), int)]
        cpu_node = cfg.get("cpu_node")
        if isinstance(cpu_node, list) and all(isinstance(x, int) for x in cpu_node):
            self.cpu_node = np.asarray(cpu_node, dtype=np.int64)
        else:
            ncpu = max(run.cpus or 0, 1)
            for n in nodes:
                for c in n.get("cpus") or []:
                    ncpu = max(ncpu, int(c) + 1)
            self.cpu_node = np.full(ncpu, -1, dtype=np.int64)
            for n in nodes:
                for c in n.get("cpus") or []:
                    self.cpu_node[int(c)] = n["id"]
            if not nodes:
                self.cpu_node = cpu_nodes(run, ncpu, notes)
        self.info: dict[int, dict] = {}
        for n in nodes:
            cpus = sorted(int(c) for c in n.get("cpus") or [])
            self.info[n["id"]] = {
                "id": n["id"],
                "cpus": cpus,
                "mem_kb": n.get("mem_kb") if isinstance(n.get("mem_kb"), int) else None,
                "memory_only": bool(n.get("memory_only", not cpus)),
                "distances": n.get("distances") if isinstance(n.get("distances"), list) else None,
            }
        for node in sorted(set(self.cpu_node[self.cpu_node >= 0].tolist())):
            if node not in self.info:
                cpus = np.flatnonzero(self.cpu_node == node).tolist()
                self.info[node] = dict(
                    id=node, cpus=cpus, mem_kb=None, memory_only=False, distances=None
                )
        if not self.info:
            self.info[0] = dict(id=0, cpus=[], mem_kb=None, memory_only=False, distances=None)
        self._build()

    def add(self, node: int) -> None:
        """A node seen in the records but not in the topology (a memory-only node the
        launcher missed)."""
        self.info[node] = dict(id=node, cpus=[], mem_kb=None, memory_only=True, distances=None)
        self._build()

    def _build(self) -> None:
        self.ids = sorted(self.info)
        n = max(self.ids) + 1
        self.pos = np.full(n, -1, dtype=np.int64)
        self.pos[self.ids] = np.arange(len(self.ids))
        self.memory_only = np.zeros(n, dtype=bool)
        for i in self.ids:
            self.memory_only[i] = self.info[i]["memory_only"]
        # Distances by node id: sysfs lists them in node order.
        d = np.where(np.eye(n, dtype=bool), 10, 20).astype(np.int64)
        for i in self.ids:
            dl = self.info[i]["distances"]
            if not dl:
                continue
            if len(dl) == len(self.ids):
                d[i, self.ids] = dl
            elif len(dl) >= n:
                d[i, :] = dl[:n]
        self.distance = d
        # mo_local[t, p]: memory-only node p is attached to CPU node t, i.e. no CPU node is
        # nearer to p than t (HBM of a KNL quadrant, a CXL expander behind one socket).
        mo = np.flatnonzero(self.memory_only)
        cpu = [i for i in self.ids if not self.info[i]["memory_only"]]
        self.mo_local = np.zeros((n, n), dtype=bool)
        if len(mo) and cpu:
            near = d[np.ix_(cpu, mo)].min(axis=0)
            self.mo_local[:, mo] = d[:, mo] == near[None, :]
        self.cpu_nodes_mask = sum(1 << i for i in cpu if i < 64)

    @property
    def size(self) -> int:
        return len(self.pos)

    def rows(self) -> list[dict]:
        return [
            {k: self.info[i][k] for k in ("id", "cpus", "mem_kb", "memory_only", "distances")}
            for i in self.ids
        ]


def _config(run: RunDir, ct: np.ndarray, notes: list[str]) -> dict:
    cfg = run.meta.get("numa")
    cfg = cfg if isinstance(cfg, dict) else {}

    def num(key, default=0):
        v = cfg.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default

    backend = cfg.get("backend") if cfg.get("backend") in ("hw", "soft", "exact") else None
    if backend is None and len(ct):
        codes, n = np.unique(ct["backend"], return_counts=True)
        backend = BACKEND_NAMES.get(int(codes[np.argmax(n)]))
    backend = backend or "unknown"
    used = int(ct["period_ns"].max()) if len(ct) else 0
    period_ns = num("period_ns")
    if used and period_ns and used != period_ns and backend != "exact":
        notes.append(f"sampling period {used} ns used by the runtime ({period_ns} ns asked)")
    page = num("page_size", 4096) or 4096
    if page & (page - 1):
        notes.append(f"page size {page} is not a power of two: 4096 assumed")
        page = 4096
    if not cfg:
        notes.append(
            "meta.json has no numa configuration: backend and period were read from the "
            "per-thread records, the topology from the host information"
        )
    fake = cfg.get("fake")
    return {
        "backend": backend,
        "period_ns": int(used or period_ns or 0) if backend != "exact" else 0,
        "period_n": num("period_n"),
        "emulated": bool(cfg.get("emulated", False)),
        "fake": fake if isinstance(fake, int) and not isinstance(fake, bool) else None,
        "fake_file": cfg.get("fake_file") if isinstance(cfg.get("fake_file"), str) else None,
        "page_size": page,
    }


def scaling(cfg: dict) -> dict:
    """What one sample stands for: {period, period_unit, scale, unit}."""
    if cfg["backend"] == "exact":
        return {"period": None, "period_unit": None, "scale": 1.0, "unit": "accesses"}
    if cfg["period_n"] > 0:
        # Count-based (hw): one sample every period_n memory accesses.
        return {
            "period": cfg["period_n"],
            "period_unit": "accesses",
            "scale": float(cfg["period_n"]),
            "unit": "accesses",
        }
    if cfg["period_ns"] > 0:
        # Time-based (soft timer): one sample per period_ns of a thread's CPU time. Samples
        # are not accesses; their shares estimate shares of the time spent accessing.
        return {"period": cfg["period_ns"], "period_unit": "ns", "scale": 1.0, "unit": "samples"}
    return {"period": None, "period_unit": None, "scale": 1.0, "unit": "samples"}


# ---- loading ----


@dataclass
class _Cols:
    """Records of all processes, columns concatenated, with the process index `proc`."""

    proc: np.ndarray
    rec: np.ndarray


def _sane(a: np.ndarray) -> np.ndarray:
    """Rows that can be the runtime's: kind 1 (every numa and sample record), and the tid,
    CPU and node in range."""
    names = a.dtype.names
    ok = a["kind"] == 1
    if "tid" in names:
        ok &= a["tid"] <= PID_MAX
    if "cpu" in names:
        ok &= (a["cpu"] >= -1) & (a["cpu"] < CPU_MAX)
    if "node" in names:
        ok &= (a["node"] >= -3) & (a["node"] < NODE_MAX)
    return ok


def _load(run: RunDir, name: str, dtype: np.dtype, notes: list[str] | None = None) -> _Cols:
    parts, procs = [], []
    for i, p in enumerate(run.procs):
        a = p.records(name, dtype)
        a = drop_damaged(p, name, a, _sane(a), notes)
        if len(a):
            parts.append(a)
            procs.append(np.full(len(a), i, dtype=np.int64))
    if not parts:
        return _Cols(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=dtype))
    if len(parts) == 1:
        return _Cols(procs[0], parts[0])
    return _Cols(np.concatenate(procs), np.concatenate(parts))


def _runtime_samples(run: RunDir, S: _Cols) -> np.ndarray:
    """Samples whose instruction is in locus's own libraries (the process's maps)."""
    own = np.zeros(len(S.rec), dtype=bool)
    for pi, p in enumerate(run.procs):
        m = np.flatnonzero(S.proc == pi)
        if not len(m):
            continue
        ip = S.rec["ip"][m]
        for line in p.maps_text().splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6 or not os.path.basename(parts[5]).startswith("liblocus"):
                continue
            lo, _, hi = parts[0].partition("-")
            try:
                lo_i, hi_i = int(lo, 16), int(hi, 16)
            except ValueError:
                continue
            own[m] |= (ip >= np.uint64(lo_i)) & (ip < np.uint64(hi_i))
    return own


class _Binding:
    """Each thread's CPU affinity and memory policy over time, from the pinning log."""

    def __init__(self, th: Threads, pins: _Cols, topo: Topology):
        r = pins.rec
        self.k = th.lookup(pins.proc, r["tid"]) if len(r) else np.zeros(0, dtype=np.int64)
        aff = np.isin(r["what"], AFFINITY) & (r["nodes"] != 0)
        self.aff_k, self.aff_t, self.aff_mask = self.k[aff], r["t"][aff], r["nodes"][aff]
        self.aff_ncpus = r["ncpus"][aff]
        pol = r["what"] == NP_MEMPOLICY
        self.pol_k, self.pol_t = self.k[pol], r["t"][pol]
        self.pol_bound = _bound(r["mode"][pol], r["policy_nodes"][pol])
        # A thread without any affinity record: the affinity of its process's main thread
        # at start (threads inherit it), else every CPU node.
        n = len(th)
        order = np.lexsort((self.aff_t, self.aff_k))
        ks, first = np.unique(self.aff_k[order], return_index=True)
        self.first = np.full(n, -1, dtype=np.int64)
        self.first[ks] = order[first]
        # The last record of each thread (the latest time; the last written on ties).
        ks_r, last_r = np.unique(self.aff_k[order][::-1], return_index=True)
        self.last_rec = np.full(n, -1, dtype=np.int64)
        self.last_rec[ks_r] = order[::-1][last_r]
        self.records = np.bincount(self.aff_k, minlength=n)
        proc_default: dict[int, int] = {}
        for k in range(n):
            if th.main[k] and self.first[k] >= 0:
                proc_default.setdefault(th.proc[k], int(self.aff_mask[self.first[k]]))
        default = topo.cpu_nodes_mask or 1
        self.default = np.array(
            [proc_default.get(th.proc[k], default) for k in range(n)], dtype=np.uint64
        )
        self.no_record = set(np.flatnonzero(self.first < 0).tolist())

    def mask(self, k: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Node mask each thread k may run on at time t (ticks of its process)."""
        idx = last_at_or_before(self.aff_k, self.aff_t, k, t)
        # Before the thread's first record (a sample stamped before START): its first one.
        early = idx < 0
        idx[early] = self.first[k[early]]
        out = self.default[k].copy()
        ok = idx >= 0
        out[ok] = self.aff_mask[idx[ok]]
        return out

    def policy_bound(self, k: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether thread k's memory policy at time t fixes the node of what it touches."""
        idx = last_at_or_before(self.pol_k, self.pol_t, k, t)
        out = np.zeros(len(k), dtype=bool)
        out[idx >= 0] = self.pol_bound[idx[idx >= 0]]
        return out

    def last(self, k: int) -> tuple[int, int, int]:
        """(node mask, CPU count, affinity changes after the first record) of thread k at
        its last affinity record (the default mask when it has none)."""
        j = self.last_rec[k]
        if j < 0:
            return int(self.default[k]), 0, 0
        return int(self.aff_mask[j]), int(self.aff_ncpus[j]), int(self.records[k]) - 1


def _bound(mode: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    return np.isin(mode, BINDING_MODES) & (single_node(nodes) >= 0)


# ---- the analysis ----


@dataclass
class _Accesses:
    """The accesses of the run, columns over every process: the samplers' samples (weight
    = the sampling scale) and the exact backend's counted accesses (weight = count, the
    thread's node mask and the page's pinned state as the runtime saw them, `addr` a page)."""

    proc: np.ndarray
    t: np.ndarray
    addr: np.ndarray
    ip: np.ndarray
    caller: np.ndarray  # the program's call into the system library ip is in (soft), 0 none
    node: np.ndarray  # int64: the page's node, -1 unknown, -2 not present, -3 stack
    tid: np.ndarray
    cpu: np.ndarray  # int64, -1 unknown
    stack: np.ndarray  # bool
    w: np.ndarray  # float64
    mask: np.ndarray  # uint64 node mask of the thread; 0 = from the pinning log
    unpinned_page: np.ndarray  # int8: 1/0 from the runtime, -1 = from the touch records
    paged: np.ndarray  # bool: `addr` is the page (counted accesses)


def _accesses(run: RunDir, scale: float, notes: list[str]) -> _Accesses:
    S = _load(run, "comm.samples.bin", COMM_SAMPLE_DTYPE, notes)
    own = _runtime_samples(run, S)
    if own.any():
        # The samplers may interrupt the runtime itself (its fault handler placing a page):
        # those are locus's accesses, not the program's.
        notes.append(
            f"{int(own.sum())} sample(s) taken inside locus's runtime (liblocus) were left out"
        )
        S = _Cols(S.proc[~own], S.rec[~own])
    C = _load(run, "numa.counts.bin", NUMA_COUNT_DTYPE, notes)
    s, c = S.rec, C.rec
    ns, nc = len(s), len(c)

    def cat(x, y, dtype=None):
        x = x if dtype is None else np.asarray(x).astype(dtype, copy=False)
        y = y if dtype is None else np.asarray(y).astype(dtype, copy=False)
        return x if not len(y) else y if not len(x) else np.concatenate([x, y])

    node = cat(s["node"], c["node"], np.int64)
    flags = cat(s["flags"], c["flags"], np.uint32)
    return _Accesses(
        proc=cat(S.proc, C.proc),
        t=cat(s["t"], c["t"]),
        addr=cat(s["addr"], c["addr"]),
        ip=cat(s["ip"], c["ip"]),
        caller=cat(s["caller"], np.zeros(nc, dtype=np.uint64)).astype(np.uint64),
        node=node,
        tid=cat(s["tid"], c["tid"]),
        cpu=cat(s["cpu"], np.full(nc, -1), np.int64),
        stack=((flags & AC_STACK) != 0) | (node == -3),
        # A sample of the tick (a thread that switched context often: soft.c) stands for
        # the periods that elapsed; 0 in older runs.
        w=cat(np.maximum(s["periods"], 1) * scale, c["count"], np.float64),
        mask=cat(np.zeros(ns, dtype=np.uint64), c["nodes"]),
        unpinned_page=cat(
            np.full(ns, -1, dtype=np.int8), (c["flags"] & NC_UNPINNED_PAGE) != 0, np.int8
        ),
        paged=cat(np.zeros(ns, dtype=bool), np.ones(nc, dtype=bool)),
    )


@dataclass
class _Pages:
    """What the records say about the page of each access at its time."""

    touch: np.ndarray  # index of its touch record, -1 none
    mbind_bound: np.ndarray  # the latest mbind covering it binds it to one node
    moved: np.ndarray  # move_pages moved it
    moved_node: np.ndarray  # where to (-1 several or unknown)


def _pages(run: RunDir, a: _Accesses, T: _Cols, P: _Cols, ps: int) -> _Pages:
    n = len(a.t)
    out = _Pages(
        np.full(n, -1, dtype=np.int64),
        np.zeros(n, dtype=bool),
        np.zeros(n, dtype=bool),
        np.full(n, -1, dtype=np.int64),
    )
    t, pr = T.rec, P.rec
    shift = np.uint64(ps.bit_length() - 1)
    for pi in range(len(run.procs)):
        sm = np.flatnonzero(a.proc == pi)
        if not len(sm):
            continue
        addr, when = a.addr[sm], a.t[sm]
        tm = np.flatnonzero(T.proc == pi)
        if len(tm):
            # One-page records by page number; range records by covering.
            single = tm[t["pages"][tm] <= 1]
            rng = tm[t["pages"][tm] > 1]
            j = last_at_or_before(
                (t["addr"][single] >> shift).astype(np.int64),
                t["t"][single],
                (addr >> shift).astype(np.int64),
                when,
            )
            got = np.where(j >= 0, single[np.maximum(j, 0)], -1) if len(single) else j
            if len(rng):
                lo = t["addr"][rng]
                hi = lo + t["pages"][rng].astype(np.uint64) * np.uint64(ps)
                jr = latest_covering(lo, hi, t["t"][rng], addr, when)
                gr = np.where(jr >= 0, rng[np.maximum(jr, 0)], -1)
                later = (gr >= 0) & ((got < 0) | (t["t"][np.maximum(gr, 0)] > t["t"][got]))
                got = np.where(later, gr, got)
            out.touch[sm] = got
        pm = np.flatnonzero(P.proc == pi)
        mb = pm[pr["what"][pm] == NP_MBIND]
        if len(mb):
            hi = pr["addr"][mb] + pr["len"][mb]
            j = latest_covering(pr["addr"][mb], hi, pr["t"][mb], addr, when)
            hit = j >= 0
            out.mbind_bound[sm[hit]] = _bound(
                pr["mode"][mb][j[hit]], pr["policy_nodes"][mb][j[hit]]
            )
        mv = pm[pr["what"][pm] == NP_MOVE]
        if len(mv):
            hi = pr["addr"][mv] + pr["len"][mv] * np.uint64(ps)
            j = latest_covering(pr["addr"][mv], hi, pr["t"][mv], addr, when)
            hit = j >= 0
            out.moved[sm[hit]] = True
            out.moved_node[sm[hit]] = single_node(pr["policy_nodes"][mv][j[hit]])
    return out


def analyze(run: RunDir, opts: Options | None = None) -> dict:
    """The `lenses.numa` object of the report (full tables, sorted by accesses desc)."""
    opts = opts or Options()
    if not recorded(run):
        have = ", ".join(run.lenses) if run.lenses else "none"
        raise LocusError(f"lens 'numa' was not recorded in {run.path} (recorded: {have})")
    notes: list[str] = []
    th = Threads(run)
    ct_list = [p.comm_threads() for p in run.procs]
    ct = np.concatenate(ct_list) if ct_list else np.zeros(0)
    for i, c in enumerate(ct_list):
        th.lookup(np.full(len(c), i, dtype=np.int64), c["tid"])
    cfg = _config(run, ct, notes)
    sc = scaling(cfg)
    meta_numa = run.meta.get("numa")
    topo = Topology(run, meta_numa if isinstance(meta_numa, dict) else {}, notes)
    ps = cfg["page_size"]

    a = _accesses(run, sc["scale"], notes)
    # numa.touch.bin: first touches, placements (the first write to a page first touched
    # by a read) and, apart, the census of each allocation's pages at its free or at exit.
    T = _load(run, "numa.touch.bin", NUMA_TOUCH_DTYPE, notes)
    final = (T.rec["flags"] & NT_FINAL) != 0
    FIN = _Cols(T.proc[final], T.rec[final])
    T = _Cols(T.proc[~final], T.rec[~final])
    P = _load(run, "numa.pins.bin", NUMA_PIN_DTYPE, notes)
    t = T.rec
    first = (t["flags"] & NT_PLACE) == 0
    a_k = th.lookup(a.proc, a.tid)
    t_k = th.lookup(T.proc, t["tid"])
    bind = _Binding(th, P, topo)
    n = len(a.t)

    # Touches: was the toucher pinned (its mask at the touch, recorded by the runtime, else
    # the pinning log), or bound by its memory policy?
    t_mask = t["nodes"].astype(np.uint64)
    miss = t_mask == 0
    if miss.any():
        t_mask[miss] = bind.mask(t_k[miss], t["t"][miss])
    t_pinned = (single_node(t_mask) >= 0) | bind.policy_bound(t_k, t["t"])
    t_pages = t["pages"].astype(np.float64)
    t_pages[t_pages == 0] = 1
    t_node = t["node"].astype(np.int64)
    # A huge page's first touch counts once (its base pages still count in placements).
    t_huge = (t["flags"] & NT_HUGE) != 0
    t_first_w = np.where(t_huge, 1.0, t_pages)

    pg = _pages(run, a, T, P, ps)
    has_t = pg.touch >= 0
    ti = np.maximum(pg.touch, 0)
    stack = a.stack

    # The page's node: the access's (move_pages at the access); under emulation, the
    # emulated node its first toucher placed it on; when unknown, where move_pages put it
    # or where its first touch landed.
    fallback = 0
    if cfg["emulated"]:
        pn = np.where(has_t, t_node[ti], -1) if len(t) else np.full(n, -1, dtype=np.int64)
    else:
        pn = a.node.copy()
        want = (pn < 0) & ~stack
        fb_move = want & (pg.moved_node >= 0)
        pn[fb_move] = pg.moved_node[fb_move]
        fb_touch = want & ~fb_move & has_t
        if len(t):
            fb_touch &= t_node[ti] >= 0
            pn[fb_touch] = t_node[ti][fb_touch]
        fallback = _num(a.w[fb_move | fb_touch].sum())
    pn[stack] = -1
    # The thread's binding at the access: recorded with it (exact), else the pinning log.
    mask = a.mask.copy()
    from_log = mask == 0
    if from_log.any():
        mask[from_log] = bind.mask(a_k[from_log], a.t[from_log])
    tn = single_node(mask)
    tp = tn >= 0
    seen = np.concatenate([pn[pn >= 0], t_node[t_node >= 0], tn[tp]])
    for node in sorted(set(np.unique(seen).tolist()) - set(topo.ids)):
        topo.add(node)
    # The page's pinned state: as the runtime saw it (exact), else from its touch record
    # (none: static data, brk heap... count as pinned); mbind and move_pages pin it.
    p_pinned = a.unpinned_page != 1
    look = (a.unpinned_page < 0) & has_t
    if len(t):
        p_pinned[look] = t_pinned[ti[look]]
    p_pinned |= pg.mbind_bound | pg.moved

    known = pn >= 0
    pnc = np.where(known, pn, 0)
    tnc = np.where(tp, tn, 0)
    mo = topo.memory_only[pnc]
    both = np.where(
        mo,
        np.where(topo.mo_local[tnc, pnc], F["memory_only_local"], F["memory_only_remote"]),
        np.where(pnc == tnc, F["local"], F["remote"]),
    )
    cls = np.where(
        tp,
        np.where(p_pinned, both, F["unpinned_page"]),
        np.where(p_pinned, F["unpinned_thread"], F["unpinned_both"]),
    )
    cls = np.where(known, cls, F["unknown"])
    cls[stack] = STACK

    # Heap blocks of the accesses and touches.
    blocks, b_of_a, b_of_t = _blocks(run, a, T, ps)

    # One event list: accesses (weight: scale or count) and first touches (weight: pages).
    t_field = np.where(t_pinned, F["first_touch"], F["unpinned_first_touch"])
    ns = ~stack
    ev = {
        "proc": np.concatenate([a.proc[ns], T.proc[first]]),
        "ip": np.concatenate([a.ip[ns], t["ip"][first]]),
        "caller": np.concatenate([a.caller[ns], t["caller"][first].astype(np.uint64)]),
        "field": np.concatenate([cls[ns], t_field[first]]).astype(np.int64),
        "w": np.concatenate([a.w[ns], t_first_w[first]]),
        "k": np.concatenate([a_k[ns], t_k[first]]),
        "block": np.concatenate([b_of_a[ns], b_of_t[first]]),
    }

    totals = {f: _num(v) for f, v in zip(FIELDS, _field_sums(ev["field"], ev["w"]))}
    totals["accesses"] = _num(a.w[ns].sum())
    totals["stack"] = _num(a.w[stack].sum())
    totals["unit"] = sc["unit"]
    totals["touch_unit"] = "pages"
    totals["huge_pages"] = _num(float((t_huge & first).sum()))

    # Access matrix: rows "unpinned" then the thread's node, columns the page's node.
    nid = len(topo.ids)
    cl = known & ~stack
    row = np.where(tp, 1 + topo.pos[tnc], 0)[cl]
    col = topo.pos[pnc][cl]
    vals = np.bincount(row * nid + col, weights=a.w[cl], minlength=(nid + 1) * nid)
    # Rows: threads run on CPU nodes only; memory-only nodes are columns, never rows.
    cpu_ids = [i for i in topo.ids if not topo.info[i]["memory_only"]]
    keep = [0, *(1 + int(topo.pos[i]) for i in cpu_ids)]
    access_matrix = {
        "rows": ["unpinned", *cpu_ids],
        "columns": list(topo.ids),
        "values": [[_num(v) for v in r] for r in vals.reshape(nid + 1, nid)[keep]],
    }
    # Where the threads really ran: the node of the sample's CPU.
    cpu_ok = (a.cpu >= 0) & (a.cpu < len(topo.cpu_node))
    cn = np.where(cpu_ok, topo.cpu_node[np.where(cpu_ok, a.cpu, 0)], -1)
    cn = np.where(cn < topo.size, cn, -1)
    ok_cpu = cl & (cn >= 0)
    r2 = topo.pos[np.where(ok_cpu, cn, 0)][ok_cpu]
    v2 = np.bincount(r2 * nid + topo.pos[pnc][ok_cpu], weights=a.w[ok_cpu], minlength=nid * nid)
    cpu_matrix = {
        "rows": cpu_ids,
        "columns": list(topo.ids),
        "values": [[_num(v) for v in r] for r in v2.reshape(nid, nid)[[k - 1 for k in keep[1:]]]],
    }

    names = Names(run, opts)
    threads = _thread_table(run, th, names, bind, ev)
    sites, site_keys = _site_rows(ev, names, opts)
    alloc_sites = _alloc_site_rows(ev, blocks, names, opts)
    # The node each access came from: a pinned thread's node, else its CPU's node.
    acc_node = np.where(tp, tn, cn)
    acc = {"k": a_k, "w": a.w, "cls": cls, "node": acc_node, "touch": pg.touch, "block": b_of_a}
    tch = {
        "k": t_k,
        "pages": t_pages,
        "node": t_node,
        "ip": t["ip"],
        "proc": T.proc,
        "block": b_of_t,
        "first": first,
        "huge": t_huge,
    }
    census = _census(FIN, blocks)
    allocations = _allocation_rows(run, th, names, opts, ev, blocks, acc, tch, census)
    pinning_log = _pin_rows(run, th, names, P)

    # Counters of the samplers.
    keys = ("signals", "samples", "skipped", "undecoded", "kernel", "dropped", "self_ns")
    counters = {k: int(ct[k].sum()) if len(ct) else 0 for k in keys}
    counters["records"] = int(n)
    thinned = thinning_noted(
        run,
        cfg["backend"],
        counters["samples"],
        notes,
        "each written one counts for those left out (its periods) in the access "
        "counts, which stay unbiased, with the standard error of the written ones",
    )

    site_of = (a.proc.astype(np.uint64) << np.uint64(48)) | a.ip
    advice = _advice(
        topo, th, threads, sites, site_keys, allocations, totals, sc, site_of, tn, pn, cls
    )
    _notes(run, cfg, sc, topo, bind, totals, counters, notes, a, has_t, fallback, T, len(ct))
    unseen = unseen_tasks_note(run, th)
    if unseen:
        notes.append(unseen)
    if int((~first).sum()):
        notes.append(
            f"{int(t_pages[~first].sum())} pages first touched by a read were placed by a later "
            "write (`LOCUS_NT_PLACE`): accesses after it count with the writer as the page's "
            "toucher"
        )
    if len(FIN.rec):
        notes.append(
            "allocations' `pages_per_node` come from the runtime's census of their pages at "
            "free or exit where it exists (`placement`: final), else from the first touches"
        )

    nodes = [
        {k: r[k] for k in ("id", "cpus", "mem_kb", "memory_only", "distances")} for r in topo.rows()
    ]
    return {
        "backend": cfg["backend"],
        "period": sc["period"],
        "period_unit": sc["period_unit"],
        "scale": sc["scale"],
        "unit": sc["unit"],
        "emulated": cfg["emulated"],
        "fake": cfg["fake"],
        "fake_file": cfg["fake_file"],
        "page_size": ps,
        "nodes": nodes,
        "cpu_node": topo.cpu_node.tolist(),
        "samples": int(n),
        "skipped": counters["skipped"],
        "thinning": thinned,
        "dropped": counters["dropped"],
        "counters": counters,
        "overhead_s": counters["self_ns"] / 1e9,
        "overhead_rse": None if cfg["backend"] == "exact" else handler_cost_rse(counters),
        "totals": totals,
        "access_matrix": access_matrix,
        "cpu_matrix": cpu_matrix,
        "sites": sites,
        "alloc_sites": alloc_sites,
        "threads": threads,
        "threads_total": len(th),
        "allocations": allocations,
        "pinning_log": pinning_log,
        "advice": advice,
        "notes": notes,
    }


def _field_sums(field: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.bincount(field, weights=w, minlength=NF)[:NF]


def _fields(v: np.ndarray) -> dict:
    """Row fields from a length-NF vector, plus `accesses` (the sampled, non-stack ones)."""
    d = {f: _num(x) for f, x in zip(FIELDS, v)}
    d["accesses"] = _num(v[ACCESS].sum())
    return d


def _grouped(inv: np.ndarray, ngroups: int, ev: dict, sel=None) -> np.ndarray:
    """(groups x NF) sums of the events' weights by field."""
    field, w = (ev["field"], ev["w"]) if sel is None else (ev["field"][sel], ev["w"][sel])
    keep = field < NF
    m = np.bincount(inv[keep] * NF + field[keep], weights=w[keep], minlength=ngroups * NF)
    return m.reshape(ngroups, NF)


def _order(m: np.ndarray) -> np.ndarray:
    """Rows by sampled accesses, then by first-touched pages (both descending)."""
    acc = m[:, ACCESS].sum(axis=1)
    touch = m[:, : len(TOUCH_FIELDS)].sum(axis=1)
    return np.lexsort((-touch, -acc))


# ---- heap blocks ----


@dataclass
class _Blocks:
    """The heap blocks of every process, indexed globally."""

    proc: np.ndarray
    rec: np.ndarray


def _blocks(run: RunDir, a: _Accesses, T: _Cols, ps: int):
    """Every process's heap blocks, and the block alive at its time of each access (its
    address; a counted access, known by its page only: the block holding the page's start,
    else its end) and touch (the allocation start the runtime recorded, else the page's
    start, else its end)."""
    parts, procs = [], []
    b_of_a = np.full(len(a.t), -1, dtype=np.int64)
    b_of_t = np.full(len(T.rec), -1, dtype=np.int64)
    off = 0
    for pi in range(len(run.procs)):
        b, bend = heap_blocks(inherited_allocs(run, pi))
        if not len(b):
            continue
        sm = np.flatnonzero(a.proc == pi)
        if len(sm):
            j = live_blocks(b, bend, a.addr[sm], a.t[sm])
            retry = np.flatnonzero((j < 0) & a.paged[sm])
            if len(retry):
                last = a.addr[sm][retry] + np.uint64(ps - 1)
                j[retry] = live_blocks(b, bend, last, a.t[sm][retry])
            b_of_a[sm] = np.where(j >= 0, j + off, -1)
        tm = np.flatnonzero(T.proc == pi)
        if len(tm):
            r = T.rec[tm]
            probe = np.where(
                (r["region"] != 0) & (r["region"] > r["addr"]), r["region"], r["addr"]
            ).astype(np.uint64)
            j = live_blocks(b, bend, probe, r["t"])
            retry = np.flatnonzero(j < 0)
            if len(retry):
                j[retry] = live_blocks(b, bend, r["addr"][retry] + np.uint64(ps - 1), r["t"][retry])
            b_of_t[tm] = np.where(j >= 0, j + off, -1)
        parts.append(b)
        procs.append(np.full(len(b), pi, dtype=np.int64))
        off += len(b)
    if parts:
        blocks = _Blocks(np.concatenate(procs), np.concatenate(parts))
    else:
        blocks = _Blocks(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=ALLOC_DTYPE))
    return blocks, b_of_a, b_of_t


# ---- tables ----


def _thread_table(run, th, names, bind: _Binding, ev) -> list[dict]:
    n = len(th)
    m = _grouped(ev["k"], n, ev)
    rows = thread_rows(run, th, names)
    add_os_names(rows, run, th)
    for k, r in enumerate(rows):
        mask, ncpus, changes = bind.last(k)
        allowed = mask_nodes(mask)
        r.update(
            nodes_allowed=allowed,
            pinned=len(allowed) == 1,
            node=allowed[0] if len(allowed) == 1 else None,
            cpus=ncpus or None,
            binding_changes=changes,
            recorded_binding=k not in bind.no_record,
        )
        r.update(_fields(m[k]))
    return rows


def _site_rows(ev, names, opts) -> tuple[list[dict], list[list[tuple[int, int]]]]:
    """Rows per source line of the accessing and touching instructions; and the (proc, ip)
    keys merged into each row (the advice looks at their accesses)."""
    if not len(ev["ip"]):
        return [], []
    inv, first = group(ev["proc"], ev["ip"])
    m = _grouped(inv, len(first), ev)
    order = _order(m)[: opts.top_sites]
    keys = [(int(ev["proc"][first[j]]), int(ev["ip"][first[j]])) for j in order]
    names.code([k for k in keys if k[1]])
    merged: dict[tuple, dict] = {}
    members: dict[tuple, list] = {}
    sums: dict[tuple, np.ndarray] = {}
    for j, (p, a) in zip(order.tolist(), keys):
        s = names.site(p, a) if a else {"function": "?", "file": "", "line": 0}
        key = (s["function"], s["file"], s["line"])
        if key not in merged:
            merged[key] = dict(s, address=f"{a:#x}")
            sums[key] = np.zeros(NF)
            members[key] = []
        sums[key] += m[j]
        members[key].append((p, a))
    rows, mem = [], []
    for key in sorted(merged, key=lambda k: (-sums[k][ACCESS].sum(), -sums[k][:2].sum())):
        rows.append(dict(merged[key], **_fields(sums[key])))
        mem.append(members[key])
    _site_callers(rows, mem, ev, names)
    return rows, mem


def _site_callers(rows: list[dict], mem: list, ev: dict, names) -> None:
    """Of each site in a system library (comm.md's "Callers of library code"): `callers`,
    the program's calls that led to its sampled accesses, and `touch_callers`, to its first
    touches, each with its share of the site's accesses (or first-touched pages)."""
    field = ev["field"]
    row = np.full(len(field), -1, dtype=np.int64)
    has = ev["caller"] != 0
    if has.any():  # each event's row, by its (process, instruction)
        row_of = {k: i for i, keys in enumerate(mem) for k in keys}
        p, ip = ev["proc"][has], ev["ip"][has]
        inv, first = group(p, ip)
        at = np.array([row_of.get((int(p[f]), int(ip[f])), -1) for f in first], dtype=np.int64)
        row[has] = at[inv]
    acc = (field >= ACCESS.start) & (field < ACCESS.stop)
    touch = (field == F["first_touch"]) | (field == F["unpinned_first_touch"])
    for key, sel, total_of in (
        ("callers", acc, lambda r: r["accesses"]),
        ("touch_callers", touch, lambda r: r["first_touch"] + r["unpinned_first_touch"]),
    ):
        site_callers(
            rows, key, np.where(sel, row, -1), ev["proc"], ev["caller"], ev["w"], total_of, names
        )


def _alloc_frames(names, keys: list[tuple[int, int, int]]) -> list[tuple]:
    """The call stack (stacks.bin frames) of each (proc, site, stack id), () where the run
    has none (no --call-stack); the sites and frames symbolized (return addresses)."""
    tables: dict[int, dict] = {}
    out = []
    for p, _site, sid in keys:
        if sid and p not in tables:
            tables[p] = stack_table(names.run.procs[p])
        out.append(tables[p].get(sid, ()) if sid else ())
    alloc_prefetch(names, [(p, a, fr) for (p, a, _sid), fr in zip(keys, out)])
    return out


def _alloc_site_rows(ev, blocks: _Blocks, names, opts) -> list[dict]:
    """Rows per allocation site: the source line of the allocating call (its return
    address; blocks from several call stacks or addresses of one line add up)."""
    has = ev["block"] >= 0
    if not has.any():
        return []
    b = ev["block"][has]
    br = blocks.rec
    inv, first = group(blocks.proc[b], br["site"][b], br["stack"][b])
    m = _grouped(inv, len(first), ev, sel=has)
    # Blocks and largest size per site.
    ub, ubi = np.unique(b, return_index=True)
    nblocks = np.bincount(inv[ubi], minlength=len(first))
    size = np.zeros(len(first))
    np.maximum.at(size, inv[ubi], br["size"][ub].astype(np.float64))
    order = _order(m)[: opts.top_sites]
    keys = [(int(blocks.proc[b[first[j]]]), int(br["site"][b[first[j]]])) for j in order]
    frames = _alloc_frames(
        names, [(p, a, int(br["stack"][b[first[j]]])) for j, (p, a) in zip(order, keys)]
    )
    merged: dict[tuple, dict] = {}
    for j, (p, a), fr in zip(order.tolist(), keys, frames):
        s, via = alloc_site(names, p, a, fr)
        key = (s["function"], s["file"], s["line"], tuple(via))
        row = merged.setdefault(
            key, dict(s, via=via, address=f"{a:#x}", blocks=0, size=0, _m=np.zeros(NF))
        )
        row["blocks"] += int(nblocks[j])
        row["size"] = max(row["size"], int(size[j]))
        row["_m"] = row["_m"] + m[j]
    rows = []
    for row in merged.values():
        mm = row.pop("_m")
        rows.append(dict(row, **_fields(mm)))
    rows.sort(key=lambda r: (-r["accesses"], -(r["first_touch"] + r["unpinned_first_touch"])))
    return rows


def _census(FIN: _Cols, blocks: _Blocks) -> dict[int, dict[int, float]]:
    """{block: {node: pages}} from the census records (`LOCUS_NT_FINAL`: `pages` pages of
    the allocation starting at `region` were on `node` at its free or at exit): the block
    at that address allocated last before the record."""
    out: dict[int, dict[int, float]] = {}
    r = FIN.rec
    if not len(r) or not len(blocks.proc):
        return out
    bkey = (blocks.proc.astype(np.uint64) << np.uint64(48)) | blocks.rec["addr"]
    fkey = (FIN.proc.astype(np.uint64) << np.uint64(48)) | r["region"]
    cand: dict[int, list[int]] = {}
    for i in np.flatnonzero(np.isin(bkey, fkey)).tolist():
        cand.setdefault(int(bkey[i]), []).append(i)
    for i in range(len(r)):
        best = None
        for j in cand.get(int(fkey[i]), []):
            if blocks.rec["t"][j] <= r["t"][i] and (
                best is None or blocks.rec["t"][j] >= blocks.rec["t"][best]
            ):
                best = j
        if best is not None:
            d = out.setdefault(best, {})
            node = int(r["node"][i])
            d[node] = d.get(node, 0.0) + float(r["pages"][i])
    return out


def _allocation_rows(
    run, th, names, opts, ev, blocks, acc: dict, tch: dict, census: dict
) -> list[dict]:
    """One row per heap block that was touched, sampled or counted by the census: where its
    pages are, who first-touched them (and where in the code), who accesses them from which
    node."""
    has = ev["block"] >= 0
    census_blocks = np.array(sorted(census), dtype=np.int64)
    if not has.any() and not len(census_blocks):
        return []
    used = np.union1d(np.unique(ev["block"][has]), census_blocks).astype(np.int64)
    inv = np.searchsorted(used, ev["block"][has])
    m = _grouped(inv.reshape(-1), len(used), ev, sel=has)
    order = _order(m)[: opts.top_allocations]
    pos = np.full(len(blocks.proc), -1, dtype=np.int64)
    pos[used[order]] = np.arange(len(order))
    br = blocks.rec
    keys = [(int(blocks.proc[used[j]]), int(br["site"][used[j]])) for j in order]
    frames = _alloc_frames(
        names, [(p, a, int(br["stack"][used[j]])) for j, (p, a) in zip(order, keys)]
    )

    s_k, s_w, cls, acc_node = acc["k"], acc["w"], acc["cls"], acc["node"]
    tidx, b_of_s = acc["touch"], acc["block"]
    t_k, t_pages, t_node = tch["k"], tch["pages"], tch["node"]
    t_ip, t_proc, b_of_t, first = tch["ip"], tch["proc"], tch["block"], tch["first"]
    # Placement from the touches, per (row, node): where first touches landed, a placement
    # (first write after a read) moving its pages from "not placed" (-2) to its node.
    tb = np.where(b_of_t >= 0, pos[np.maximum(b_of_t, 0)], -1)
    tsel = tb >= 0
    pl = tsel & ~first
    per_node = _sum_by(
        np.concatenate([tb[tsel], tb[pl]]),
        np.concatenate([t_node[tsel], np.full(int(pl.sum()), -2)]),
        w=np.concatenate([t_pages[tsel], -t_pages[pl]]),
    )
    # Huge pages placed, per (row, node): a first write, or the first write after a read.
    hsel = tsel & tch["huge"] & (t_node >= 0)
    per_huge = _sum_by(tb[hsel], t_node[hsel], w=np.ones(int(hsel.sum())))
    # First-touched pages per (row, thread) and per (row, thread, touch site).
    tsel &= first
    per_toucher = _sum_by(tb[tsel], t_k[tsel], w=t_pages[tsel])
    touch_ip = _sum_by(tb[tsel], t_k[tsel], t_proc[tsel], t_ip[tsel], w=t_pages[tsel])
    best_ip: dict[tuple, tuple] = {}
    for (r, k, p, ip), v in touch_ip.items():
        if (r, k) not in best_ip or v > best_ip[(r, k)][0]:
            best_ip[(r, k)] = (v, p, ip)
    names.code([(p, ip) for _v, p, ip in best_ip.values() if ip])
    # Sampled non-stack accesses per (row, accessing thread) and (row, node it ran on).
    sb = np.where(b_of_s >= 0, pos[np.maximum(b_of_s, 0)], -1)
    ssel = (sb >= 0) & (cls != STACK)
    per_accessor = _sum_by(sb[ssel], s_k[ssel], w=s_w[ssel])
    per_acc_node = _sum_by(sb[ssel], acc_node[ssel], w=s_w[ssel])
    # Accesses by another thread than the page's first toucher, from another node than the
    # page's: the initialisation and the computation split the block differently.
    tt = np.full(len(s_k), -1, dtype=np.int64)
    tnode = np.full(len(s_k), -1, dtype=np.int64)
    ok = tidx >= 0
    tt[ok], tnode[ok] = t_k[tidx[ok]], t_node[tidx[ok]]
    mism = ssel & (tt >= 0) & (tt != s_k) & (acc_node >= 0) & (tnode >= 0)
    mism &= acc_node != tnode
    pairs = _sum_by(sb[mism], tt[mism], s_k[mism], w=s_w[mism])

    def per_row(d: dict) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for key, v in d.items():
            out.setdefault(key[0], {})[key[1:] if len(key) > 2 else key[1]] = v
        return out

    per_node_r, per_toucher_r, per_huge_r = (
        per_row(per_node),
        per_row(per_toucher),
        per_row(per_huge),
    )
    per_accessor_r, per_acc_node_r, pairs_r = (
        per_row(per_accessor),
        per_row(per_acc_node),
        per_row(pairs),
    )
    rows = []
    for r, (j, (p, a)) in enumerate(zip(order.tolist(), keys)):
        rec = br[used[j]]
        s, via = alloc_site(names, p, a, frames[r])
        ft = []
        for k, v in sorted(per_toucher_r.get(r, {}).items(), key=lambda kv: -kv[1]):
            _v, tp_, ip = best_ip.get((r, k), (0, p, 0))
            ft.append(
                {
                    "index": k,
                    "tid": th.tid[k],
                    "pages": _num(v),
                    "site": site_str(names.site(tp_, ip)) if ip else "",
                }
            )
        acc = [
            {"index": k, "tid": th.tid[k], "accesses": _num(v)}
            for k, v in sorted(per_accessor_r.get(r, {}).items(), key=lambda kv: -kv[1])[:16]
        ]
        mm = [
            {"toucher": k1, "accessor": k2, "accesses": _num(v)}
            for (k1, k2), v in sorted(pairs_r.get(r, {}).items(), key=lambda kv: -kv[1])[:8]
        ]
        touched = {k: v for k, v in per_node_r.get(r, {}).items() if v > 0}
        final_nodes = census.get(int(used[j]))
        nodes = final_nodes if final_nodes is not None else touched
        rows.append(
            {
                "address": f"{int(rec['addr']):#x}",
                "pid": run.procs[p].pid,
                "size": int(rec["size"]),
                "site": site_str(s) if a else "",
                **s,
                "via": via,
                "t": float(run.procs[p].seconds(np.array([rec["t"]]))[0]),
                "pages": _num(sum(per_toucher_r.get(r, {}).values())),
                "pages_per_node": {str(k): _num(v) for k, v in sorted(nodes.items()) if k >= 0},
                "unplaced_pages": _num(sum(v for k, v in nodes.items() if k < 0)),
                "placement": "final" if final_nodes is not None else "first_touch",
                "touched_pages_per_node": {
                    str(k): _num(v) for k, v in sorted(touched.items()) if k >= 0
                },
                "huge_pages_per_node": {
                    str(k): _num(v) for k, v in sorted(per_huge_r.get(r, {}).items())
                },
                "first_touch_threads": ft,
                "accessed_by": acc,
                "accesses_from_nodes": {
                    str(k): _num(v) for k, v in sorted(per_acc_node_r.get(r, {}).items()) if k >= 0
                },
                "mismatched": mm,
                "mismatched_accesses": _num(sum(pairs_r.get(r, {}).values())),
                **_fields(m[j]),
            }
        )
    return rows


def _sum_by(*cols, w) -> dict[tuple, float]:
    """{(c0, c1, ...): sum of w} over rows of integer columns (any sign): one bincount over
    the mixed-radix index when the columns' ranges allow, else grouped by sorting."""
    if not len(w):
        return {}
    cols = [np.asarray(c).astype(np.int64) for c in cols]
    lows = [int(c.min()) for c in cols]
    spans = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows)]
    if int(np.prod(spans, dtype=np.float64)) <= 1 << 22:
        idx = np.zeros(len(w), dtype=np.int64)
        for c, lo, sp in zip(cols, lows, spans):
            idx = idx * sp + (c - lo)
        sums = np.bincount(idx, weights=w)
        out = {}
        for g in np.flatnonzero(np.bincount(idx)).tolist():
            key, rest = [], g
            for lo, sp in zip(reversed(lows), reversed(spans)):
                key.append(rest % sp + lo)
                rest //= sp
            out[tuple(reversed(key))] = float(sums[g])
        return out
    inv, first = group(*[c - lo for c, lo in zip(cols, lows)])
    sums = np.bincount(inv, weights=w, minlength=len(first))
    return {tuple(int(c[i]) for c in cols): float(sums[g]) for g, i in enumerate(first.tolist())}


def _pin_rows(run, th, names, P: _Cols) -> list[dict]:
    r = P.rec
    if not len(r):
        return []
    keys = [(int(p), int(ip)) for p, ip in zip(P.proc.tolist(), r["ip"].tolist()) if ip]
    names.code(keys, return_addresses=True)
    secs = np.zeros(len(r))
    for pi in np.unique(P.proc).tolist():
        m = P.proc == pi
        secs[m] = run.procs[pi].seconds(r["t"][m])
    out = []
    for i in np.lexsort((np.arange(len(r)), secs)).tolist():
        x = r[i]
        what = int(x["what"])
        mode = int(x["mode"])
        policy = what in (NP_MEMPOLICY, NP_MBIND, NP_MOVE)
        p = int(P.proc[i])
        ip = int(x["ip"])
        length = int(x["len"])
        out.append(
            {
                "t": float(secs[i]),
                "pid": run.procs[p].pid,
                "tid": int(x["tid"]),
                "caller": int(x["caller"]),
                "what": WHAT_NAMES.get(what, str(what)),
                "cpus": int(x["ncpus"]) if what in AFFINITY or what == NP_END else None,
                "nodes": mask_nodes(x["nodes"]) if not policy or x["nodes"] else [],
                "mode": MODE_NAMES.get(mode, str(mode)) if mode != MODE_NONE else None,
                "policy_nodes": mask_nodes(x["policy_nodes"]) if policy else [],
                "addr": f"{int(x['addr']):#x}" if what in (NP_MBIND, NP_MOVE) else None,
                "len": length if what in (NP_MBIND, NP_MOVE) else None,
                "site": site_str(names.site(p, ip)) if ip else "",
            }
        )
    return out


# ---- advice ----


def _pct(a, b) -> float:
    return 100.0 * a / b if b else 0.0


def _tname(th: Threads, k: int) -> str:
    return f"thread {k} (tid {th.tid[k]})"


def _advice(
    topo, th, threads, sites, site_keys, allocations, totals, sc, sample_site, tn, pn, cls
) -> list[dict]:
    """NUMAPROF's classic mistakes, each with the place to fix it. A row needs
    ADVICE_MIN_SAMPLES samples: advice from a handful would be noise."""
    out: list[dict] = []
    scale = sc["scale"] or 1.0
    what = "accesses" if sc["period"] is None and sc["unit"] == "accesses" else "sampled accesses"
    cpu_node_count = sum(1 for i in topo.ids if not topo.info[i]["memory_only"])
    sampled = totals["accesses"] - totals["unknown"]

    # Unpinned threads.
    unp_acc = totals["unpinned_thread"] + totals["unpinned_both"]
    touched = totals["first_touch"] + totals["unpinned_first_touch"]
    unpinned = [
        r
        for r in threads
        if not r["pinned"] and (r["accesses"] or r["first_touch"] or r["unpinned_first_touch"])
    ]
    if (
        cpu_node_count > 1
        and unpinned
        and (_pct(unp_acc, sampled) >= 10 or _pct(totals["unpinned_first_touch"], touched) >= 10)
    ):
        out.append(
            {
                "kind": "unpinned_threads",
                "site": "",
                "text": f"threads {ranges([r['index'] for r in unpinned])} may run on several "
                f"nodes ({_pct(unp_acc, sampled):.0f} % of the {what}, "
                f"{_pct(totals['unpinned_first_touch'], touched):.0f} % of the first-touched "
                "pages): pin them (OMP_PROC_BIND=close OMP_PLACES=cores, or record with "
                "--bind compact or scatter) so that each thread stays by the pages it touched",
            }
        )

    # Serial initialisation; allocation order != access order.
    for a in allocations:
        if len(out) >= MAX_ADVICE:
            break
        ft = a["first_touch_threads"]
        if not ft or a["accesses"] / scale < ADVICE_MIN_SAMPLES:
            continue
        pages = a["pages"]
        name = _alloc_name(a)
        top = ft[0]
        nodes = [int(k) for k, v in a["accesses_from_nodes"].items() if v >= 0.1 * a["accesses"]]
        if pages >= 2 and top["pages"] >= 0.9 * pages and len(nodes) >= 2:
            placed = ",".join(a["pages_per_node"]) or "?"
            where = top["site"] or "its first-touch site"
            out.append(
                {
                    "kind": "serial_first_touch",
                    "site": top["site"],
                    "text": f"{name} was first-touched by {_tname(th, top['index'])} alone "
                    f"({_pct(top['pages'], pages):.0f} % of its {_num(pages)} pages, on node "
                    f"{placed}) but is accessed from nodes {ranges(nodes)}: initialise it in "
                    f"parallel at {where} (the first-touch site), with the same schedule as "
                    "the compute loop",
                }
            )
            continue
        mism = a["mismatched_accesses"]
        if mism and mism >= 0.5 * a["accesses"]:
            first: dict[int, dict] = {}
            for x in a["mismatched"]:
                first.setdefault(x["toucher"], x)
            who = "; ".join(
                f"pages first-touched by {_tname(th, x['toucher'])} are accessed mostly by "
                f"{_tname(th, x['accessor'])}"
                for x in list(first.values())[:3]
            )
            out.append(
                {
                    "kind": "touch_order",
                    "site": top["site"],
                    "text": f"{name}: {_pct(mism, a['accesses']):.0f} % of its {what} "
                    "are by another thread than the page's first toucher, from another node "
                    f"({who}): first-touch each part from the thread that computes on it "
                    "(same loop bounds and schedule in the initialisation and compute loops)",
                }
            )

    # Sites whose accesses are mostly remote (the heaviest few).
    remote = (cls == F["remote"]) | (cls == F["memory_only_remote"])
    n_remote = 0
    for row, keys in zip(sites, site_keys):
        if len(out) >= MAX_ADVICE or n_remote >= MAX_REMOTE_SITES:
            break
        rem = row["remote"] + row["memory_only_remote"]
        pinned = rem + row["local"] + row["memory_only_local"]
        if not rem or rem < 0.5 * pinned or row["accesses"] / scale < ADVICE_MIN_SAMPLES:
            continue
        want = np.array([(p << 48) | ip for p, ip in keys], dtype=np.uint64)
        sel = np.flatnonzero(remote & np.isin(sample_site, want))
        how = ""
        if len(sel):
            inv, firsts = group(tn[sel], pn[sel])
            b = sel[firsts[np.argmax(np.bincount(inv))]]
            how = f" (mostly threads on node {int(tn[b])} accessing pages on node {int(pn[b])})"
        where = site_str(row)
        n_remote += 1
        out.append(
            {
                "kind": "remote_site",
                "site": where,
                "text": f"{where}: {_pct(rem, pinned):.0f} % of its {what} by pinned "
                f"threads to pinned pages are remote{how}: first-touch that data from the "
                "threads that use it, or run these threads on the data's node",
            }
        )
    return out


def _alloc_name(a: dict) -> str:
    size = a["size"]
    sz = f"{size} B"
    for scale, u in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= scale:
            sz = f"{size / scale:.1f} {u}"
            break
    where = f" allocated at {a['site']}" if a["site"] else ""
    return f"the {sz} block at {a['address']}{where}"


# ---- notes ----


def _notes(
    run, cfg, sc, topo, bind, totals, counters, notes, a: _Accesses, has_t, fallback, T, n_counters
) -> None:
    n, stack, s_node = len(a.t), a.stack, a.node
    if cfg["emulated"]:
        if cfg["fake_file"]:
            how = f"--fake-numa {cfg['fake_file']}): the file's {len(topo.ids)} nodes play"
        else:
            k = f" {cfg['fake']}" if cfg["fake"] else ""
            how = f"--fake-numa{k}): the CPUs are split into {len(topo.ids)} blocks that play"
        notes.insert(
            0,
            f"EMULATED topology ({how} the nodes, and a page's node is the emulated node of "
            "the CPU that first touched it; placement and pinning are analysed as on a real "
            "NUMA machine, but no access is really remote (no latency difference)",
        )
    if sc["unit"] == "samples" and sc["period_unit"] == "ns":
        notes.append(
            f"time-based sampling ({cfg['backend']}, one sample per {sc['period']} ns of a "
            "thread's CPU time): access counts are samples, not accesses; their shares "
            "estimate the shares of time spent in each kind of access (slow remote accesses "
            "weigh more than their number)"
        )
    elif sc["period_unit"] == "accesses":
        notes.append(f"count-based sampling: each sample stands for {sc['period']} accesses")
    if n and cfg["backend"] != "exact":
        k = n - int(stack.sum())
        if k:
            notes.append(
                f"counts come from {k} sampled non-stack accesses: a share p of them has a "
                f"standard error of about sqrt(p(1-p)/{k}), at most ±{50 / k**0.5:.2g} points "
                "(p = 50 %); a row with fewer than 10 samples is indicative only"
            )
    unit = sc["unit"]
    if n == 0:
        notes.append(
            "no access was sampled or counted (comm.samples.bin and numa.counts.bin are empty "
            "or missing)"
        )
    if totals["stack"]:
        notes.append(
            f"stack accesses ({totals['stack']} {unit}) are left out of the classes (as "
            "NUMAPROF does: a thread's stack is local to it); they are counted in `stack`"
        )
    unk = ~stack & (s_node < 0)
    if totals["unknown"]:
        why = []
        if cfg["emulated"]:
            why.append("under emulation a page's node is known only from its touch record")
        absent = _num(a.w[unk & (s_node == -2)].sum())
        if absent:
            why.append(f"{absent} {unit} on pages not present (not placed yet) at the access")
        notes.append(
            f"{totals['unknown']} {unit} have no known page node (`unknown`)"
            + (": " + "; ".join(why) if why else "")
        )
    if fallback:
        notes.append(
            f"{fallback} {unit} had no node from move_pages at the access: their page's node "
            "is where move_pages moved it or where its first touch landed"
        )
    no_touch = _num(a.w[~stack & ~has_t].sum()) if n else 0
    if no_touch:
        # Under emulation a page's node is its touch record's: without one it is unknown.
        how = (
            "under emulation their node is unknown (only a touch record places a page), so "
            "they are in `unknown`"
            if cfg["emulated"]
            else "they count as pinned pages (or `unknown` where their node is not known)"
        )
        notes.append(
            f"{no_touch} {unit} hit pages without a first-touch record (static data, brk heap, "
            f"memory touched before the runtime started or not tracked): {how}"
        )
    if not len(T.rec):
        notes.append("no first touch was recorded (no fresh anonymous memory was touched)")
    elif int(((T.rec["flags"] & NT_RANGE) != 0).sum()):
        r = T.rec[(T.rec["flags"] & NT_RANGE) != 0]
        notes.append(
            f"{int(r['pages'].sum())} pages were opened in ranges (a thread touching page "
            "after page of a growing block, or the map-count budget reached): each range's "
            "pages are attributed to the thread that opened it"
        )
    if bind.no_record and len(topo.ids) > 1:
        notes.append(
            f"{len(bind.no_record)} thread(s) have no binding record: assumed to run where "
            "their process's main thread could (else on every node)"
        )
    if len(topo.ids) == 1 and not cfg["emulated"]:
        notes.append(
            "one NUMA node: every access of a pinned thread is local; record with "
            "--fake-numa N to check placement and pinning logic on this machine"
        )
    if counters["dropped"]:
        notes.append(f"{counters['dropped']} sample record(s) could not be written (dropped)")
    if not n_counters:
        notes.append(
            "no per-thread sampler counters (comm.threads.bin): skipped samples and overhead "
            "are unknown (killed run?)"
        )
    if not run.complete:
        notes.append("incomplete run: the last numa records of a killed process may be missing")
