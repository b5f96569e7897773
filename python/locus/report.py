"""`locus report`: analyse a run directory and print it (text, json, csv, md).

The report is one dict (the JSON contract in docs/lenses/locks.md); the renderers in
locus.render turn it into tables.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass

import numpy as np

from locus import FORMAT_VERSION, __version__
from locus.analysis import LENSES
from locus.errors import LocusError
from locus.rundir import PROC_SANDBOXED, THREAD_MAIN, RunDir


@dataclass
class Filters:
    top: int | None = 10  # rows per table; None or 0 = all
    min_wait: float | None = None
    min_hold: float | None = None
    lock: str | None = None
    site: str | None = None
    by: str | None = None  # comm: matrix (thread, core, node); numa: table (site, alloc, thread)
    kind: str = "all"  # comm: all, true or false sharing


def overhead(run: RunDir) -> dict:
    """Time the runtime spent inside the program: measured slow paths plus the calibrated
    cost of the untimed fast path (ps per call x calls)."""
    rt = 0.0
    records = dropped = 0
    thread_s = 0.0  # the threads' lifetimes added up: what runtime_s is a share of
    for p in run.procs:
        h = p.hdr
        if len(p.thread_start_s):
            start = p.thread_start_s.copy()
            if p.start_s:
                # The main thread lives from the runtime's start-up on, which runtime_s
                # counts: /bin/true's 1.8 ms of start-up read "441 % of thread time".
                main = (p.threads["flags"] & THREAD_MAIN) != 0
                start[main] = np.minimum(start[main], p.start_s)
            span = p.thread_end_s - start
            thread_s += float(span[span > 0].sum())
        rt += int(h["self_ns"]) / 1e9
        rt += int(h["untimed_calls"]) * int(h["fastpath_ns_per_call_x1000"]) / 1e12
        records += int(h["records"])
        dropped += int(h["dropped"])
    return {"runtime_s": rt, "thread_time_s": thread_s, "records": records, "dropped": dropped}


def run_info(run: RunDir) -> dict:
    m = run.meta
    return {
        "command": m.get("command") or [],
        "cwd": m.get("cwd"),
        "start": m.get("start_time"),
        "duration_s": run.duration_s,
        "pids": [p.pid for p in run.procs],
        "threads": int(sum(len(p.threads) for p in run.procs)),
        "host": run.host,
        "complete": run.complete,
        # Processes that installed a seccomp filter: each is recorded up to it (at_s, run
        # seconds), then goes on unrecorded (runtime/core/proc.c, locus_before_sandbox).
        "sandboxed": [
            {"pid": p.pid, "at_s": p.ns_to_s(int(p.hdr["sandbox_ns"]))}
            for p in run.procs
            if p.flags & PROC_SANDBOXED
        ],
        "exit_status": m.get("exit_status"),
        "signal": m.get("signal"),
        "lenses": run.lenses,
    }


def _match_lock(row: dict, want: str) -> bool:
    w = want.strip()
    if w.upper() == row["id"].upper():
        return True
    try:
        if int(w, 0) == int(row["address"], 16):
            return True
    except ValueError:
        pass
    name = row["name"]
    return fnmatch.fnmatchcase(name, w) or name == w or name.split(" ")[0] == w


def _match_site(row: dict, want: str) -> bool:
    w = want.strip()
    if ":" in w:
        f, _, ln = w.rpartition(":")
        if ln.isdigit() and row["file"]:
            return int(ln) == row["line"] and (
                row["file"] == f or row["file"].endswith("/" + f.lstrip("/"))
            )
    if row["function"] == w or fnmatch.fnmatchcase(row["function"], w):
        return True
    try:
        return int(w, 0) == int(row["address"], 16)
    except ValueError:
        return False


def filter_locks(lk: dict, f: Filters) -> dict:
    """Apply --lock/--site/--min-wait/--min-hold/--top to the locks lens tables."""
    locks, sites, threads = lk["locks"], lk["sites"], lk["threads"]
    if f.min_wait:
        locks = [r for r in locks if r["wait_s"] >= f.min_wait]
    if f.min_hold:
        locks = [r for r in locks if r["hold_s"] >= f.min_hold]
    if f.lock:
        locks = [r for r in locks if _match_lock(r, f.lock)]
        if not locks:
            raise LocusError(
                f"no lock matches '{f.lock}' (give an id like L1, an address or a name)"
            )
    if f.site:
        sites = [r for r in sites if _match_site(r, f.site)]
        if not sites:
            raise LocusError(f"no call site matches '{f.site}' (give FUNC or FILE:LINE)")
        ids = {r["lock"] for r in sites}
        locks = [r for r in locks if r["id"] in ids]
    if f.lock or f.min_wait or f.min_hold:
        ids = {r["id"] for r in locks}
        sites = [r for r in sites if r["lock"] in ids]
    stacks = lk.get("stacks", [])
    if f.lock or f.site or f.min_wait or f.min_hold:
        ids = {r["id"] for r in locks}
        stacks = [r for r in stacks if r["lock"] in ids]
    if f.site:
        stacks = [r for r in stacks if r["frames"] and _match_site(r["frames"][0], f.site)]
    n = f.top or None
    out = dict(lk)
    out["locks"], out["sites"], out["threads"] = locks[:n], sites[:n], threads[:n]
    out["stacks"] = stacks[: n or 20]
    out["shown"] = {"locks": len(out["locks"]), "sites": len(out["sites"])}
    out["total"] = {"locks": len(lk["locks"]), "sites": len(lk["sites"])}
    return out


# The views --by chooses, per lens.
BY_VIEWS = {"comm": ("thread", "core", "node", "process"), "numa": ("site", "alloc", "thread")}


def filter_comm(c: dict, f: Filters) -> dict:
    """Apply --by/--kind/--top to the comm lens: tables sorted by the chosen kind's volume
    (rows without any of it dropped), the matrix to draw recorded in `view`."""
    by = f.by if f.by in BY_VIEWS["comm"] else "thread"
    kind = f.kind if f.kind in ("all", "true", "false") else "all"
    n = f.top or None
    out = dict(c)
    kept = {}
    for key in ("objects", "lines", "sites"):
        rows = sorted(c[key], key=lambda r: -r[kind])
        if kind != "all":
            rows = [r for r in rows if r[kind] > 0]
        kept[key] = len(rows)
        out[key] = rows[:n]
    out["view"] = {"by": by, "kind": kind}
    if f.by and f.by not in BY_VIEWS["comm"]:
        out["notes"] = [*c["notes"], f"--by {f.by} applies to the numa lens; comm shows by thread"]
    out["shown"] = {k: len(out[k]) for k in ("objects", "lines", "sites")}
    # Of the rows --kind kept: "N of M" is what --top cut ("--top 0 for all" shows the M).
    out["total"] = kept
    return out


NUMA_LOG_KEEP = ("start", "end")  # pinning-log entries shown only when room is left


def filter_numa(c: dict, f: Filters) -> dict:
    """Apply --by/--site/--top to the numa lens: `view.by` names the main table (site,
    alloc or thread); --top keeps the first rows of every table, and of the pinning log the
    binding changes first (thread starts and ends fill what room is left)."""
    by = f.by if f.by in BY_VIEWS["numa"] else "site"
    n = f.top or None
    out = dict(c)
    sites, alloc_sites = c["sites"], c["alloc_sites"]
    if f.site:
        sites = [r for r in sites if _match_site(r, f.site)]
        alloc_sites = [r for r in alloc_sites if _match_site(r, f.site)]
        if not sites and not alloc_sites:
            raise LocusError(
                f"no code or allocation site matches '{f.site}' (give FUNC or FILE:LINE)"
            )
    out["sites"], out["alloc_sites"] = sites[:n], alloc_sites[:n]
    # Every thread in creation order for machines; the busiest first when cut to --top.
    out["threads"] = sorted(c["threads"], key=lambda r: -r["accesses"])[:n] if n else c["threads"]
    out["allocations"] = c["allocations"][:n]
    log = c["pinning_log"]
    if n and len(log) > n:
        changes = [i for i, r in enumerate(log) if r["what"] not in NUMA_LOG_KEEP]
        rest = [i for i, r in enumerate(log) if r["what"] == "start"]
        keep = sorted(changes[:n] + rest[: max(n - len(changes), 0)])
        log = [log[i] for i in keep]
    out["pinning_log"] = log
    out["view"] = {"by": by}
    if f.by and f.by not in BY_VIEWS["numa"]:
        out["notes"] = [*c["notes"], f"--by {f.by} applies to the comm lens; numa shows by site"]
    keys = ("sites", "alloc_sites", "threads", "allocations", "pinning_log")
    out["shown"] = {k: len(out[k]) for k in keys}
    out["total"] = {k: len(c[k]) for k in keys}
    return out


def build(run: RunDir, lenses: list[str] | None = None, filters: Filters | None = None) -> dict:
    recorded = run.lenses
    lenses = lenses or recorded
    for lens in lenses:
        if lens not in recorded:
            have = ", ".join(recorded) if recorded else "none"
            raise LocusError(f"lens '{lens}' was not recorded in {run.path} (recorded: {have})")
        if lens not in LENSES:
            raise LocusError(f"lens '{lens}' has no analysis in this locus version")
    filters = filters or Filters()
    takes = {lens: BY_VIEWS[lens] for lens in lenses if lens in BY_VIEWS}
    if filters.by and not any(filters.by in views for views in takes.values()):
        raise LocusError(
            f"--by {filters.by} applies to no lens of this report ("
            + "; ".join(f"{lens}: {', '.join(v)}" for lens, v in BY_VIEWS.items())
            + ")",
            2,
        )
    out_lenses = {}
    for lens in lenses:
        res = LENSES[lens](run)
        res = {k: v for k, v in res.items() if not k.startswith("_")}
        if lens == "locks":
            res = filter_locks(res, filters)
        elif lens == "comm":
            res = filter_comm(res, filters)
        elif lens == "numa":
            res = filter_numa(res, filters)
        out_lenses[lens] = res
    info = run_info(run)
    notes = run_notes(run)
    if notes:
        info["notes"] = notes
        # The renderers print the lenses' notes: the run's go with the first lens's.
        first = next((r for r in out_lenses.values() if isinstance(r.get("notes"), list)), None)
        if first is not None:
            first["notes"] = [*notes, *first["notes"]]
    return {
        "locus_version": __version__,
        "format_version": run.meta.get("format_version", FORMAT_VERSION),
        "run": info,
        "overhead": overhead(run),
        "lenses": out_lenses,
    }


_WARNED: set[str] = set()  # files said changed on stderr, once per command


def run_notes(run: RunDir) -> list[str]:
    """Notes on the run as a whole, after the analyses (which named code and data from the
    files in its maps): processes that outlived the program or still run, and files that
    changed since the run (also on stderr, once each)."""
    changed = [run.changed_files[p] for p in sorted(run.changed_files)]
    for note in changed:
        if note not in _WARNED:
            _WARNED.add(note)
            print(f"locus: warning: {note}", file=sys.stderr)
    return [*run.notes(), *changed]


def plot(report: dict, outdir: str) -> list[str]:
    """--plot DIR: the heat maps of every lens in the report that draws one."""
    from locus.render import comm, numa

    plotters = {"comm": comm.plot, "numa": numa.plot}
    lenses = [lens for lens in report["lenses"] if lens in plotters]
    if not lenses:
        raise LocusError("--plot draws the comm and numa lenses: add --lens comm or --lens numa")
    return [p for lens in lenses for p in plotters[lens](report, outdir)]


def cmd_report(ns) -> int:
    from locus.render import render

    run = RunDir.open(ns.run)
    lens = getattr(ns, "lens", None)
    lenses = [lens] if isinstance(lens, str) else (list(lens) if lens else None)
    top = getattr(ns, "top", None)
    fmt = getattr(ns, "format", None) or "text"
    if top is None:
        top = 0 if fmt == "json" else 10  # machines get every row unless they ask
    f = Filters(
        top=top,
        min_wait=getattr(ns, "min_wait", None),
        min_hold=getattr(ns, "min_hold", None),
        lock=getattr(ns, "lock", None),
        site=getattr(ns, "site", None),
        by=getattr(ns, "by", None),
        kind=getattr(ns, "kind", None) or "all",
    )
    report = build(run, lenses, f)
    plot_dir = getattr(ns, "plot", None)
    if plot_dir is not None and not plot_dir.strip():
        raise LocusError("--plot needs a directory (it got an empty name)", 2)
    if plot_dir:
        paths = plot(report, plot_dir)
    sys.stdout.write(render(report, fmt))
    if plot_dir:
        sys.stdout.flush()
        print(f"locus: wrote {', '.join(paths)}", file=sys.stderr)
    return 0
