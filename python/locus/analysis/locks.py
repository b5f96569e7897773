"""The locks lens: waits and holds per lock, call site and thread; the critical path; the
dependency-loss model (docs/lenses/locks.md documents every number).

Counts (acquisitions, contended, failed) come exactly from the per-thread counts tables.
Times come from the events; an event of weight w stands for w critical sections of its
thread (adaptive sampling of very hot locks), so time totals are sum(w * measured) and
are flagged `estimated` when any w > 1.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from locus.analysis import critical_path
from locus.analysis.common import drop_damaged, lock_of, task_service_ns
from locus.analysis.kinds import (
    BARRIER,
    EV_CONTENDED,
    EV_FAILED,
    EV_UNRELEASED,
    FAMILY_NAMES,
    HOLD_KINDS,
    INSTANT_KINDS,
    JOIN,
    SPIN,
    WAIT_KINDS,
    family_of,
)
from locus.rundir import PID_MAX, RunDir
from locus.symbolize import split_offset

LK_KIND_MAX = 16  # LOCUS_LK_KIND_MAX
_HOLD = np.zeros(LK_KIND_MAX, dtype=bool)
_HOLD[list(HOLD_KINDS)] = True
_WAIT = np.zeros(LK_KIND_MAX, dtype=bool)
_WAIT[list(WAIT_KINDS)] = True
_INSTANT = np.zeros(LK_KIND_MAX, dtype=bool)
_INSTANT[list(INSTANT_KINDS)] = True


def group(*cols) -> tuple[np.ndarray, np.ndarray]:
    """(inverse, first-row index of each group) of rows keyed by integer columns; packs
    the columns into one uint64 when their bit widths allow (the usual case)."""
    n = len(cols[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    cols = [np.asarray(c).astype(np.uint64) for c in cols]
    widths = [max(int(c.max()).bit_length(), 1) for c in cols]
    if sum(widths) <= 64:
        key = np.zeros(n, dtype=np.uint64)
        for c, w in zip(cols, widths):
            key = (key << np.uint64(w)) | c
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    else:
        _, first, inv = np.unique(
            np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True
        )
    return inv.reshape(-1).astype(np.int64), first


@dataclass
class LockEvents:
    """All lock events of the run, columns concatenated over processes."""

    proc: np.ndarray
    tid: np.ndarray
    kind: np.ndarray
    flags: np.ndarray
    weight: np.ndarray
    lock: np.ndarray
    site: np.ndarray
    obj: np.ndarray
    t_req: np.ndarray  # seconds since the run origin
    t_acq: np.ndarray
    t_rel: np.ndarray
    stack: np.ndarray  # id in the process's stacks.bin, 0 = none (no --call-stack)
    lock_id: np.ndarray  # index of (proc, lock, family), set by the analysis
    thread_rank: np.ndarray  # rank of (proc, tid); events are sorted by (rank, t_acq)


@dataclass
class Threads:
    proc: np.ndarray
    tid: np.ndarray
    parent: np.ndarray
    start: np.ndarray
    end: np.ndarray


def load_events(run: RunDir, notes: list[str] | None = None) -> LockEvents:
    cols: dict[str, list] = {
        k: [] for k in LockEvents.__dataclass_fields__ if k not in ("lock_id", "thread_rank")
    }
    for i, p in enumerate(run.procs):
        e = p.lock_events()
        # Rows the runtime cannot have written (a damaged file): a kind it does not define
        # (it indexes tables), a tid no pid can be.
        ok = (e["kind"] < LK_KIND_MAX) & (e["tid"] > 0) & (e["tid"] <= PID_MAX)
        e = drop_damaged(p, "locks.events.bin", e, ok, notes)
        if len(e) == 0:
            continue
        cols["proc"].append(np.full(len(e), i, dtype=np.int32))
        for k in ("tid", "kind", "flags", "lock", "site", "obj", "stack"):
            cols[k].append(e[k])
        cols["weight"].append(np.maximum(e["weight"], 1).astype(np.int64))
        for k in ("t_req", "t_acq", "t_rel"):
            cols[k].append(p.seconds(e[k]))
    if not cols["proc"]:
        z = {
            "proc": np.int32,
            "tid": np.uint32,
            "kind": np.uint16,
            "flags": np.uint16,
            "weight": np.int64,
            "lock": np.uint64,
            "site": np.uint64,
            "obj": np.uint64,
            "stack": np.uint32,
        }
        arrs = {k: np.zeros(0, dtype=z.get(k, np.float64)) for k in cols}
    else:
        arrs = {k: np.concatenate(v) for k, v in cols.items()}
    n = len(arrs["proc"])
    rank = np.zeros(n, dtype=np.int64)
    if n:
        # Thread-major, time-minor order: per-thread passes (nesting, the path walk, path
        # overlaps) then need no sort of their own and search with cache-friendly queries.
        rank, _ = group(arrs["proc"], arrs["tid"])
        t = np.round((arrs["t_acq"] - arrs["t_acq"].min()) * 1e9).astype(np.int64)
        tb = max(int(t.max()).bit_length(), 1)
        if tb + max(int(rank.max()).bit_length(), 1) <= 62:
            o = np.argsort((rank << tb) | t)
        else:
            o = np.lexsort((t, rank))
        arrs = {k: v[o] for k, v in arrs.items()}
        rank = rank[o]
    return LockEvents(**arrs, lock_id=np.zeros(n, dtype=np.int64), thread_rank=rank)


def load_threads(run: RunDir, ev: LockEvents) -> Threads:
    """Threads of threads.bin, plus a row for any thread seen only in events. Unknown ends
    (killed) become the last event of the thread or the run's end."""
    proc, tid, parent, start, end = [], [], [], [], []
    dur = run.duration_s
    for i, p in enumerate(run.procs):
        t = p.threads
        proc.append(np.full(len(t), i, dtype=np.int32))
        tid.append(t["tid"])
        parent.append(t["parent_tid"])
        start.append(p.thread_start_s)
        end.append(p.thread_end_s.copy())
    th = Threads(
        *(np.concatenate(x) if x else np.zeros(0) for x in (proc, tid, parent, start, end))
    )
    th.proc = th.proc.astype(np.int32)
    th.tid = th.tid.astype(np.uint32)
    th.parent = th.parent.astype(np.uint32)
    th.start = th.start.astype(np.float64)
    th.end = th.end.astype(np.float64)
    if len(ev.proc):
        inv, first = group(ev.proc, ev.tid)
        last = np.full(len(first), -np.inf)
        np.maximum.at(last, inv, ev.t_rel)
        firstt = np.full(len(first), np.inf)
        np.minimum.at(firstt, inv, ev.t_req)
        known = set(zip(th.proc.tolist(), th.tid.tolist()))
        key = list(zip(ev.proc[first].tolist(), ev.tid[first].tolist()))
        missing = [j for j, k in enumerate(key) if k not in known]
        if missing:
            m = np.asarray(missing)
            th.proc = np.concatenate([th.proc, ev.proc[first[m]].astype(np.int32)])
            th.tid = np.concatenate([th.tid, ev.tid[first[m]].astype(np.uint32)])
            th.parent = np.concatenate([th.parent, np.zeros(len(m), dtype=np.uint32)])
            th.start = np.concatenate([th.start, firstt[m]])
            th.end = np.concatenate([th.end, last[m]])
        # A thread whose end is unknown ran at least to its last event.
        nan = np.isnan(th.end)
        if nan.any():
            lk = dict(zip(key, last.tolist()))
            for j in np.flatnonzero(nan):
                th.end[j] = max(dur, lk.get((int(th.proc[j]), int(th.tid[j])), dur))
    th.end[np.isnan(th.end)] = dur
    th.end = np.maximum(th.end, th.start)
    return th


def _counts(run: RunDir, ev: LockEvents):
    """Exact counts rows (proc, tid, lock, site, kind, acquisitions, contended, failed).
    A process without counts tables (killed before the first table was complete) gets
    counts estimated from its events."""
    rows = []
    derived = []
    for i, p in enumerate(run.procs):
        c = p.lock_counts()
        if len(c):
            rows.append(
                (
                    np.full(len(c), i, dtype=np.int32),
                    c["tid"],
                    c["lock"],
                    c["site"],
                    c["kind"],
                    c["acquisitions"].astype(np.int64),
                    c["contended"].astype(np.int64),
                    c["failed"].astype(np.int64),
                )
            )
            continue
        m = ev.proc == i
        if not m.any():
            continue
        derived.append(i)
        w = ev.weight[m]
        failed = (ev.flags[m] & EV_FAILED) != 0
        cont = (ev.flags[m] & EV_CONTENDED) != 0
        rows.append(
            (
                ev.proc[m],
                ev.tid[m],
                ev.lock[m],
                ev.site[m],
                ev.kind[m],
                np.where(failed, 0, w),
                np.where(cont & ~failed, w, 0),
                np.where(failed, w, 0),
            )
        )
    if not rows:
        z = np.zeros(0, dtype=np.int64)
        return (z.astype(np.int32), z, z.astype(np.uint64), z.astype(np.uint64), z, z, z, z), []
    out = tuple(np.concatenate([r[k] for r in rows]) for k in range(8))
    return out, derived


def _fmt_addr(a: int) -> str:
    return f"{a:#x}"


@dataclass
class Options:
    symbols: bool = True
    critical_path: bool = True


def analyze(run: RunDir, opts: Options | None = None) -> dict:
    """The `lenses.locks` object of the report (full tables, sorted by wait desc)."""
    opts = opts or Options()
    notes: list[str] = []
    ev = load_events(run, notes)
    th = load_threads(run, ev)
    (c_proc, c_tid, c_lock, c_site, c_kind, c_acq, c_cont, c_fail), derived = _counts(run, ev)
    duration = run.duration_s

    # Lock identities over events and counts (instants other than cond/sem are excluded).
    e_fam = family_of(ev.kind)
    c_fam = family_of(c_kind)
    c_keep = ~_INSTANT[np.clip(c_kind.astype(np.int64), 0, 15)]
    c_proc, c_tid, c_lock, c_site, c_kind = (
        c_proc[c_keep],
        c_tid[c_keep],
        c_lock[c_keep],
        c_site[c_keep],
        c_kind[c_keep],
    )
    c_acq, c_cont, c_fail, c_fam = c_acq[c_keep], c_cont[c_keep], c_fail[c_keep], c_fam[c_keep]
    all_proc = np.concatenate([ev.proc.astype(np.int64), c_proc.astype(np.int64)])
    all_lock = np.concatenate([ev.lock, c_lock.astype(np.uint64)])
    all_fam = np.concatenate([e_fam, c_fam])
    inv, first = group(all_proc, all_fam, all_lock)
    nlocks = len(first)
    ev.lock_id = inv[: len(ev.proc)]
    c_lid = inv[len(ev.proc) :]
    l_proc = all_proc[first]
    l_lock = all_lock[first]
    l_fam = all_fam[first]

    kind = ev.kind.astype(np.int64)
    failed = (ev.flags & EV_FAILED) != 0
    is_hold = _HOLD[kind] & ~failed
    is_wait_kind = _WAIT[kind] | _HOLD[kind]
    w = ev.weight.astype(np.float64)
    wait = np.where(is_wait_kind, np.maximum(ev.t_acq - ev.t_req, 0.0), 0.0)
    hold = np.where(is_hold, np.maximum(ev.t_rel - ev.t_acq, 0.0), 0.0)
    sampled = ev.weight > 1
    # Sites: (lock, site).
    all_lid = np.concatenate([ev.lock_id, c_lid])
    all_site = np.concatenate([ev.site, c_site.astype(np.uint64)])
    sinv, sfirst = group(all_lid, all_site) if len(all_lid) else (np.zeros(0, int), [])
    nsites = len(sfirst)
    e_sid, c_sid = sinv[: len(ev.lock_id)], sinv[len(ev.lock_id) :]
    s_lid = all_lid[sfirst] if nsites else np.zeros(0, int)
    s_site = all_site[sfirst] if nsites else np.zeros(0, np.uint64)
    w_wait, w_hold, wait_var = _ratio_weights(
        ev, e_sid, c_sid, is_hold, sampled, wait, (c_tid, c_acq, c_cont)
    )
    wwait, whold = w_wait * wait, w_hold * hold
    unreleased = ((ev.flags & EV_UNRELEASED) != 0) & is_hold

    # Critical path.
    if opts.critical_path and len(ev.proc):
        bc = _barrier_counts(run)
        cp = critical_path.compute(ev, th, bc)
    else:
        n = len(ev.proc)
        cp = critical_path.CriticalPath(np.zeros(n, bool), np.zeros(n), np.zeros(n, bool), [], 0.0)
    # A join is a dependency between threads, not a lock: the critical path follows it, but
    # its wait is reported apart (join_wait_s), so "waiting" means waiting on locks and
    # synchronisation objects.
    is_join_ev = kind == JOIN
    cwait_all = np.where(cp.jumped, np.maximum(ev.t_acq - ev.t_req, 0.0), 0.0)
    cwait = np.where(is_join_ev, 0.0, cwait_all)
    wwait_nj = np.where(is_join_ev, 0.0, wwait)

    def per(ids, n, vals):
        return np.bincount(ids, weights=vals, minlength=n) if len(ids) else np.zeros(n)

    def permax(ids, n, vals):
        out = np.zeros(n)
        if len(ids):
            np.maximum.at(out, ids, vals)
        return out

    lid = ev.lock_id
    L = {
        "acquisitions": per(c_lid, nlocks, c_acq),
        "contended": per(c_lid, nlocks, c_cont),
        "failed": per(c_lid, nlocks, c_fail),
        "wait_s": per(lid, nlocks, wwait),
        "wait_var": per(lid, nlocks, wait_var),
        "max_wait_s": permax(lid, nlocks, wait),
        "hold_s": per(lid, nlocks, whold),
        "max_hold_s": permax(lid, nlocks, hold),
        "timed": per(lid, nlocks, (is_wait_kind & ~_INSTANT[kind]).astype(float)),
        "estimated": per(lid, nlocks, sampled.astype(float)) > 0,
        "unreleased": per(lid, nlocks, unreleased.astype(float)),
        "critical_events": per(lid, nlocks, cp.critical.astype(float)),
        "critical_wait_s": per(lid, nlocks, cwait),
        "critical_hold_s": per(lid, nlocks, cp.hold_on_path_s),
    }
    is_instant_fam = np.isin(l_fam, [FAMILY_NAMES.index("create")])
    is_join_fam = l_fam == FAMILY_NAMES.index("join")
    rows_l = np.flatnonzero(~is_instant_fam & ~is_join_fam)
    order = rows_l[np.lexsort((-L["acquisitions"][rows_l], -L["wait_s"][rows_l]))]

    S = {
        "acquisitions": per(c_sid, nsites, c_acq),
        "contended": per(c_sid, nsites, c_cont),
        "failed": per(c_sid, nsites, c_fail),
        "wait_s": per(e_sid, nsites, wwait_nj),
        "hold_s": per(e_sid, nsites, whold),
        "critical_wait_s": per(e_sid, nsites, cwait),
        "estimated": per(e_sid, nsites, sampled.astype(float)) > 0,
    }
    s_real = ~_INSTANT[_kind_of_family(l_fam[s_lid])] if nsites else np.zeros(0, bool)
    s_keep = s_real & ~is_instant_fam[s_lid] & ~is_join_fam[s_lid]
    s_rows = np.flatnonzero(s_keep) if nsites else np.zeros(0, int)
    s_order = s_rows[np.lexsort((-S["acquisitions"][s_rows], -S["wait_s"][s_rows]))]

    # Threads.
    nth = len(th.tid)
    tkey = th.proc.astype(np.int64) << 32 | th.tid.astype(np.int64)
    tord = np.argsort(tkey)

    def thread_idx(proc, tid):
        k = proc.astype(np.int64) << 32 | tid.astype(np.int64)
        pos = np.minimum(np.searchsorted(tkey[tord], k), max(nth - 1, 0))
        ok = tkey[tord][pos] == k if nth else np.zeros(len(k), bool)
        return np.where(ok, tord[pos] if nth else 0, -1)

    e_th = thread_idx(ev.proc, ev.tid)
    c_th = thread_idx(c_proc, c_tid)
    okc = c_th >= 0
    T = {
        "acquisitions": per(c_th[okc], nth, c_acq[okc]),
        "contended": per(c_th[okc], nth, c_cont[okc]),
        "wait_s": per(e_th, nth, wwait_nj),
        "join_wait_s": per(e_th, nth, wwait - wwait_nj),
        "hold_combined_s": per(e_th, nth, whold),
        "hold_s": _union_hold(e_th, nth, ev, is_hold, whold),
        "critical_hold_s": per(e_th, nth, cp.hold_on_path_s),
    }
    blocking_wait = np.where(kind == SPIN, 0.0, wwait)
    T["blocking_wait_s"] = per(e_th, nth, blocking_wait)
    service, svc_note = _service(run, th, T["blocking_wait_s"])
    if svc_note:
        notes.append(svc_note)
    T["service_s"] = service

    # Dependency loss (Tudor & Teo).
    lock_blocking = float(np.where(is_join_ev, 0.0, blocking_wait).sum())
    loss = _dependency_loss(run, th, service, lock_blocking, duration, notes)

    # Names.
    names = _Names(run, opts.symbols)
    l_name = {}
    show = order[:5000]
    names.prefetch_locks(
        [(int(l_proc[i]), int(l_lock[i]), int(l_fam[i])) for i in show],
        ev,
        c_proc,
        c_lock,
        c_site,
        c_fam,
    )
    # Data symbols are looked up for the top locks only; init and first-use sites (cheap,
    # shared by many heap locks) name every lock.
    for i in order:
        l_name[i] = names.lock_name(int(l_proc[i]), int(l_lock[i]), int(l_fam[i]))
    lock_id_str = {int(i): f"L{r + 1}" for r, i in enumerate(order)}
    sshow = s_order[:5000]
    sites_loc = names.code_locs([(int(l_proc[s_lid[i]]), int(s_site[i])) for i in sshow])

    locks_out = []
    for i in order:
        locks_out.append(
            {
                "id": lock_id_str[int(i)],
                "name": l_name.get(i) or f"{FAMILY_NAMES[l_fam[i]]}@{_fmt_addr(int(l_lock[i]))}",
                "address": _fmt_addr(int(l_lock[i])),
                "kind": FAMILY_NAMES[int(l_fam[i])],
                "pid": run.procs[int(l_proc[i])].pid if run.procs else 0,
                "acquisitions": int(L["acquisitions"][i]),
                "contended": int(L["contended"][i]),
                "failed": int(L["failed"][i]),
                "wait_s": float(L["wait_s"][i]),
                "mean_wait_s": float(L["wait_s"][i] / max(L["contended"][i], 1)),
                "max_wait_s": float(L["max_wait_s"][i]),
                "wait_rse": (
                    float(np.sqrt(L["wait_var"][i]) / L["wait_s"][i]) if L["wait_s"][i] > 0 else 0.0
                ),
                "hold_s": float(L["hold_s"][i]),
                "mean_hold_s": float(L["hold_s"][i] / max(L["acquisitions"][i], 1)),
                "max_hold_s": float(L["max_hold_s"][i]),
                "wait_share": float(L["wait_s"][i] / duration) if duration > 0 else None,
                "critical_events": int(L["critical_events"][i]),
                "critical_wait_s": float(L["critical_wait_s"][i]),
                "critical_hold_s": float(L["critical_hold_s"][i]),
                "unreleased": int(L["unreleased"][i]),
                "estimated": bool(L["estimated"][i]),
            }
        )
    lock_names = {int(i): row["name"] for i, row in zip(order, locks_out)}
    sites_out = []
    for r, i in enumerate(s_order):
        loc = sites_loc[r] if r < len(sites_loc) else None
        lk = int(s_lid[i])
        sites_out.append(
            {
                "function": (
                    loc.function
                    if loc and loc.function
                    else names.fallback(int(l_proc[s_lid[i]]), int(s_site[i]))
                ),
                "file": loc.file if loc else "",
                "line": loc.line if loc else 0,
                "address": _fmt_addr(int(s_site[i])),
                "lock": lock_id_str.get(lk, ""),
                "lock_name": lock_names.get(lk, ""),
                "acquisitions": int(S["acquisitions"][i]),
                "contended": int(S["contended"][i]),
                "failed": int(S["failed"][i]),
                "wait_s": float(S["wait_s"][i]),
                "hold_s": float(S["hold_s"][i]),
                "critical_wait_s": float(S["critical_wait_s"][i]),
                "estimated": bool(S["estimated"][i]),
            }
        )
    t_order = np.lexsort((-T["hold_s"], -T["wait_s"])) if nth else np.zeros(0, int)
    threads_out = []
    for i in t_order:
        threads_out.append(
            {
                "tid": int(th.tid[i]),
                "pid": run.procs[int(th.proc[i])].pid if run.procs else 0,
                "acquisitions": int(T["acquisitions"][i]),
                "contended": int(T["contended"][i]),
                "wait_s": float(T["wait_s"][i]),
                "join_wait_s": float(T["join_wait_s"][i]),
                "hold_s": float(T["hold_s"][i]),
                "hold_combined_s": float(T["hold_combined_s"][i]),
                "critical_hold_s": float(T["critical_hold_s"][i]),
                "service_s": None if np.isnan(T["service_s"][i]) else float(T["service_s"][i]),
                "start_s": float(th.start[i]),
                "end_s": float(th.end[i]),
            }
        )

    estimated = bool(sampled.any())
    if estimated:
        frac = float(sampled.mean())
        notes.append(
            f"sampling active: {frac:.0%} of timed events stand for several critical "
            "sections (weight > 1); times are estimates (exact count x mean timed "
            "duration), counts are exact; the critical path only sees timed sections"
        )
    noisy = [r for r in locks_out if r["wait_rse"] > 0.25][:3]
    if noisy:
        notes.append(
            "few timed contended acquisitions: "
            + "; ".join(f"{r['id']} wait {r['wait_s']:.3g} s ±{r['wait_rse']:.0%}" for r in noisy)
            + " (one standard error; long, rare waits dominate such totals; --time-all"
            " times every acquisition)"
        )
    if not run.complete:
        notes.append(_incomplete_note(run))
    dropped = sum(int(p.hdr["dropped"]) for p in run.procs)
    if dropped:
        notes.append(
            f"{dropped} records were dropped by the runtime (out of space or full "
            "tables): counts and times are lower bounds"
        )
    if derived:
        notes.append(
            f"{len(derived)} process(es) had no counts tables: counts estimated from events"
        )
    n_unrel = int(unreleased.sum())
    if n_unrel:
        notes.append(
            f"{n_unrel} critical section(s) still held when their thread ended: "
            "hold counted to the end"
        )

    lock_rows = ~is_instant_fam & ~is_join_fam
    hold_lock = np.isin(l_fam, [1, 2, 3, 7, 8, 9])
    summary = {
        "acquisitions": int(L["acquisitions"][hold_lock].sum()),
        "contended": int(L["contended"][hold_lock].sum()),
        "failed": int(L["failed"][hold_lock].sum()),
        "waits": int(L["acquisitions"][lock_rows & ~hold_lock].sum()),
        "wait_s": float(L["wait_s"][lock_rows].sum()),
        "lock_wait_s": float(L["wait_s"][hold_lock].sum()),
        "join_wait_s": float(L["wait_s"][is_join_fam].sum()),
        "hold_s": float(L["hold_s"].sum()),
        "locks": int(hold_lock.sum()),
        "critical_path": {
            "events": int(cp.critical.sum()),
            "wait_s": float(cwait.sum()),
            "join_wait_s": float((cwait_all - cwait).sum()),
            "hold_s": float(cp.hold_on_path_s.sum()),
            "length_s": cp.length_s,
            "segments": len(cp.segments),
        },
        **loss,
    }
    stacks_out = _stacks(run, ev, names, lock_id_str, lock_names, wwait_nj, whold, w)
    return {
        "summary": summary,
        "locks": locks_out,
        "sites": sites_out,
        "stacks": stacks_out,
        "threads": threads_out,
        "notes": notes,
        "estimated": estimated,
        "_critical_path": cp,
        "_events": ev,
    }


MIN_GROUP_SAMPLES = 10


def _ratio_weights(ev, e_sid, c_sid, is_hold, sampled, wait, counts):
    """How much of the run each timed event stands for, as a wait and as a hold.

    Where a thread timed 1 in N of its sections at a (lock, site), the exact counts give a
    better estimate than N x measured: hold = acquisitions x mean timed hold, and wait =
    contended acquisitions x mean wait of the timed contended ones. Contention is a small
    fraction of acquisitions, so weighting a contended event by N (up to 65536) would let one
    long wait swamp the estimate; the ratio estimator is bounded by the exact contended
    count. Groups where every event was timed (weight 1) keep weight 1: they are exact.

    Also returns, per event, its share of the variance of the wait estimate (the group's
    variance, cont^2 s^2 / n, carried by the group's first contended event), so any table can
    sum variances over its rows."""
    w = ev.weight.astype(np.float64)
    n = len(w)
    if not n or not sampled.any():
        return w, w, np.zeros(n)
    c_tid, c_acq, c_cont = counts
    ne = n
    # (lock, site) ids already identify the process, the lock and the site.
    gid, _first = group(
        np.concatenate([e_sid, c_sid]),
        np.concatenate([ev.tid.astype(np.int64), c_tid.astype(np.int64)]),
    )
    g_ev, g_c = gid[:ne], gid[ne:]
    ng = int(gid.max()) + 1
    contended = is_hold & ((ev.flags & EV_CONTENDED) != 0)
    acq = np.bincount(g_c, weights=c_acq, minlength=ng)
    cont = np.bincount(g_c, weights=c_cont, minlength=ng)
    n_cont = np.bincount(g_ev, weights=contended.astype(float), minlength=ng)
    g_sampled = np.bincount(g_ev, weights=sampled.astype(float), minlength=ng) > 0
    # The mean timed hold is weighted by each event's weight (the period it was timed with),
    # as the waits' are: the period shrinks when timed sections are far apart, so long
    # sections (a holder that yields or is preempted) are timed more often than short ones,
    # and an unweighted mean put a lock's hold above the run (43 s in 30).
    w_timed = np.bincount(g_ev, weights=np.where(is_hold, w, 0.0), minlength=ng)
    with np.errstate(divide="ignore", invalid="ignore"):
        r_hold = np.where(w_timed > 0, acq / w_timed, 0.0)
    use = g_sampled[g_ev] & is_hold & (acq[g_ev] > 0)
    w_hold = np.where(use, r_hold[g_ev] * w, w)
    # A group with few timed contended waits borrows the mean (and spread) of all the timed
    # contended waits of its lock: one preempted holder's 5 ms wait among 2 samples would
    # otherwise stand for thousands of contended acquisitions. Means are weighted by each
    # event's weight (the period it was timed with: the runtime times more often after a
    # contended acquisition), and so are their variances: var(mean) = sum w^2 (x - m)^2 / W^2.
    g_lock = np.zeros(ng, dtype=np.int64)
    g_lock[g_ev] = ev.lock_id
    nl = int(ev.lock_id.max()) + 1 if n else 1
    lc = contended & use
    om = np.where(lc, w, 0.0)

    def sums(key, size):
        k = key[lc]
        wl, xl = w[lc], wait[lc]
        return (
            np.bincount(k, minlength=size).astype(float),
            np.bincount(k, weights=wl, minlength=size),
            np.bincount(k, weights=wl * xl, minlength=size),
            np.bincount(k, weights=wl * wl, minlength=size),
            np.bincount(k, weights=wl * wl * xl, minlength=size),
            np.bincount(k, weights=wl * wl * xl * xl, minlength=size),
        )

    def mean_var(N, W, S, Q, QX, QXX):
        # n/(n-1): the small-sample correction, so equal weights give s^2/n.
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(W > 0, S / W, 0.0)
            v = np.where(
                (W > 0) & (N > 1), N / (N - 1) * (QXX - 2 * m * QX + m * m * Q) / (W * W), 0.0
            )
        return m, np.maximum(v, 0.0)

    _n, W, S, *q = sums(g_ev, ng)
    g_mean, g_vm = mean_var(_n, W, S, *q)
    p_mean, p_vm = mean_var(*sums(ev.lock_id, nl))
    small = n_cont < MIN_GROUP_SAMPLES
    with np.errstate(divide="ignore", invalid="ignore"):
        pooled_total = cont * p_mean[g_lock]
        # per unit of an event's weight: cont x pooled mean / S (small) or cont / W
        per_w = np.where(small & (S > 0), pooled_total / S, np.where(W > 0, cont / W, 0.0))
    scale_ev = per_w[g_ev] * np.where(lc, w, 0.0)
    var_mean = np.where(small, p_vm[g_lock], g_vm)
    del om, g_mean
    w_wait = np.where(use, np.where(contended, scale_ev, 0.0), w)
    g_var = np.maximum(var_mean, 0.0) * cont * cont
    carrier = np.zeros(n, bool)
    idx = np.flatnonzero(contended & use)
    if len(idx):
        _, firsts = np.unique(g_ev[idx], return_index=True)
        carrier[idx[firsts]] = True
    return w_wait, w_hold, np.where(carrier, g_var[g_ev], 0.0)


def _stacks(run, ev, names, lock_id_str, lock_names, wwait, whold, w, limit=500) -> list:
    """Wait and hold per (lock, call stack) over the timed events that carry a stack
    (--call-stack), innermost frame first; sorted by wait, then hold."""
    m = np.flatnonzero(ev.stack != 0) if len(ev.stack) else np.zeros(0, int)
    if not len(m):
        return []
    inv, first = group(ev.proc[m], ev.lock_id[m], ev.stack[m])
    n = len(first)
    W = np.bincount(inv, weights=wwait[m], minlength=n)
    H = np.bincount(inv, weights=whold[m], minlength=n)
    C = np.bincount(inv, weights=w[m], minlength=n)
    tables: dict[int, dict[int, tuple[int, ...]]] = {}
    # Threads deduplicate their stacks on their own: merge rows with the same frames.
    merged: dict[tuple, list] = {}
    for i in range(n):
        j = m[first[i]]
        proc, sid, lk = int(ev.proc[j]), int(ev.stack[j]), int(ev.lock_id[j])
        if lk not in lock_id_str:
            continue  # joins and instants have no row in the locks table
        if proc not in tables:
            st = run.procs[proc].stacks()
            tables[proc] = {
                int(r["id"]): tuple(int(x) for x in r["pc"][: int(r["depth"])]) for r in st
            }
        key = (proc, lk, tables[proc].get(sid, ()))
        row = merged.setdefault(key, [sid, 0.0, 0.0, 0.0])
        row[1] += W[i]
        row[2] += H[i]
        row[3] += C[i]
    rows = sorted(merged.items(), key=lambda kv: (-kv[1][1], -kv[1][2], -kv[1][3]))[:limit]
    out = []
    for (proc, lk, pcs), (sid, wait_s, hold_s, events) in rows:
        frames = []
        for pc, loc in zip(pcs, names.code_locs([(proc, pc) for pc in pcs])):
            frames.append(
                {
                    "function": (loc.function if loc and loc.function else "")
                    or names.fallback(proc, pc),
                    "file": loc.file if loc else "",
                    "line": loc.line if loc else 0,
                    "address": _fmt_addr(pc),
                }
            )
            # Functions the frame's code is inlined into: frames of their own, same address.
            for fn, file, line in loc.inlined if loc else ():
                frames.append(
                    {"function": fn, "file": file, "line": line, "address": _fmt_addr(pc)}
                )
        out.append(
            {
                "lock": lock_id_str[lk],
                "lock_name": lock_names.get(lk, ""),
                "stack_id": sid,
                "pid": run.procs[proc].pid,
                "events": int(round(events)),
                "wait_s": float(wait_s),
                "hold_s": float(hold_s),
                "frames": frames,
            }
        )
    return out


def _kind_of_family(fam: np.ndarray) -> np.ndarray:
    """A representative kind of each family (to reuse the kind tables)."""
    rep = np.array([0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 15], dtype=np.int64)
    return rep[np.asarray(fam, dtype=np.int64)]


def _union_hold(e_th, nth, ev: LockEvents, is_hold, whold) -> np.ndarray:
    """Per thread, the time during which it held at least one lock (nested sections count
    once), scaled by the thread's weighted/measured hold ratio when sampling was active."""
    idx = np.flatnonzero(is_hold & (e_th >= 0))
    out = np.zeros(nth)
    if len(idx) == 0:
        return out
    # Events are sorted by (thread rank, t_acq) already (load_events).
    rk, a, b = ev.thread_rank[idx], ev.t_acq[idx], ev.t_rel[idx]
    th = e_th[idx]
    # Separate threads on the time axis so one running maximum serves all of them.
    span = float(max(b.max(), a.max()) - min(a.min(), 0.0)) + 1.0
    shift = rk * span
    ends = np.maximum.accumulate(b + shift) - shift
    first = np.ones(len(rk), dtype=bool)
    first[1:] = rk[1:] != rk[:-1]
    prev_end = np.empty_like(ends)
    prev_end[0] = -np.inf
    prev_end[1:] = ends[:-1]
    prev_end[first] = -np.inf
    covered = np.maximum(b - np.maximum(a, prev_end), 0.0)
    measured = np.bincount(th, weights=np.maximum(b - a, 0.0), minlength=nth)
    union = np.bincount(th, weights=covered, minlength=nth)
    weighted = np.bincount(e_th[idx], weights=whold[idx], minlength=nth)
    scale = np.where(measured > 0, weighted / np.where(measured > 0, measured, 1), 1.0)
    return union * scale


def _service(run: RunDir, th: Threads, blocking_wait: np.ndarray):
    """Service (on-CPU) time of each thread from sched.bin: its last cumulative sample."""
    n = len(th.tid)
    out = np.full(n, np.nan)
    svc = {k: v / 1e9 for k, v in task_service_ns(run).items()}
    if not svc:
        return out, None
    s = run.sched()
    s = s[s["tid"] != 0]
    pids = [p.pid for p in run.procs]
    keys = [(pids[int(th.proc[i])], int(th.tid[i])) for i in range(n)]
    # A task that exec'd is a thread of each process image (same pid and tid), and its
    # cumulative service spans them all: each image gets what ran in its own lifetime.
    images = Counter(keys)
    st = run.sched_seconds(s["t_ns"]) if any(c > 1 for c in images.values()) else None
    missing = 0
    for i in range(n):
        v = svc.get(keys[i])
        if v is not None and st is not None and images[keys[i]] > 1:
            on = (s["pid"] == keys[i][0]) & (s["tid"] == keys[i][1])
            before = on & (st < float(th.start[i]))
            during = on & (st >= float(th.start[i])) & (st <= float(th.end[i]))
            base = float(s["service_ns"][before].max()) if before.any() else 0.0
            v = (float(s["service_ns"][during].max()) - base) / 1e9 if during.any() else None
        if v is None:
            # Lived between two samples: its lifetime minus its blocking waits.
            v = max(float(th.end[i] - th.start[i]) - float(blocking_wait[i]), 0.0)
            missing += 1
        out[i] = v
    note = None
    if missing:
        note = (
            f"service time of {missing} thread(s) without scheduler samples estimated as "
            "lifetime minus blocking waits"
        )
    return out, note


def max_concurrency(start: np.ndarray, end: np.ndarray) -> int:
    if len(start) == 0:
        return 0
    t = np.concatenate([start, end])
    d = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
    o = np.lexsort((d, t))  # ends before starts at equal times
    return int(np.cumsum(d[o]).max())


def _dependency_loss(run, th, service, blocking_wait_s, duration, notes) -> dict:
    has = len(run.sched()) and bool((run.sched()["tid"] != 0).any())
    m = max_concurrency(th.start, th.end)
    cpus = run.cpus
    if cpus:
        m = min(m, cpus)
    out = {
        "active_threads_avg": None,
        "max_threads": m,
        "dependency_loss_s": None,
        "lock_wait_loss_s": None,
        "unaccounted_loss_s": None,
    }
    if not has or duration <= 0:
        notes.append(
            "no scheduler samples in this run (sched.bin): the dependency-loss model "
            "(active threads, losses) cannot be computed"
        )
        return out
    total = float(np.nansum(service))
    a = total / duration
    dep = max(0.0, (m - a) * duration)
    lw = min(dep, blocking_wait_s)
    out.update(
        active_threads_avg=a,
        dependency_loss_s=dep,
        lock_wait_loss_s=lw,
        unaccounted_loss_s=dep - lw,
    )
    return out


def _barrier_counts(run: RunDir) -> dict:
    out = {}
    for i, p in enumerate(run.procs):
        o = p.lock_objects()
        o = o[(o["kind"] == BARRIER) & (o["flags"] == 1)]
        for lock, attr in zip(o["lock"].tolist(), o["attr"].tolist()):
            out[(i, lock)] = attr
    return out


def _incomplete_note(run: RunDir) -> str:
    killed = [p.pid for p in run.procs if not p.complete]
    sig = run.meta.get("signal")
    why = f" (signal {sig})" if sig else ""
    if killed:
        return (
            f"incomplete run{why}: process(es) {', '.join(map(str, killed[:5]))} did not "
            "exit cleanly; their last records may be missing"
        )
    return f"incomplete run{why}: the launcher did not see the program finish"


class _Names:
    """Lock and site names, symbolized in batches per process."""

    def __init__(self, run: RunDir, enabled: bool):
        self.run = run
        self.enabled = enabled
        self.syms: dict[int, object] = {}
        self.data: dict[tuple[int, int], str | None] = {}
        self.code: dict[tuple[int, int], object] = {}
        self.init_site: dict[tuple[int, int], int] = {}
        self.first_site: dict[tuple[int, int, int], int] = {}

    def sym(self, proc: int):
        if not self.enabled:
            return None
        if proc not in self.syms:
            from locus.symbolize import for_proc

            self.syms[proc] = for_proc(self.run.procs[proc])
        return self.syms[proc]

    def prefetch_locks(self, keys, ev, c_proc, c_lock, c_site, c_fam):
        by_proc: dict[int, list[int]] = {}
        for proc, lock, _fam in keys:
            if lock:
                by_proc.setdefault(proc, []).append(lock)
        for proc, locks in by_proc.items():
            o = self.run.procs[proc].lock_objects()
            o = o[o["flags"] == 1]
            for lk, site in zip(o["lock"].tolist(), o["site"].tolist()):
                self.init_site[(proc, lk)] = site
            s = self.sym(proc)
            if s is not None:
                for a, name in s.data(locks).items():
                    self.data[(proc, a)] = _lock_field(s, a, name)
        # First site that used each lock (events: earliest; else any counts row).
        want = {(p, lk, f) for p, lk, f in keys}
        if len(ev.proc):
            first_t = np.full(int(ev.lock_id.max()) + 1, np.inf)
            np.minimum.at(first_t, ev.lock_id, ev.t_acq)
            hit = np.flatnonzero(ev.t_acq == first_t[ev.lock_id])
            _, f1 = np.unique(ev.lock_id[hit], return_index=True)
            e1 = hit[f1]
            fam = family_of(ev.kind[e1])
            for p, lk, f, site in zip(
                ev.proc[e1].tolist(), ev.lock[e1].tolist(), fam.tolist(), ev.site[e1].tolist()
            ):
                if (p, lk, f) in want:
                    self.first_site[(p, lk, f)] = site
        for p, lk, f, site in zip(
            c_proc.tolist(), c_lock.tolist(), c_fam.tolist(), c_site.tolist()
        ):
            if (p, lk, f) in want:
                self.first_site.setdefault((p, lk, f), site)
        sites = [(p, s) for (p, _lk), s in self.init_site.items()]
        sites += [(k[0], s) for k, s in self.first_site.items()]
        self.code_locs(sites)

    def code_locs(self, keys: list[tuple[int, int]]):
        by_proc: dict[int, list[int]] = {}
        for p, a in keys:
            if (p, a) not in self.code:
                by_proc.setdefault(p, []).append(a)
        for p, addrs in by_proc.items():
            s = self.sym(p)
            res = s.code(addrs) if s is not None else {}
            for a in addrs:
                self.code[(p, a)] = res.get(a)
        return [self.code.get(k) for k in keys]

    def fallback(self, proc: int, addr: int) -> str:
        """A code address without a symbol (stripped binary): module+offset, perf-style,
        which stays meaningful across runs; the bare address when no module holds it."""
        s = self.sym(proc)
        where = s.module_offset(addr) if s is not None else None
        return where or _fmt_addr(addr)

    def lock_name(self, proc: int, lock: int, fam: int) -> str:
        fname = FAMILY_NAMES[fam]
        if fam == FAMILY_NAMES.index("omp_barrier") or (fam == 9 and lock == 0):
            return "omp barrier" if fam == 10 else "omp critical (unnamed)"
        if fam == FAMILY_NAMES.index("join"):
            return "pthread_join"
        name = self.data.get((proc, lock))
        if name:
            return name
        base = f"{fname}@{lock:#x}"
        s = self.sym(proc)
        sec = s.section(lock) if s is not None else None
        if sec is not None:  # static data of a stripped module: where it is in the module
            mod, section, v = sec
            base = f"{fname}@{mod}+{v:#x}" + (f" ({section})" if section else "")
        init = self.init_site.get((proc, lock))
        loc = self.code.get((proc, init)) if init else None
        if loc is not None and loc.function:
            return f"{base} (init at {loc.short()})"
        fs = self.first_site.get((proc, lock, fam))
        loc = self.code.get((proc, fs)) if fs else None
        if loc is not None and loc.function:
            return f"{base} (first locked in {loc.function})"
        return base


def _lock_field(sym, addr: int, name: str | None) -> str | None:
    """A lock inside a static variable named by its field, from the variable's DWARF type
    (`q.not_empty` rather than `q+40`, as the comm lens names it; glibc's own fields of the
    lock, `__data.__lock`, are cut off); the symbol+offset name where there is no type."""
    if not name or not hasattr(sym, "data_layout"):
        return name
    var, off = split_offset(name)
    layout = sym.data_layout(var, addr - off)
    if layout is None:
        return name
    field = layout.field(off)
    return lock_of(field) or field
