"""Critical lock analysis (Chen & Stenström; Venter 2016, Listing 3.5).

The path is walked backwards from the end of the thread that ends last. On thread T at
time t, the latest blocking wait of T that ended at or before t decides where the path came
from: a contended lock acquisition came from the thread that released that lock last (a
reader waiting on a rwlock: the last writer), a cond wait from the latest signal, a
semaphore wait from the latest post, a barrier from the last thread to arrive, a join from
the end of the joined thread, the start of a thread from its creator. The path jumps there;
when no cause is recorded it goes on backwards on T. The walk is an iterative loop over
precomputed causes: every cause is found for all waits at once with sorted arrays and
np.searchsorted, so the Python loop only does one bisect per step.

Times here are int64 nanoseconds since the earliest event (exact ties, packable keys).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from locus.analysis.kinds import (
    BARRIER_KINDS,
    COND_SIGNAL,
    COND_WAIT,
    CREATE,
    EV_CONTENDED,
    EV_FAILED,
    HOLD_KINDS,
    JOIN,
    RWLOCK_RD,
    RWLOCK_WR,
    SEM_POST,
    SEM_WAIT,
)


@dataclass
class CriticalPath:
    """Result over all events of the run (arrays indexed like the events)."""

    critical: np.ndarray  # bool: the event's hold interval lies on the path
    hold_on_path_s: np.ndarray  # seconds of the event's hold interval on the path
    jumped: np.ndarray  # bool: a wait the path jumped through (waiter -> cause)
    segments: list  # (proc, tid, t0_s, t1_s), path order (latest first)
    length_s: float  # total time covered by segments


def last_at_or_before(dgrp, dt, qgrp, qt) -> np.ndarray:
    """For each query (qgrp, qt): index of the last data row with the same group and
    t <= qt, or -1. Data must be sorted by (grp, t); groups and times are non-negative
    int64."""
    n = len(qgrp)
    if len(dgrp) == 0 or n == 0:
        return np.full(n, -1, dtype=np.int64)
    tmax = int(max(dt.max(), qt.max()))
    gmax = int(max(dgrp.max(), qgrp.max()))
    tb = max(tmax.bit_length(), 1)
    if tb + max(gmax.bit_length(), 1) <= 62:
        dkey = (dgrp.astype(np.int64) << tb) | dt
        qkey = (qgrp.astype(np.int64) << tb) | qt
        j = np.searchsorted(dkey, qkey, side="right") - 1
    else:  # huge spans or group counts: one search per group
        j = np.full(n, -1, dtype=np.int64)
        lo = np.searchsorted(dgrp, qgrp, side="left")
        hi = np.searchsorted(dgrp, qgrp, side="right")
        for g in np.unique(qgrp):
            m = qgrp == g
            a, b = int(lo[m][0]), int(hi[m][0])
            j[m] = a + np.searchsorted(dt[a:b], qt[m], side="right") - 1
    ok = j >= 0
    ok[ok] = dgrp[j[ok]] == qgrp[ok]
    return np.where(ok, j, -1)


def order_by(grp: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Indices sorting rows by (grp, t); non-negative int64 columns. A packed single-key
    argsort is several times faster than np.lexsort."""
    if len(grp) == 0:
        return np.zeros(0, dtype=np.int64)
    tb = max(int(t.max()).bit_length(), 1)
    if tb + max(int(grp.max()).bit_length(), 1) <= 62:
        return np.argsort((grp.astype(np.int64) << tb) | t)
    return np.lexsort((t, grp))


def _prev_other(tid: np.ndarray) -> np.ndarray:
    """For each row, the last earlier row with a different tid (-1 if none)."""
    n = len(tid)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.ones(n, dtype=bool)
    change[1:] = tid[1:] != tid[:-1]
    run_start = np.maximum.accumulate(np.where(change, np.arange(n), 0))
    return run_start - 1


def _sorted(mask, grp, t) -> np.ndarray:
    idx = np.flatnonzero(mask)
    return idx[order_by(grp[idx], t[idx])]


def _cause_by_last(idx, dgrp, dt, dtid, qgrp, qt, qtid, qmin):
    """Latest data row among `idx` (sorted by (group, time)) with the query's group, time
    <= qt, another thread and time >= qmin. Returns event indices or -1. Queries nearly
    in key order search much faster (cache)."""
    g, t, th = dgrp[idx], dt[idx], dtid[idx]
    j = last_at_or_before(g, t, qgrp, qt)
    ok = j >= 0
    same = np.zeros(len(j), dtype=bool)
    same[ok] = th[j[ok]] == qtid[ok]
    if same.any():
        po = _prev_other(th)
        j2 = po[j[same]]
        ok2 = j2 >= 0
        ok2[ok2] = g[j2[ok2]] == qgrp[same][ok2]
        j[same] = np.where(ok2, j2, -1)
    ok = j >= 0
    ok[ok] = t[j[ok]] >= qmin[ok]
    out = np.full(len(j), -1, dtype=np.int64)
    out[ok] = idx[j[ok]]
    return out


def walk_py(w: dict, nth: int, cur: int, pstart: int) -> tuple[np.ndarray, np.ndarray]:
    """The walk of one process, backwards from the end of thread `cur`: (segments as
    (thread, lo, hi) rows, indices of the waits it jumped through). The reference version."""
    bounds_l = w["bounds"].tolist()
    tacq_l, treq_l, bo_l = w["tacq"].tolist(), w["treq"].tolist(), w["bo"].tolist()
    cthr_l, ctime_l = w["cthr"].tolist(), w["ctime"].tolist()
    start_l, end_l = w["start"].tolist(), w["end"].tolist()
    creator_l, create_l = w["creator"].tolist(), w["create_t"].tolist()
    segs: list[tuple[int, int, int]] = []
    jumped_l: list[int] = []
    seg_add, jump_add = segs.append, jumped_l.append
    t = top = end_l[cur]
    # hi[T]: T's waits at or after this index were consumed by an earlier visit (the walk's
    # time never increases, so every wait is used at most once).
    hi = bounds_l[1:]
    started = set()
    for _ in range(len(bo_l) + 4 * nth + 16):
        lo_b = bounds_l[cur]
        k = bisect_right(tacq_l, t, lo_b, hi[cur]) - 1
        if k < lo_b:
            seg_add((cur, min(start_l[cur], t), top))
            hi[cur] = lo_b
            c = creator_l[cur]
            if c < 0 or cur in started or start_l[cur] <= pstart:
                break
            started.add(cur)
            t = top = min(create_l[cur], start_l[cur], t)
            cur = c
            continue
        hi[cur] = k
        c = cthr_l[k]
        if c >= 0:
            seg_add((cur, tacq_l[k], top))
            jump_add(bo_l[k])
            t = top = min(ctime_l[k], tacq_l[k])
            cur = c
        elif treq_l[k] < t:
            t = treq_l[k]
        if t <= pstart:
            seg_add((cur, t, top))
            break
    return (
        np.asarray(segs, dtype=np.int64).reshape(-1, 3),
        np.asarray(jumped_l, dtype=np.int64),
    )


def _load_walk_c():
    """The C walk (_walk.c, built by `make build` into build/liblocus_walk.so), or None."""
    import ctypes
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    for path in (
        os.environ.get("LOCUS_WALK_LIB", ""),
        os.path.join(here, "..", "..", "..", "build", "liblocus_walk.so"),
        os.path.join(here, "liblocus_walk.so"),
    ):
        if path and os.path.exists(path):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            fn = lib.locus_cp_walk
            fn.restype = ctypes.c_int64
            return fn
    return None


_WALK_FN: list = []  # the loaded C function (or None), once per process


def walk_c(w: dict, nth: int, cur: int, pstart: int) -> tuple[np.ndarray, np.ndarray]:
    """The same walk in C (same results as walk_py; tested against it)."""
    import ctypes

    if not _WALK_FN:
        _WALK_FN.append(_load_walk_c())
    fn = _WALK_FN[0]
    if fn is None:
        return walk_py(w, nth, cur, pstart)
    arr = {k: np.ascontiguousarray(v, dtype=np.int64) for k, v in w.items()}
    nb = len(arr["bo"])
    cap = nb + 4 * nth + 18
    segs = np.zeros(3 * cap, dtype=np.int64)
    jumped = np.zeros(cap, dtype=np.int64)
    hi = np.ascontiguousarray(arr["bounds"][1:]).copy()
    started = np.zeros(max(nth, 1), dtype=np.uint8)
    nsegs, nj = ctypes.c_int64(0), ctypes.c_int64(0)
    P = ctypes.c_void_p

    def ptr(a):
        return P(a.ctypes.data)

    rc = fn(
        ctypes.c_int64(nth), ptr(arr["bounds"]), ctypes.c_int64(nb), ptr(arr["tacq"]),
        ptr(arr["treq"]), ptr(arr["bo"]), ptr(arr["cthr"]), ptr(arr["ctime"]),
        ptr(arr["start"]), ptr(arr["create_t"]), ptr(arr["creator"]), ctypes.c_int64(cur),
        ctypes.c_int64(pstart), ctypes.c_int64(int(arr["end"][cur])), ptr(hi), ptr(started),
        ptr(segs), ctypes.c_int64(cap), ctypes.byref(nsegs), ptr(jumped), ctypes.c_int64(cap),
        ctypes.byref(nj),
    )  # fmt: skip
    if rc != 0:
        return walk_py(w, nth, cur, pstart)
    return segs[: 3 * nsegs.value].reshape(-1, 3).copy(), jumped[: nj.value].copy()


WALK = walk_c


def compute(ev, threads, barrier_counts: dict | None = None) -> CriticalPath:
    """ev: analysis.locks.LockEvents; threads: analysis.locks.Threads.
    barrier_counts: {(proc, lock): count} from barrier init records."""
    n = len(ev.kind)
    critical = np.zeros(n, dtype=bool)
    hold_on = np.zeros(n, dtype=np.float64)
    jumped = np.zeros(n, dtype=bool)
    segments: list = []
    if len(threads.tid) == 0:
        return CriticalPath(critical, hold_on, jumped, segments, 0.0)
    base = min(
        float(np.min(ev.t_req)) if n else np.inf,
        float(np.nanmin(threads.start)),
    )
    ns = lambda x: np.round((np.asarray(x, dtype=np.float64) - base) * 1e9).astype(np.int64)  # noqa: E731
    t_req, t_acq, t_rel = ns(ev.t_req), ns(ev.t_acq), ns(ev.t_rel)
    th_start, th_end = ns(threads.start), ns(threads.end)

    # Thread index of every event (events of threads missing from threads.bin were given
    # a thread row by the loader).
    tkey = threads.proc.astype(np.int64) << 32 | threads.tid.astype(np.int64)
    torder = np.argsort(tkey)
    ekey = ev.proc.astype(np.int64) << 32 | ev.tid.astype(np.int64)
    eth = torder[np.searchsorted(tkey[torder], ekey)]

    kind, flags = ev.kind, ev.flags
    failed = (flags & EV_FAILED) != 0
    is_hold = np.isin(kind, list(HOLD_KINDS)) & ~failed
    lock_grp = ev.lock_id

    lockwait = is_hold & ((flags & EV_CONTENDED) != 0)
    blocking = lockwait | (np.isin(kind, [COND_WAIT, SEM_WAIT, JOIN, *BARRIER_KINDS]) & ~failed)
    bidx = np.flatnonzero(blocking)
    c_thr = np.full(n, -1, dtype=np.int64)
    c_time = np.zeros(n, dtype=np.int64)
    c_ev = np.full(n, -1, dtype=np.int64)

    def set_cause(q, found, time_of):
        ok = found >= 0
        c_ev[q[ok]] = found[ok]
        c_thr[q[ok]] = eth[found[ok]]
        c_time[q[ok]] = time_of[found[ok]]

    # Lock waits: the last release of the lock by another thread, after the request.
    # Readers wait for writers only; anyone else waits for any holder.
    rel = _sorted(is_hold, lock_grp, t_rel)
    q = rel[lockwait[rel] & (kind[rel] != RWLOCK_RD)]  # in release order: nearly sorted
    if len(q):
        f = _cause_by_last(rel, lock_grp, t_rel, ev.tid, lock_grp[q], t_acq[q], ev.tid[q], t_req[q])
        set_cause(q, f, t_rel)
    q = rel[lockwait[rel] & (kind[rel] == RWLOCK_RD)]
    if len(q):
        wr = rel[kind[rel] == RWLOCK_WR]
        f = _cause_by_last(wr, lock_grp, t_rel, ev.tid, lock_grp[q], t_acq[q], ev.tid[q], t_req[q])
        set_cause(q, f, t_rel)
    # Cond waits and semaphore waits: the latest signal / post during the wait.
    for wait_kind, post_kind in ((COND_WAIT, COND_SIGNAL), (SEM_WAIT, SEM_POST)):
        q = np.flatnonzero(blocking & (kind == wait_kind))
        if len(q):
            posts = _sorted(kind == post_kind, lock_grp, t_acq)
            f = _cause_by_last(
                posts, lock_grp, t_acq, ev.tid, lock_grp[q], t_acq[q], ev.tid[q], t_req[q]
            )
            set_cause(q, f, t_acq)
    # Barriers: departures of round k all precede those of round k+1, so sorting a
    # barrier's waits by departure and cutting every `count` gives the rounds; the cause
    # of every wait of a round is its last arrival.
    bm = np.flatnonzero(blocking & np.isin(kind, list(BARRIER_KINDS)))
    if len(bm):
        o = bm[np.lexsort((t_acq[bm], lock_grp[bm]))]
        g = lock_grp[o]
        first = np.ones(len(o), dtype=bool)
        first[1:] = g[1:] != g[:-1]
        gstart = np.maximum.accumulate(np.where(first, np.arange(len(o)), 0))
        cnt = np.zeros(len(o), dtype=np.int64)
        for s in np.flatnonzero(first):
            e = s + 1
            while e < len(o) and not first[e]:
                e += 1
            seg = o[s:e]
            c = (barrier_counts or {}).get((int(ev.proc[seg[0]]), int(ev.lock[seg[0]])), 0)
            cnt[s:e] = c if c > 0 else len(np.unique(ev.tid[seg]))
        rnd = (np.arange(len(o)) - gstart) // np.maximum(cnt, 1)
        rkey = np.unique(g.astype(np.int64) << 32 | rnd, return_inverse=True)[1].reshape(-1)
        # last arrival per round: sort by (round, t_req) and take each round's last row
        o2 = np.lexsort((t_req[o], rkey))
        last_of_round = np.zeros(rkey.max() + 1, dtype=np.int64)
        last_of_round[rkey[o2]] = o[o2]  # later rows overwrite: the max t_req wins
        cause = last_of_round[rkey]
        other = ev.tid[cause] != ev.tid[o]
        set_cause(o[other], cause[other], t_req)
    # Joins: the joined thread's end.
    q = np.flatnonzero(blocking & (kind == JOIN))
    if len(q):
        jk = ev.proc[q].astype(np.int64) << 32 | ev.obj[q].astype(np.int64)
        pos = np.searchsorted(tkey[torder], jk)
        pos = np.minimum(pos, len(torder) - 1)
        ok = tkey[torder][pos] == jk
        c_thr[q[ok]] = torder[pos[ok]]
        c_time[q[ok]] = th_end[torder[pos[ok]]]

    # Thread starts: the creator at its CREATE call.
    creator = np.full(len(threads.tid), -1, dtype=np.int64)
    create_t = th_start.copy()
    pk = threads.proc.astype(np.int64) << 32 | threads.parent.astype(np.int64)
    has_parent = threads.parent != 0
    pos = np.minimum(np.searchsorted(tkey[torder], pk), len(torder) - 1)
    okp = has_parent & (tkey[torder][pos] == pk)
    creator[okp] = torder[pos[okp]]
    cm = np.flatnonzero(kind == CREATE)
    if len(cm):
        ck = ev.proc[cm].astype(np.int64) << 32 | ev.obj[cm].astype(np.int64)
        pos = np.minimum(np.searchsorted(tkey[torder], ck), len(torder) - 1)
        okc = tkey[torder][pos] == ck
        create_t[torder[pos[okc]]] = t_acq[cm[okc]]
        creator[torder[pos[okc]]] = eth[cm[okc]]

    # Per-thread lists of blocking waits sorted by t_acq, for the walk.
    bo = bidx[order_by(eth[bidx], t_acq[bidx])]
    bth = eth[bo]
    nth = len(threads.tid)
    bounds = np.searchsorted(bth, np.arange(nth + 1))
    walk_in = dict(
        bounds=bounds,
        tacq=t_acq[bo],
        treq=t_req[bo],
        bo=bo,
        cthr=c_thr[bo],
        ctime=c_time[bo],
        start=th_start,
        end=th_end,
        create_t=create_t,
        creator=creator,
    )
    segs: list = []
    jumped_l: list = []
    for p in np.unique(threads.proc).tolist():
        members = np.flatnonzero(threads.proc == p)
        cur = int(members[np.argmax(th_end[members])])
        pstart = int(th_start[members].min())
        s_p, j_p = WALK(walk_in, nth, cur, pstart)
        segs.append(s_p)
        jumped_l.append(j_p)
    sa = np.concatenate(segs).reshape(-1, 3) if segs else np.zeros((0, 3), dtype=np.int64)
    jumped_l = np.concatenate(jumped_l) if jumped_l else np.zeros(0, dtype=np.int64)

    jumped[np.asarray(jumped_l, dtype=np.int64)] = True
    s_th, s_lo, s_hi = sa[:, 0], sa[:, 1], sa[:, 2]
    keep = s_hi > s_lo
    s_th, s_lo, s_hi = s_th[keep], s_lo[keep], s_hi[keep]
    segments = list(
        zip(
            threads.proc[s_th].tolist(),
            threads.tid[s_th].tolist(),
            (base + s_lo / 1e9).tolist(),
            (base + s_hi / 1e9).tolist(),
        )
    )
    length = float((s_hi - s_lo).sum()) / 1e9

    # Hold time of each section on the path: L(x) = path time of the section's thread
    # before x; the overlap of [t_acq, t_rel] with the path is L(t_rel) - L(t_acq).
    if len(s_th):
        so = order_by(s_th, s_lo)
        s_th, s_lo, s_hi = s_th[so], s_lo[so], s_hi[so]
        seglen = s_hi - s_lo
        cum = np.cumsum(seglen) - seglen
        first = np.ones(len(s_th), dtype=bool)
        first[1:] = s_th[1:] != s_th[:-1]
        cum = cum - cum[np.maximum.accumulate(np.where(first, np.arange(len(s_th)), 0))]
        hidx = np.flatnonzero(is_hold)

        def path_before(x):
            j = last_at_or_before(s_th, s_lo, eth[hidx], x)
            ok = j >= 0
            out = np.zeros(len(x), dtype=np.int64)
            jj = j[ok]
            out[ok] = cum[jj] + np.clip(x[ok] - s_lo[jj], 0, seglen[jj])
            inside = np.zeros(len(x), dtype=bool)
            inside[ok] = x[ok] <= s_hi[jj]
            return out, inside

        a, _ = path_before(t_acq[hidx])
        b, inside = path_before(t_rel[hidx])
        ov = b - a
        hold_on[hidx] = ov / 1e9
        critical[hidx] = (ov > 0) | ((t_rel[hidx] == t_acq[hidx]) & inside)
    ce = c_ev[jumped]
    ce = ce[ce >= 0]
    critical[ce[is_hold[ce]]] = True  # the holder a waiter jumped to
    return CriticalPath(critical, hold_on, jumped, segments, length)
