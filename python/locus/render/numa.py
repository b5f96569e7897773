"""Renderers of the numa lens: the header lines, the tables (totals with shares, the main
table chosen with --by, allocations, pinning log), the access matrices shaded in the
terminal and the matplotlib heat maps (--plot DIR)."""

from __future__ import annotations

from locus.analysis.common import callers_text, ranges, site_str, via_text
from locus.errors import LocusError
from locus.render.heat import masked_zeros, pyplot, save, shade, shade_legend, zero_apart
from locus.render.tables import Table
from locus.render.units import command_line, cost_error, count, nbytes, percent, seconds

MATRIX_TABLE = "numa_matrix"  # CSV only: text and Markdown draw the matrices instead
CPU_MATRIX_TABLE = "numa_cpu_matrix"
MAX_LABELLED = 10  # above this many nodes the terminal matrix drops the per-cell shares

# (field, meaning) of the totals table, in NUMAPROF's order.
TOUCH_ROWS = (
    ("first_touch", "pages first-touched by pinned threads"),
    ("unpinned_first_touch", "pages first-touched by threads allowed on several nodes"),
)
ACCESS_ROWS = (
    ("local", "pinned thread, pinned page, same node"),
    ("remote", "pinned thread, pinned page, another node"),
    ("memory_only_local", "pinned thread, page on its nearest memory-only node"),
    ("memory_only_remote", "pinned thread, page on a farther memory-only node"),
    ("unpinned_page", "pinned thread, page first-touched by an unpinned thread"),
    ("unpinned_thread", "unpinned thread, pinned page"),
    ("unpinned_both", "unpinned thread, unpinned page"),
    ("unknown", "the page's node is not known"),
)
UNPINNED = ("unpinned_page", "unpinned_thread", "unpinned_both")
SHORT_WHAT = {"sched_setaffinity": "sched_setaff", "pthread_setaffinity_np": "pthread_setaff"}


def _numa(report: dict) -> dict:
    return report["lenses"]["numa"]


def _pct(v, d):
    return None if v is None or not d else 100.0 * v / d


def _has_memory_only(c: dict) -> bool:
    return any(n["memory_only"] for n in c["nodes"])


def _where(r: dict) -> str:
    return site_str(r) + _via(r)


def _via(r: dict) -> str:
    """' (via xmalloc)': the allocation wrappers an allocation was named past."""
    return via_text(r.get("via") or [])


def _unit(c: dict) -> str:
    return c["unit"]


def _access_cols(c: dict) -> list[tuple[str, str, str]]:
    """The access columns of the site, allocation site and thread tables; `unpinned` (the
    three unpinned classes added up) stands in for them in 80 columns."""
    cols = [("acc", "n", "accesses"), ("local", "n", "local"), ("remote", "n", "remote")]
    if _has_memory_only(c):
        cols += [("mo local", "n", "memory_only_local"), ("mo remote", "n", "memory_only_remote")]
    cols += [
        ("unpinned", "n", "unpinned"),
        ("unp page", "n", "unpinned_page"),
        ("unp thr", "n", "unpinned_thread"),
        ("unp both", "n", "unpinned_both"),
        ("unknown", "n", "unknown"),
        ("touched", "n", "first_touch"),
        ("unp touch", "n", "unpinned_first_touch"),
    ]
    return cols


def _with_unpinned(r: dict) -> dict:
    return dict(r, unpinned=sum(r[k] for k in UNPINNED))


def numa_tables(report: dict) -> list[Table]:
    c = _numa(report)
    by = (c.get("view") or {}).get("by", "site")
    t = c["totals"]
    touched = t["first_touch"] + t["unpinned_first_touch"]
    totals = [
        {"class": k, "value": t[k], "unit": "pages", "share": _pct(t[k], touched), "meaning": m}
        for k, m in TOUCH_ROWS
    ]
    mo = _has_memory_only(c)
    for k, m in ACCESS_ROWS:
        if k.startswith("memory_only") and not mo and not t[k]:
            continue
        totals.append(
            {
                "class": k,
                "value": t[k],
                "unit": t["unit"],
                "share": _pct(t[k], t["accesses"]),
                "meaning": m,
            }
        )
    totals.append(
        {
            "class": "stack",
            "value": t["stack"],
            "unit": t["unit"],
            "share": _pct(t["stack"], t["accesses"] + t["stack"]),
            "meaning": "stack accesses, left out (share of all samples)",
        }
    )
    tables = [
        Table(
            "numa_totals",
            "Access classes and first touches",
            [
                ("class", "", "class"),
                ("count", "n", "value"),
                ("unit", "", "unit"),
                ("share", "%", "share"),
                ("meaning", "", "meaning"),
            ],
            totals,
        )
    ]
    acc = _access_cols(c)
    if by == "alloc":
        rows = [dict(_with_unpinned(r), where=_where(r)) for r in c["alloc_sites"]]
        tables.append(
            Table(
                "numa_alloc_sites",
                "Allocation sites by accesses",
                [("allocation site", "", "where"), ("blocks", "n", "blocks"), *acc],
                rows,
            )
        )
    elif by == "thread":
        rows = [
            dict(_with_unpinned(r), allowed=ranges(r["nodes_allowed"]) or "?", tname=r["name"])
            for r in c["threads"]
        ]
        tables.append(
            Table(
                "numa_threads",
                "Threads by accesses (nodes: where the thread may run at its end)",
                [
                    ("thread", "n", "index"),
                    ("tid", "", "tid"),
                    ("name", "", "tname"),
                    ("nodes", "", "allowed"),
                    *acc,
                ],
                sorted(rows, key=lambda r: -r["accesses"]),
            )
        )
    else:
        rows = [
            dict(
                _with_unpinned(r),
                where=_where(r)
                + callers_text(r)
                + callers_text(r, "touch_callers", " of its first touches"),
            )
            for r in c["sites"]
        ]
        tables.append(
            Table(
                "numa_sites",
                "Code sites by accesses (and the pages they first-touched)",
                [("site", "", "where"), *acc],
                rows,
                sep="; ",  # a site, then its callers (← ...): not a call stack
            )
        )
    allocs = []
    for a in c["allocations"]:
        placement = " ".join(f"n{k}:{v}" for k, v in a["pages_per_node"].items())
        if a["unplaced_pages"]:
            placement += f" ?:{a['unplaced_pages']}"
        if a.get("huge_pages_per_node"):
            hp = " ".join(f"n{k}:{v}" for k, v in a["huge_pages_per_node"].items())
            placement += f" (huge {hp})"
        who = " ".join(f"t{x['index']}:{x['pages']}" for x in a["first_touch_threads"][:4])
        if len(a["first_touch_threads"]) > 4:
            who += " …"
        allocs.append(
            dict(
                _with_unpinned(a),
                where=(a["site"] + _via(a)) if a["site"] else a["address"],
                block_address=a["address"],
                placement=placement,
                touched_by=who,
                remote_all=a["remote"] + a["memory_only_remote"],
                unpinned_acc=sum(a[k] for k in UNPINNED),
            )
        )
    tables.append(
        Table(
            "numa_allocations",
            "Allocations: page placement, first touchers (pages), accesses",
            [
                ("allocation", "", "where"),
                ("address", "", "block_address"),
                ("size", "B", "size"),
                ("pages", "n", "pages"),
                ("placement", "", "placement"),
                ("touched by", "", "touched_by"),
                ("acc", "n", "accesses"),
                ("remote", "n", "remote_all"),
                ("unpinned", "n", "unpinned_acc"),
            ],
            allocs,
        )
    )
    log = [
        dict(e, binding=_binding(e), call=SHORT_WHAT.get(e["what"], e["what"]), where=e["site"])
        for e in c["pinning_log"]
    ]
    tables.append(
        Table(
            "numa_pinning",
            "Pinning log",
            [
                ("t", "s", "t"),
                ("tid", "", "tid"),
                ("what", "", "call"),
                ("binding", "", "binding"),
                ("site", "", "where"),
            ],
            log,
        )
    )
    tables.append(_matrix_table(MATRIX_TABLE, "Access matrix", c["access_matrix"], c))
    tables.append(_matrix_table(CPU_MATRIX_TABLE, "CPU-node matrix", c["cpu_matrix"], c))
    return tables


def _binding(e: dict) -> str:
    """One pinning-log entry's effect in words: CPU nodes, memory policy, range."""
    nodes = ranges(e["nodes"]) if e["nodes"] else "?"
    if e["what"] in ("start", "end", "sched_setaffinity", "pthread_setaffinity_np"):
        cpus = f" ({e['cpus']} CPU{'s' if e['cpus'] != 1 else ''})" if e["cpus"] else ""
        by = f" by tid {e['caller']}" if e["caller"] not in (0, e["tid"]) else ""
        return f"nodes {nodes}{cpus}{by}"
    pol = ranges(e["policy_nodes"]) if e["policy_nodes"] else ""
    if e["what"] == "move_pages":
        return f"{e['len']} pages at {e['addr']} to node {pol or '?'}"
    mode = (e["mode"] or "?") + (f" {pol}" if pol else "")
    if e["what"] == "mbind":
        return f"{mode}: {nbytes(e['len'])} at {e['addr']}"
    return mode


def _matrix_table(name: str, title: str, m: dict, c: dict) -> Table:
    cols = [("row", "", "row")] + [(f"node {j}", "n", f"c{j}") for j in m["columns"]]
    rows = [
        dict({f"c{j}": v for j, v in zip(m["columns"], vals)}, row=r)
        for r, vals in zip(m["rows"], m["values"])
    ]
    return Table(name, f"{title} ({c['unit']})", cols, rows)


def summary_lines(report: dict) -> list[str]:
    c = _numa(report)
    dur = report["run"]["duration_s"] or 0.0
    lines = []
    if c["emulated"]:
        if c.get("fake_file"):
            how = f"--fake-numa {c['fake_file']}): {len(c['nodes'])} pretend nodes"
        else:
            k = f" {c['fake']}" if c.get("fake") else ""
            how = f"--fake-numa{k}): CPUs split into {len(c['nodes'])} pretend nodes"
        lines.append(f"numa      EMULATED topology ({how}, no access is really remote")
    if c["backend"] == "exact":
        how = "exact (every access instrumented): counts are accesses"
    elif c["period_unit"] == "ns":
        how = (
            f"{c['backend']}, 1 sample/{seconds(c['period'] / 1e9)} of a thread's CPU time:"
            " counts are samples, not accesses (shares are meaningful)"
        )
    elif c["period_unit"] == "accesses":
        how = f"{c['backend']}, 1 sample/{count(c['period'])} accesses: counts are accesses"
    else:
        how = f"{c['backend']}, period unknown: counts are samples"
    lines.append(f"numa      {how}")
    nodes = []
    for n in c["nodes"]:
        cpus = ranges(n["cpus"]) if n["cpus"] else "no CPU (memory only)"
        mem = f", {nbytes(n['mem_kb'] * 1024)}" if n.get("mem_kb") else ""
        nodes.append(
            f"node {n['id']}: CPUs {cpus}{mem}" if n["cpus"] else f"node {n['id']}: {cpus}{mem}"
        )
    lines.append("nodes     " + "; ".join(nodes))
    t = c["totals"]
    cnt = c["counters"]
    seen = c["samples"] + c["skipped"]
    if c["backend"] == "exact":
        lines.append(
            f"counted   {count(c['samples'])} records of counted accesses,"
            f" {count(t['stack'])} stack accesses left out"
        )
    else:
        th = c.get("thinning")
        lines.append(
            f"samples   {count(c['samples'])}"
            + (f" written of {count(th['taken'])} (--keep-samples)" if th else "")
            + f" ({percent(_pct(t['stack'], t['accesses'] + t['stack']))} stack),"
            f" {count(c['skipped'])} skipped ({percent(_pct(c['skipped'], seen))}),"
            f" {count(c['dropped'])} dropped"
        )
    acc = t["accesses"]
    unp = sum(t[k] for k in UNPINNED)
    mo = t["memory_only_local"] + t["memory_only_remote"]
    lines.append(
        f"accesses  local {percent(_pct(t['local'], acc))},"
        f" remote {percent(_pct(t['remote'], acc))}"
        + (f", memory-only {percent(_pct(mo, acc))}" if mo else "")
        + f", unpinned {percent(_pct(unp, acc))}, unknown {percent(_pct(t['unknown'], acc))}"
        f" of {count(acc)} {t['unit']}"
    )
    touched = t["first_touch"] + t["unpinned_first_touch"]
    huge = t.get("huge_pages", 0)
    lines.append(
        f"touches   {count(touched)} pages first-touched"
        + (f" (of them {count(huge)} huge pages, each counted once)" if huge else "")
        + f", {count(t['unpinned_first_touch'])} by"
        f" unpinned threads ({percent(_pct(t['unpinned_first_touch'], touched))})"
    )
    if c["backend"] != "exact":
        lines.append(
            f"numa cost {seconds(c['overhead_s'])}{cost_error(c)} in the samplers"
            f" ({percent(_pct(c['overhead_s'], dur))} of run), {count(cnt['signals'])} interrupts"
        )
    for a in c.get("advice", []):
        lines.append(f"advice    {a['text']}")
    return lines


def _matrix_lines(title: str, row_label: str, m: dict, unit: str) -> list[str]:
    vals = m["values"]
    total = sum(v for r in vals for v in r)
    if not total:
        return [f"{title}: none"]
    vmax = max(v for r in vals for v in r)
    labels = [r if isinstance(r, str) else f"node {r}" for r in m["rows"]]
    w = max(len(x) for x in labels + [row_label]) + 2
    out = [title]
    if len(m["columns"]) <= MAX_LABELLED:
        out.append(" " * w + "".join(f"{'node ' + str(j):>10}" for j in m["columns"]))
        for lab, r in zip(labels, vals):
            cells = "".join(f"   {shade(v, vmax)}{percent(_pct(v, total)):>6}" for v in r)
            out.append(f"{lab:<{w}}{cells}")
    else:
        out.append(" " * w + "".join(f"{j % 100:>2}" for j in m["columns"]))
        for lab, r in zip(labels, vals):
            out.append(f"{lab:<{w}}" + "".join(shade(v, vmax) * 2 for v in r))
    out.append("  " + "  ".join(shade_legend(f"the largest cell ({count(vmax)} {unit})")))
    return out


def heatmap_lines(report: dict) -> list[str]:
    """The access matrix (thread's binding -> page's node) and where the threads ran (the
    sample's CPU's node -> page's node), shaded, with each cell's share."""
    c = _numa(report)
    out = _matrix_lines(
        "Access matrix (rows: thread's node or unpinned; columns: page's node)",
        "unpinned",
        c["access_matrix"],
        c["unit"],
    )
    out.append("")
    out += _matrix_lines(
        "Where the threads ran (rows: node of the sample's CPU; columns: page's node)",
        "",
        c["cpu_matrix"],
        c["unit"],
    )
    return out


def plot(report: dict, outdir: str) -> list[str]:
    """PNG and SVG heat maps: the access matrix and the CPU-node matrix side by side, each
    cell annotated with its share. Returns the paths."""
    if "numa" not in report["lenses"]:
        raise LocusError("--plot draws the numa lens: add --lens numa")
    plt = pyplot(outdir)
    c = _numa(report)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
    for ax, key, title, ylabel in (
        (axes[0], "access_matrix", "accesses by binding", "thread's node"),
        (axes[1], "cpu_matrix", "accesses by CPU at the access", "CPU's node"),
    ):
        m = c[key]
        vals = m["values"] or [[0.0]]
        total = sum(v for r in vals for v in r)
        vmax = max(max(r) for r in vals) or 1
        # Zero cells white, any other from a visible blue on (and "<1%" rather than "0%"):
        # a small cell beside a large one looked empty.
        ax.imshow(
            masked_zeros(vals), cmap=zero_apart("Blues"), vmin=0, vmax=vmax, interpolation="nearest"
        )
        for i, r in enumerate(vals):
            for j, v in enumerate(r):
                pct = 100 * v / total if total else 0.0
                share = "" if not total else "<1%" if 0 < pct < 0.5 else f"{pct:.0f}%"
                color = "white" if v > 0.5 * vmax else "black"
                ax.text(j, i, share, ha="center", va="center", color=color, fontsize=9)
        if not total:
            ax.text(
                0.5,
                0.5,
                "no access with a known node"
                if key == "access_matrix"
                else "no access carries its CPU",
                transform=ax.transAxes,
                ha="center",
                va="center",
            )
        ax.set_xticks(range(len(m["columns"])), [str(x) for x in m["columns"]])
        ax.set_yticks(range(len(m["rows"])), [str(x) for x in m["rows"]])
        ax.set_xlabel("page's node")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} ({c['unit']})")
    cmd = command_line(report["run"].get("command"), 70)
    emu = " [EMULATED topology]" if c["emulated"] else ""
    fig.suptitle((f"locus numa: {cmd}" if cmd else "locus numa") + emu)
    return save(plt, fig, outdir, "numa-matrix")
