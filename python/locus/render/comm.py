"""Renderers of the comm lens: tables (objects, lines, sites, the selected matrix), the
summary lines, the terminal heat map and the matplotlib heat maps (--plot DIR)."""

from __future__ import annotations

import math
import re

from locus.analysis.comm import _ranges
from locus.analysis.common import callers_text, site_str
from locus.errors import LocusError
from locus.render.heat import masked_zeros, pyplot, save, shade, shade_legend, zero_apart
from locus.render.tables import Table
from locus.render.units import command_line, cost_error, count, nbytes, percent, seconds

MATRIX_TABLE = "comm_matrix"  # CSV only: text and Markdown show the heat map instead
# Shades of the terminal heat map, from "no communication" to the maximum cell.
MAX_CELLS = 32  # larger matrices are aggregated into blocks of consecutive indices
AXIS = {"thread": "thread", "core": "CPU", "node": "node", "process": "process"}


def _axes(by: str) -> str:
    """The plural of AXIS[by]."""
    return "processes" if by == "process" else f"{AXIS[by]}s"


def _comm(report: dict) -> dict:
    return report["lenses"]["comm"]


def _view(c: dict) -> tuple[str, str]:
    v = c.get("view") or {}
    return v.get("by", "thread"), v.get("kind", "all")


def vol_unit(c: dict) -> str:
    """Table unit of a volume: seconds of CPU time (time-based sampling), else a count."""
    return "s" if c["unit"] == "s" else "n"


def volume(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "s":
        return seconds(v)
    if unit == "lines":
        return f"{count(round(v))} lines"
    if unit == "samples":
        return f"{count(round(v))} samples"
    return count(round(v))


def _pct(v, d):
    return None if v is None or not d else 100.0 * v / d


def _spans(spans: list) -> str:
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _field_note(fields: list | None, obj: str) -> str:
    """` (.hits)`: the first field a thread's bytes cover, relative to the line's object
    (`stats[0].hits` of `stats`), `+` when there are more; "" without fields."""
    if not fields:
        return ""
    f = fields[0]
    # (a field of another variable beside it, `sb2.hits` beside `sb`, keeps its name)
    f = (
        f[len(obj) :]
        if f.startswith(obj) and f[len(obj) : len(obj) + 1] in (".", "[", "(", "-")
        else f
    )
    return f" ({f}{'+' if len(fields) > 1 else ''})"


# A table cell lists at most this many parts of a thread list, and a hot line the bytes of
# at most this many threads: with a thousand threads the object's name stays readable.
TABLE_RANGES = 3
LINE_THREADS = 8


def _short_site(site: str) -> str:
    """'work /src/p2p.c:9' -> 'work p2p.c:9'; a bare function (C++ names have spaces) or
    address as it is."""
    func, _, where = site.rpartition(" ")
    if func and re.fullmatch(r"\S+:\d+", where):
        return f"{func} {where.rsplit('/', 1)[-1]}"
    return site


def comm_tables(report: dict) -> list[Table]:
    c = _comm(report)
    u = vol_unit(c)
    vols = [("all", u, "all"), ("true", u, "true"), ("false", u, "false")]
    # A run of several processes (fork): the same static in each is its own object: the
    # text says whose (a line's threads, in the legend, say it for the lines).
    many = len({t.get("pid") for t in c.get("threads") or []}) > 1

    # Objects of one name (blocks from one allocation wrapper or line, without call stacks):
    # their sizes tell them apart.
    sizes: dict[str, set] = {}
    for o in c["objects"]:
        sizes.setdefault(o["name"], set()).add(o.get("size"))

    def of(r: dict) -> str:
        size = f" ({r['size']} B)" if len(sizes.get(r["name"], ())) > 1 and r.get("size") else ""
        return size + (f" [pid {r['pid']}]" if many and r.get("pid") else "")

    objects = []
    un = c.get("unattributed")
    rows = c["objects"] + ([dict(un, name="(unattributed)", kind="", size=None)] if un else [])
    _by, kind = _view(c)  # --kind sorts the tables by that kind, as JSON's
    for r in sorted(rows, key=lambda r: (-r[kind], -r["all"], -r["false"])):
        objects.append(
            dict(
                r,
                # A stack's named locals (the frames that started its threads hold them), a
                # heap block's pointer (what its allocating line assigns it to).
                name=r["name"]
                + of(r)
                + (": " + ", ".join(v["name"] for v in r["locals"]) if r.get("locals") else "")
                + (f": {r['pointer']}" if r.get("pointer") else ""),
                false_pct=_pct(r["false"], r["all"]),
                thread_list=_ranges(r["threads"], most=TABLE_RANGES, count=False),
                obj_size=r["size"],
            )
        )
    lines = []
    for r in c["lines"]:
        at = r["object"]
        # A line of a thread's stack is its own address: an offset into megabytes of stack
        # says nothing (JSON keeps it).
        if r["offset"] is not None and not at.startswith("stack of "):
            # @+64: the line starts 64 bytes into the object; @-32: the object starts 32
            # bytes into the line.
            at += f" @{r['offset']:+d}"
        each = [
            f"t{t['thread']}:{_spans(t['bytes'])}{_field_note(t.get('fields'), r['object'])}"
            for t in r["threads"]
        ]
        ranges, full = " ".join(each[:LINE_THREADS]), " ".join(each)
        if len(r["threads"]) > LINE_THREADS:
            ranges += f" … and {len(r['threads']) - LINE_THREADS} more threads (JSON `lines`)"
        # "function file:line" as the sites come (the file without its directory).
        code = list(dict.fromkeys(_short_site(str(x)) for x in r["sites"]))
        lines.append(
            dict(
                r,
                object_at=at,
                ranges=ranges,
                ranges_all=full,
                code="\n".join(code[:4]),
                code_all="\n".join(code),
            )
        )
    sites = []
    for r in c["sites"]:
        # A site in the C library: the program's calls that led there (JSON `callers`).
        where = site_str(r) + callers_text(r)
        sites.append(dict(r, where=where, false_pct=_pct(r["false"], r["all"])))
    shown, total = c.get("shown") or {}, c.get("total") or {}
    tables = [
        Table(
            "comm_objects",
            "Objects by communication volume",
            [("object", "", "name"), ("kind", "", "kind"), ("size", "B", "obj_size"), *vols]
            + [("false%", "%", "false_pct"), ("threads", "", "thread_list")],
            objects,
            shown=shown.get("objects"),
            total=total.get("objects"),
        ),
        Table(
            "comm_lines",
            "Cache lines by communication volume (bytes each thread touched)",
            [("line", "", "address"), ("object", "", "object_at"), *vols]
            + [("bytes by thread", "", "ranges"), ("code", "", "code")],
            lines,
            sep="; ",  # the code sites of a line, writer and reader: not a call stack
            shown=shown.get("lines"),
            total=total.get("lines"),
            csv_keys={"ranges": "ranges_all", "code": "code_all"},
        ),
        Table(
            "comm_sites",
            "Code sites by communication volume (writer or reader)",
            [("site", "", "where"), *vols, ("false%", "%", "false_pct")],
            sites,
            sep="; ",  # a site, then its callers (← ...): not a call stack
            shown=shown.get("sites"),
            total=total.get("sites"),
        ),
    ]
    tables.append(matrix_table(c))
    return tables


def matrix_table(c: dict) -> Table:
    """The selected matrix (--by, --kind) as rows: one column per index."""
    by, kind = _view(c)
    m = c["matrices"][by][kind]
    u = vol_unit(c)
    cols = [(AXIS[by], "", "row")] + [(str(j), u, f"c{j}") for j in range(len(m))]
    rows = [dict({f"c{j}": v for j, v in enumerate(row)}, row=i) for i, row in enumerate(m)]
    return Table(MATRIX_TABLE, f"Communication matrix by {by}, {kind} sharing", cols, rows)


# The exact backend's cost, measured on the workloads (bench/comm.py --only exact -n 3,
# 2026-11-28, the default inlined builds): gcc with the late-tsan plugin x0.7-10.5 (medians
# x1.2-7.9), clang LTO x2.1-11; gcc without the plugin (AVX code, another gcc) up to x22 on
# a loop of stores the plain build vectorises.
EXACT_COST = (
    "every access runs the hit test, a workload x1-11 slower than its plain build (up to x22 "
    "where gcc's late-tsan plugin cannot run)"
)


def _bytes_part(t: dict) -> str:
    """', 918.8 MiB' (lines moved), or ', ≥ 37.9 KiB moved (one line per sampled
    detection)' where the volume is time or samples (totals.bytes_method)."""
    if t.get("bytes") is None:
        return ""
    if t.get("bytes_method") == "lower_bound":
        if not t["bytes"]:
            return ""
        return f", ≥ {nbytes(t['bytes'])} moved (one line per sample detection, traps not counted)"
    return f", {nbytes(t['bytes'])}"


def _how_detected(t: dict) -> str:
    """' (12 by lookup, 30 by trap, 2,650 on loads, 40 between processes)' when any detection
    was a trap or between processes."""
    trap, loaded = t.get("detections_trap") or 0, t.get("detections_loaded") or 0
    procs = t.get("detections_between_processes") or 0
    if not trap and not loaded and not procs:
        return ""
    parts = [f"{count(t.get('detections_lookup') or 0)} by lookup", f"{count(trap)} by trap"]
    if loaded:
        parts.append(f"{count(loaded)} on loads")
    if procs:
        parts.append(f"{count(procs)} between processes")
    return f" ({', '.join(parts)})"


def _skip_parts(c: dict) -> str:
    """': N no access, U undecodable, K in kernel' when any interrupt was skipped."""
    k = c["counters"]
    if not c["skipped"] or c["backend"] == "exact":
        return ""
    nomem = c["skipped"] - k.get("undecoded", 0) - k.get("kernel", 0)
    return (
        f": {count(nomem)} no access, {count(k.get('undecoded', 0))} undecodable,"
        f" {count(k.get('kernel', 0))} in kernel"
    )


def summary_lines(report: dict) -> list[str]:
    c = _comm(report)
    dur = report["run"]["duration_s"] or 0.0
    unit = c["unit"]
    if c["backend"] == "exact":
        how = "exact (every access of the code built with locus cc)"
    elif c["period_unit"] == "ns" and c["unit"] == "samples":
        how = f"{c['backend']}, ~1 sample/{seconds(c['period'] / 1e9)} per event (adaptive)"
    elif c["period_unit"] == "ns":
        how = f"{c['backend']}, 1 sample/{seconds(c['period'] / 1e9)} CPU"
    elif c["period_unit"] == "accesses":
        how = f"{c['backend']}, 1 sample/{count(c['period'])} accesses"
    else:
        how = f"{c['backend']}, period unknown"
    wp = c["watchpoints"]
    seen = c["samples"] + c["skipped"]
    if c["backend"] == "exact":  # samples: every access; skipped: those not tracked, of them
        counted = (
            f" {count(c['samples'])} accesses, {count(c['skipped'])} not tracked"
            f" ({percent(_pct(c['skipped'], c['samples']))})"
        )
    else:
        th = c.get("thinning")
        written = f" ({count(th['written'])} written, --keep-samples)" if th else ""
        counted = (
            f" {count(c['samples'])} samples{written}, {count(c['skipped'])} skipped"
            f" ({percent(_pct(c['skipped'], seen))}{_skip_parts(c)})"
        )
    on_loads = " (and on loads)" if c.get("watch_loads") and wp else ""
    lines = [f"comm      {how}, {wp if wp is not None else '?'} watchpoints{on_loads},{counted}"]
    t = c["totals"]
    rse = f" (±{percent(100 * t['rse'])})" if t.get("rse") else ""
    # exact: every transfer is counted; its events are aggregates (line, threads, verdict).
    source = (
        f"(every transfer counted; {count(t['detections'])} aggregates)"
        if c["backend"] == "exact"
        else f"from {count(t['detections'])} detections{_how_detected(t)}"
    )
    lines.append(
        f"volume    {volume(t['all'], unit)}{rse} {source}:"
        f" true {volume(t['true'], unit)}, false {volume(t['false'], unit)}"
        f" ({percent(_pct(t['false'], t['all']))})" + _bytes_part(t)
    )
    dropped = f"{count(c['counters']['dropped'])} records dropped"
    if c["backend"] == "exact":
        # No handler runs: the cost is the instrumented build's, inside the program.
        lines.append(
            f"comm cost in the program itself: {EXACT_COST}; not measured per run; {dropped}"
        )
    else:
        lines.append(
            f"comm cost {seconds(c['overhead_s'])}{cost_error(c)} in the comm handlers"
            f" ({percent(_pct(c['overhead_s'], dur))} of run), {dropped}"
        )
    for a in c.get("advice", []):
        lines.append(f"advice    {a}")
    return lines


def _blocks(n: int) -> list[tuple[int, int]]:
    """Consecutive index ranges [lo, hi) so that at most MAX_CELLS remain."""
    g = max(1, math.ceil(n / MAX_CELLS))
    return [(lo, min(lo + g, n)) for lo in range(0, n, g)]


def aggregate(m: list[list[float]]) -> tuple[list[list[float]], list[tuple[int, int]]]:
    """Blocks of consecutive indices: cell (I, J) is the volume exchanged between the
    indices of group I and those of group J, each pair once. The matrix is symmetric (a
    pair's volume at [a][b] and at [b][a]): off the diagonal the block I x J holds each pair
    once; on it, the block holds each pair inside the group twice, so only its upper
    triangle is summed (the sum of the whole block doubled the diagonal cells)."""
    n = len(m)
    blocks = _blocks(n)
    if len(blocks) == n:
        return m, blocks
    out = [
        [
            sum(m[i][j] for i in range(a, b) for j in range(i + 1 if a == c else c, d))
            for c, d in blocks
        ]
        for a, b in blocks
    ]
    return out, blocks


def within_volume(c: dict, by: str, kind: str) -> tuple[float, float]:
    """(volume exchanged inside one CPU or node, the kind's total): the matrix holds a pair's
    volume once in its upper triangle, and its diagonal is zero by definition, so what the
    total has beyond the upper triangle was exchanged within one index (0 by thread)."""
    total = float((c.get("totals") or {}).get(kind) or 0)
    if by == "thread" or not total:
        return 0.0, total
    m = c["matrices"][by][kind]
    between = sum(v for i, row in enumerate(m) for v in row[i + 1 :])
    within = total - between
    return (within if within > 1e-9 * total else 0.0), total


def _no_cpu(c: dict, by: str) -> str:
    """' or without a recorded CPU' when some detections have none (totals.no_cpu): they
    are in the totals and in no core or node matrix."""
    if by not in ("core", "node"):
        return ""
    missing = (c.get("totals") or {}).get("no_cpu")
    if missing is None:  # a report from before `no_cpu`: its note says it
        missing = any("no CPU recorded" in x for x in c.get("notes") or [])
    return " or without a recorded CPU" if missing else ""


def heatmap_lines(report: dict) -> list[str]:
    """The selected matrix as block characters, 2 columns per cell, with its legend."""
    c = _comm(report)
    by, kind = _view(c)
    m, blocks = aggregate(c["matrices"][by][kind])
    n = len(m)
    title = f"Communication heat map by {AXIS[by]}, {kind} sharing"
    within, total = within_volume(c, by, kind)
    if not n or not any(v for row in m for v in row):
        # A pair's exchange is off the diagonal: say why the map is empty when the volume is
        # not (one node, one CPU, or all of it within each).
        if total and by != "thread":
            where = f"in one {AXIS[by]}" if n == 1 else f"within each {AXIS[by]}"
            return [
                f"{title}: none between {_axes(by)}; all {volume(total, c['unit'])} was "
                f"exchanged {where}{_no_cpu(c, by)} (the diagonal, zero by definition)"
            ]
        return [f"{title}: none"]
    vmax = max(v for row in m for v in row)
    g = blocks[0][1] - blocks[0][0]
    out = [title + (f" ({g} {_axes(by)} per cell)" if g > 1 else "")]
    # Two characters per cell: from 10 on, the tens above the units ("91011" ran together).
    if blocks[-1][0] >= 10:
        out.append(
            "      " + "".join(f"{lo // 10 % 10 if lo >= 10 else '':>2}" for lo, _ in blocks)
        )
    out.append(
        "      " + "".join(f"{lo % 10 if blocks[-1][0] >= 10 else lo:>2}" for lo, _ in blocks)
    )
    for (lo, _hi), row in zip(blocks, m):
        out.append(f"{lo:>5} " + "".join(shade(v, vmax) * 2 for v in row))
    out.append("      " + "  ".join(shade_legend(f"max {volume(vmax, c['unit'])}")))
    if g > 1:
        # Groups are named by their first index; a pair is counted once in every cell.
        things = _axes(by)
        out.append(
            f"      row i, column j = volume exchanged between the {things} of groups i and j"
        )
        out.append(f"      (each pair once; on the diagonal: between the {things} of one group)")
    else:
        out.append("      symmetric (M + Mᵀ): row i, column j = volume exchanged by i and j")
    if within:
        # The diagonal is zero by definition: what the map cannot show (a CPU's threads
        # exchanging through its own caches can be most of the volume).
        out.append(
            f"      not shown: {volume(within, c['unit'])} of {volume(total, c['unit'])}"
            f" ({percent(_pct(within, total))}) was exchanged within one {AXIS[by]}{_no_cpu(c, by)}"
        )
    if by == "thread" and c.get("threads"):
        out.append("      " + thread_legend(c["threads"]))
    if by == "process" and c.get("processes"):
        out.append("      " + process_legend(c["processes"]))
    return out


LEGEND_THREADS = 12


def _work_differs(t: dict) -> bool:
    """Whether a thread's `work` ("function file:line") names another function than its
    start routine: the legend shows it after an arrow only then."""
    work, name = t.get("work") or "", t.get("name") or ""
    return bool(work) and work != name and not work.startswith(name + " ")


def thread_legend(threads: list[dict]) -> str:
    """'threads: 0 main (tid 10), 1 worker (tid 11), ...': what the matrix's indices are."""
    # The system's thread name where the program set one (the main thread's is the program's).
    base = threads[0].get("os_name", "")
    many = len({t.get("pid") for t in threads}) > 1  # fork: whose thread
    # What a thread ran, where its start routine does not say it (std::thread, libgomp).
    # Threads left out (no samples, over 64): the kept ones' place in creation order.
    parts = [
        f"{t['index']}"
        + (f" (#{t['created']})" if t.get("created", t["index"]) != t["index"] else "")
        + f" {t['name'] or '?'}"
        + (f" → {t['work']}" if _work_differs(t) else "")
        + (f" [{t['os_name']}]" if t.get("os_name") and t["os_name"] != base else "")
        + (f" (pid {t['pid']}, tid {t['tid']})" if many and t.get("pid") else f" (tid {t['tid']})")
        for t in threads[:LEGEND_THREADS]
    ]
    more = len(threads) - LEGEND_THREADS
    return (
        "threads: " + ", ".join(parts) + (f", and {more} more (JSON `threads`)" if more > 0 else "")
    )


def process_legend(processes: list[dict]) -> str:
    """'processes: 0 stress-ng (pid 10), 1 ...': what the process matrix's indices are."""
    parts = [
        f"{p['index']} {p.get('command') or '?'} (pid {p['pid']})"
        for p in processes[:LEGEND_THREADS]
    ]
    more = len(processes) - LEGEND_THREADS
    return "processes: " + ", ".join(parts) + (f", and {more} more" if more > 0 else "")


def plot(report: dict, outdir: str) -> list[str]:
    """PNG and SVG heat maps of the selected --by matrix: all, true and false side by side
    (one colour scale), as in the ComDetective paper's figures. Returns the paths."""
    if "comm" not in report["lenses"]:
        raise LocusError("--plot draws the comm lens: add --lens comm")
    plt = pyplot(outdir)
    from matplotlib.ticker import MaxNLocator

    c = _comm(report)
    by, _kind = _view(c)
    mats = c["matrices"][by]
    vmax = max([v for k in ("all", "true", "false") for row in mats[k] for v in row] + [0.0])
    unit = {"s": "CPU seconds", "lines": "cache lines"}.get(c["unit"], c["unit"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4), constrained_layout=True)
    im = None
    totals = c.get("totals") or {}
    # Zero cells white, any other from a visible grey on: with a linear scale from white,
    # a cell of 60 beside a maximum of 10,000 could not be told from an empty one.
    cmap = zero_apart("Greys")
    for ax, k in zip(axes, ("all", "true", "false")):
        m = mats[k]
        im = ax.imshow(
            masked_zeros(m if m else [[0.0]]),
            cmap=cmap,
            vmin=0,
            vmax=vmax or 1,
            interpolation="nearest",
        )
        ax.set_title(f"{k} sharing")
        ax.set_xlabel(AXIS[by])
        ax.set_ylabel(AXIS[by])
        if len(m) <= 16:
            # Every index (a 1x1 node matrix had ticks at -0.5 ... 0.5).
            ax.set_xticks(range(max(len(m), 1)))
            ax.set_yticks(range(max(len(m), 1)))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if not any(v for row in m for v in row):
            # An empty panel says why, as the text does.
            total = totals.get(k) or 0
            why = (
                f"none between {_axes(by)}:\n{volume(total, c['unit'])} exchanged\n"
                f"{'in one ' + AXIS[by] if len(m) == 1 else 'within each ' + AXIS[by]}"
                if total and by != "thread"
                else "none"
            )
            ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center")
    if vmax > 0:
        # Without any volume the bar's 0-1 scale would mean nothing: the panels say "none".
        fig.colorbar(im, ax=list(axes), shrink=0.8, label=f"volume ({unit}); white: none")
    cmd = command_line(report["run"].get("command"), 70)
    fig.suptitle(f"locus comm: {cmd}" if cmd else "locus comm")
    return save(plt, fig, outdir, f"comm-{by}")
