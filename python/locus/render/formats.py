"""Report dict -> text (rich tables, 80 columns), JSON, CSV, Markdown."""

from __future__ import annotations

import csv
import io
import json
import shutil

from locus.render import comm, monitor, numa
from locus.render.tables import Table, locks_tables, summary_lines
from locus.render.units import fmt

TABLES = {
    "locks": locks_tables,
    "comm": comm.comm_tables,
    "numa": numa.numa_tables,
    "monitor": monitor.monitor_tables,
}
# Per-lens header lines after the run's, and text drawn after the lens's tables (heat
# maps); tables named in PICTURED are drawn that way in text and Markdown (CSV keeps them).
SUMMARY = {
    "comm": comm.summary_lines,
    "numa": numa.summary_lines,
    "monitor": monitor.summary_lines,
}
PICTURES = {"comm": comm.heatmap_lines, "numa": numa.heatmap_lines}
PICTURED = {comm.MATRIX_TABLE, numa.MATRIX_TABLE, numa.CPU_MATRIX_TABLE}
# code of comm lines: see the sites table; numa's unpinned classes: their sum `unpinned`
NARROW_SKIP = {"wait_pct", "code", "unpinned_page", "unpinned_thread", "unpinned_both"}
NARROW_SKIP |= {"unknown", "meaning", "block_address", "unpinned_acc", "obj_size"}
WIDE = (
    "code",
    "name",
    "name_kind",
    "where",
    "stack",
    "object_at",
    "ranges",
    "placement",
    "touched_by",
    "binding",
    "meaning",
)
WIDE_MIN = {"name": 22, "code": 30}  # else 12


def _tables(report: dict) -> list[Table]:
    out: list[Table] = []
    for lens in report["lenses"]:
        out += TABLES[lens](report)
    return out


def _summary(report: dict) -> list[str]:
    out = summary_lines(report)
    for lens in report["lenses"]:
        if lens in SUMMARY:
            out += SUMMARY[lens](report)
    return out


def _pictures(report: dict) -> list[list[str]]:
    return [PICTURES[lens](report) for lens in report["lenses"] if lens in PICTURES]


def _notes(report: dict) -> list[str]:
    return [n for lens in report["lenses"].values() for n in lens.get("notes", [])]


def _no_lone_surrogates(v):
    """v with every string's undecodable bytes (kept as lone surrogates by surrogateescape:
    a path or command line that is not UTF-8) as U+FFFD, as the report's text shows them."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(v, dict):
        return {_no_lone_surrogates(k): _no_lone_surrogates(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_no_lone_surrogates(x) for x in v]
    return v


def json_text(obj, **kw) -> str:
    """json.dumps, with no lone surrogate escape (`\\udce9`) in the text: JSON readers other
    than Python's refuse one (serde_json, Go's encoding/json replaces it). Only a text that
    has one is walked again."""
    text = json.dumps(obj, **kw)
    return json.dumps(_no_lone_surrogates(obj), **kw) if "\\ud" in text else text


def to_json(report: dict) -> str:
    # Compact: a comm report of thousands of threads holds several N x N matrices, which
    # one number per line would make hundreds of megabytes. `jq .` pretty-prints.
    return json_text(report, separators=(",", ":"), allow_nan=False) + "\n"


def _rich_table(t: Table, cols: list, cells: list[dict], widest: dict[str, int]):
    """A rich table of `cols`: names, stacks, code sites and byte ranges (WIDE) fold to the
    width left; the other columns (numbers, addresses, kinds) are never narrower than their
    widest cell (`widest`, by key), so that no number is cut."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table as RichTable

    rt = RichTable(
        title=escape(t.heading),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        title_justify="left",
    )
    for header, unit, key in cols:
        wide = key in WIDE
        rt.add_column(
            header,
            justify="right" if unit else "left",
            overflow="fold" if wide else "ellipsis",
            no_wrap=not wide,
            min_width=WIDE_MIN.get(key, 12) if wide else widest[key],
        )
    for c in cells:
        rt.add_row(*(c[k] for _h, _u, k in cols))
    return rt


def to_text(report: dict, width: int | None = None) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement

    buf = io.StringIO()
    if width is None:
        # The terminal's width when printing to one; in files and pipes COLUMNS, else 80.
        width = shutil.get_terminal_size((80, 24)).columns
    con = Console(file=buf, width=max(width, 80), no_color=True, highlight=False, soft_wrap=False)
    unbounded = con.options.update_width(1 << 16)  # to measure what a table needs
    for line in _summary(report):
        con.print(line, markup=False)
    for t in _tables(report):
        if t.name in PICTURED:
            continue
        con.print()
        if not t.rows:
            con.print(f"{t.title}: none", markup=False)
            continue
        # Cells are text, not rich markup ("fsv [pid 4]" lost its "[pid 4]").
        shown = t.text_keys or {}
        cells = [
            {k: escape(fmt(r.get(shown.get(k, k)), u)) for _h, u, k in t.columns} for r in t.rows
        ]
        # Derived columns (they stay in JSON, CSV and Markdown) are left out under 100
        # columns, and from there, last first, while the table cannot fit the width without
        # cutting a number or an address.
        cols = [c for c in t.columns if width >= 100 or c[2] not in NARROW_SKIP]
        droppable = [c for c in reversed(cols) if c[2] in NARROW_SKIP]
        widest = {
            k: max([len(h)] + [len(x) for c in cells for x in c[k].split("\n")])
            for h, _u, k in cols
            if k not in WIDE
        }
        while True:
            rt = _rich_table(t, cols, cells, widest)
            if not droppable or Measurement.get(con, unbounded, rt).minimum <= width:
                break
            cols.remove(droppable.pop(0))
        con.print(rt)
    for pic in _pictures(report):
        con.print()
        for line in pic:
            con.print(line, markup=False)
    notes = _notes(report)
    if notes:
        con.print()
        for n in notes:
            con.print(f"note: {n}", markup=False)
    return buf.getvalue()


def _raw(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.9g}"
    return v


def _one_line(v, sep: str):
    """Multi-line cells (call stacks) on one line: frames joined by `sep`."""
    return v.replace("\n", sep) if isinstance(v, str) else v


def to_csv(report: dict) -> str:
    """One section per table: a `# name` line, a header line, the rows; sections are
    separated by a blank line. Times are in seconds, percentages in percent."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for i, t in enumerate(_tables(report)):
        if i:
            buf.write("\n")
        buf.write(f"# {t.name}\n")
        w.writerow([k for _h, _u, k in t.columns])
        for r in t.rows:
            keys = [(t.csv_keys or {}).get(k, k) for _h, _u, k in t.columns]
            w.writerow([_one_line(_raw(r.get(k)), t.sep) for k in keys])
    return buf.getvalue()


def to_md(report: dict) -> str:
    out = ["# locus report", ""]
    out += ["```", *_summary(report), "```", ""]
    for t in _tables(report):
        if t.name in PICTURED:
            continue
        out += [f"## {t.heading}", ""]
        if not t.rows:
            out += ["none", ""]
            continue
        out.append("| " + " | ".join(h for h, _u, _k in t.columns) + " |")
        out.append("|" + "|".join("---:" if u else "---" for _h, u, _k in t.columns) + "|")
        for r in t.rows:
            cells = [
                _one_line(
                    str(fmt(r.get((t.text_keys or {}).get(k, k)), u)).replace("|", "\\|"), "<br>"
                )
                for _h, u, k in t.columns
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    for pic in _pictures(report):
        # A picture that is only its title ("...: none") has no block to show.
        out += [f"## {pic[0]}", ""] + (["```", *pic[1:], "```", ""] if pic[1:] else [])
    notes = _notes(report)
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def render(report: dict, format: str) -> str:
    return {"text": to_text, "json": to_json, "csv": to_csv, "md": to_md}[format](report)
