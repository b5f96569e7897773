"""The tables of a report, shared by the text, CSV and Markdown renderers.

A column is (header, unit, key); units: "s" seconds, "%" percent, "n" a count, "B" bytes,
"" text.
CSV prints raw values (seconds as plain numbers, `_s` in the header), text and Markdown
format them with units.
"""

from __future__ import annotations

from dataclasses import dataclass

from locus.analysis.common import site_str


@dataclass
class Table:
    name: str  # machine name (csv section)
    title: str
    columns: list[tuple[str, str, str]]  # (header, unit, key)
    rows: list[dict]
    sep: str = " < "  # what joins a multi-line cell in CSV (call stacks: callee < caller)
    shown: int | None = None  # rows kept by --top, of `total`: the title says "N of M"
    total: int | None = None
    csv_keys: dict | None = None  # column key -> the row key CSV writes (whole, not cut)
    text_keys: dict | None = None  # column key -> the row key text and Markdown show

    @property
    def heading(self) -> str:
        """The title, with "(10 of 19; --top 0 for all)" when --top cut the rows."""
        cut = self.total is not None and self.shown is not None and self.total > self.shown
        return self.title + (f" ({self.shown} of {self.total}; --top 0 for all)" if cut else "")


def _pct(v, d):
    return None if v is None or not d else 100.0 * v / d


def locks_tables(report: dict) -> list[Table]:
    lk = report["lenses"]["locks"]
    dur = report["run"]["duration_s"] or 0.0
    # The lock's kind beside its name (a condition variable's "acq" are its waits).
    locks = [
        dict(r, wait_pct=_pct(r["wait_s"], dur), name_kind=f"{r['name']} ({r['kind']})")
        for r in lk["locks"]
    ]
    sites = []
    for r in lk["sites"]:
        where = site_str(r)
        sites.append(dict(r, where=where))
    tables = [
        Table(
            "locks",
            "Locks by wait time",
            [
                ("id", "", "id"),
                ("lock", "", "name"),
                ("acq", "n", "acquisitions"),
                ("cont", "n", "contended"),
                ("wait", "s", "wait_s"),
                ("wait%", "%", "wait_pct"),
                ("max", "s", "max_wait_s"),
                ("hold", "s", "hold_s"),
                ("crit", "s", "critical_wait_s"),
            ],
            locks,
            text_keys={"name": "name_kind"},
        ),
        Table(
            "sites",
            "Call sites by wait time",
            [
                ("site", "", "where"),
                ("lock", "", "lock"),
                ("acq", "n", "acquisitions"),
                ("cont", "n", "contended"),
                ("wait", "s", "wait_s"),
                ("hold", "s", "hold_s"),
                ("crit wait", "s", "critical_wait_s"),
            ],
            sites,
        ),
        Table(
            "threads",
            "Threads by wait time",
            [
                ("tid", "", "tid"),
                ("acq", "n", "acquisitions"),
                ("wait", "s", "wait_s"),
                ("join", "s", "join_wait_s"),
                ("hold", "s", "hold_s"),
                ("hold sum", "s", "hold_combined_s"),
                ("on cpu", "s", "service_s"),
            ],
            lk["threads"],
        ),
    ]
    if lk.get("stacks"):
        stacks = [
            dict(r, stack="\n".join(site_str(f) for f in r["frames"][:8])) for r in lk["stacks"]
        ]
        tables.append(
            Table(
                "stacks",
                "Call stacks by wait time (innermost frame first)",
                [
                    ("lock", "", "lock"),
                    ("events", "n", "events"),
                    ("wait", "s", "wait_s"),
                    ("hold", "s", "hold_s"),
                    ("stack", "", "stack"),
                ],
                stacks,
            )
        )
    return tables


def _n(k: int, one: str, many: str = "") -> str:
    """'1 thread', '3 threads'."""
    return f"{k} {one if k == 1 else many or one + 's'}"


def summary_lines(report: dict) -> list[str]:
    """The header: run, overhead, locks summary, losses."""
    run = report["run"]
    ov = report["overhead"]
    from locus.render.units import command_line, count, percent, seconds, threads

    dur = run["duration_s"] or 0.0
    cmd = command_line(run["command"]) or "?"
    state = "complete" if run["complete"] else "INCOMPLETE"
    lines = [
        f"command   {cmd}",
        f"run       {seconds(dur)}, {_n(run['threads'], 'thread')} in "
        f"{_n(len(run['pids']), 'process', 'processes')}, {state}, exit "
        f"{'unknown' if run['exit_status'] is None else run['exit_status']}"
        + (f" (killed by {run['signal']})" if run.get("signal") else ""),
    ]
    box = run.get("sandboxed") or []
    if box:
        shown = ", ".join(f"{b['pid']} at {seconds(b['at_s'])}" for b in box[:4])
        lines.append(
            f"sandbox   {_n(len(box), 'process', 'processes')} installed a seccomp filter"
            f" ({shown}{', ...' if len(box) > 4 else ''}): each is recorded up to it, not after"
            " (the filter could refuse locus's system calls)"
        )
    lines += [
        f"overhead  {seconds(ov['runtime_s'])} in the runtime"
        f" ({percent(_pct(ov['runtime_s'], ov.get('thread_time_s') or dur))} of thread time),"
        f" {count(ov['records'])} records,"
        f" {count(ov['dropped'])} dropped",
    ]
    lk = report["lenses"].get("locks")
    if lk:
        s = lk["summary"]
        cp = s["critical_path"]
        est = "~" if lk.get("estimated") else ""  # sampled timing: an estimate
        lines.append(
            f"locks     {count(s['acquisitions'])} acquisitions, {count(s['contended'])}"
            f" contended, wait {est}{seconds(s['wait_s'])}, hold {est}{seconds(s['hold_s'])}"
        )
        # The waits the path jumped through were spent while it ran on other threads: they
        # overlap it and one another, and may sum to more than the path or the run.
        length = f" of {seconds(cp['length_s'])}" if cp.get("length_s") is not None else ""
        lines.append(
            f"critical  {count(cp['events'])} sections on a path{length}: hold"
            f" {seconds(cp['hold_s'])} on it; waits it passed through {seconds(cp['wait_s'])}"
            " (in other threads, overlapping it)"
        )
        if s["dependency_loss_s"] is None:
            lines.append("losses    n/a (no scheduler samples)")
        else:
            lines.append(
                f"losses    {threads(s['active_threads_avg'])} active of {s['max_threads']}:"
                f" lost {seconds(s['dependency_loss_s'])}"
                f" = waits {seconds(s['lock_wait_loss_s'])}"
                f" + other {seconds(s['unaccounted_loss_s'])}"
            )
    return lines
