"""`locus compare RUN RUN...`: summary metrics of each lens side by side, with the change
against the first run, and `--fail-if` thresholds for CI.

A threshold is `LENS.METRIC OP VALUE`: OP is one of > < >= <=; VALUE is a number (absolute:
checked on every run after the first) or a signed percentage like +10% / -5% (relative
change against the first run). Nested metrics use dots: `locks.critical_path.wait_s`.
"""

from __future__ import annotations

import csv
import io
import math
import re
import sys

from locus.errors import LocusError
from locus.render.formats import json_text
from locus.report import build
from locus.rundir import RunDir

_EXPR = re.compile(
    r"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|>|<)\s*([+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(%?)\s*$"
)


def flatten(d: dict, prefix: str = "") -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) or v is None:
            out[f"{prefix}{k}"] = v
    return out


def change_pct(base: float | None, v: float | None) -> float | None:
    """The change in percent against the first run; +-inf from 0 to a value (false sharing
    where there was none: a gate on +20 % must trip, and it passed)."""
    if base is None or v is None:
        return None
    if base == 0:
        return 0.0 if v == 0 else math.copysign(math.inf, v)
    return 100.0 * (v - base) / abs(base)


def _json_pct(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def parse_threshold(expr: str):
    m = _EXPR.match(expr)
    if not m:
        raise LocusError(
            f"bad --fail-if expression '{expr}' (expected e.g. locks.wait_s>+10% or "
            "locks.contended>1000)",
            2,
        )
    metric, op, value, pct = m.groups()
    return metric, op, float(value), bool(pct)


def _trips(op: str, x: float, limit: float) -> bool:
    return {">": x > limit, "<": x < limit, ">=": x >= limit, "<=": x <= limit}[op]


def lens_summary(lens: str, res: dict) -> dict:
    """The numbers of a lens that compare across runs: its `summary`, or for the comm and
    numa lenses their totals and sampling counters (comm.totals.false, numa.totals.remote,
    comm.samples, ...)."""
    if "summary" in res:
        return res["summary"]
    if lens in ("comm", "numa"):
        keep = ("samples", "skipped", "overhead_s")
        totals = {k: v for k, v in res.get("totals", {}).items() if not isinstance(v, str)}
        return {"totals": totals, **{k: res.get(k) for k in keep}}
    return {}


def metrics(report: dict) -> dict[str, float | None]:
    out = {}
    for lens, res in report["lenses"].items():
        out.update(flatten(lens_summary(lens, res), f"{lens}."))
    out["run.duration_s"] = report["run"]["duration_s"]
    out["overhead.runtime_s"] = report["overhead"]["runtime_s"]
    return out


def cmd_compare(ns) -> int:
    runs = [RunDir.open(p) for p in ns.runs]
    fmt = getattr(ns, "format", None) or "text"
    fmt_json = fmt == "json"
    thresholds = [parse_threshold(e) for e in (getattr(ns, "fail_if", None) or [])]
    common = [lens for lens in runs[0].lenses if all(lens in r.lenses for r in runs[1:])]
    reports = [build(r, common) for r in runs]
    table = [metrics(rep) for rep in reports]
    names = list(table[0])
    for t in table[1:]:
        names += [k for k in t if k not in names]
    for metric, *_ in thresholds:
        if metric not in names:
            raise LocusError(
                f"unknown metric '{metric}' in --fail-if (known: {', '.join(names)})", 2
            )

    # Soft volumes are CPU seconds, exact and count-based hw ones cache lines: no change
    # between them means anything (it printed +837266567 %).
    units = {rep["lenses"]["comm"].get("unit") for rep in reports if "comm" in rep["lenses"]}
    apart = len(units) > 1
    if apart:
        which = ", ".join(sorted(map(str, units)))
        print(
            f"locus: note: the runs' comm volumes are in different units ({which}: soft "
            "counts CPU time, exact and hw cache lines): their changes are not computed",
            file=sys.stderr,
        )

    # An exact run's detections are aggregates (per line, thread pair, word, flush window):
    # their count says nothing of the communication.
    exact = any(rep["lenses"].get("comm", {}).get("backend") == "exact" for rep in reports)

    def unitless(k: str) -> bool:
        if exact and k == "comm.totals.detections":
            return True
        # soft's samples are sampled accesses, exact's every access
        if apart and k in ("comm.samples", "comm.skipped"):
            return True
        return apart and k.startswith("comm.totals.") and k != "comm.totals.detections"

    # Each run's unit of its comm volumes (lines, s or samples): printed beside the numbers,
    # which were bare ("2.24e+06 0.85" for exact lines against soft seconds).
    comm_units = [rep["lenses"].get("comm", {}).get("unit") for rep in reports]
    rows = []
    for k in names:
        base = table[0].get(k)
        rows.append(
            {
                "metric": k,
                "values": [t.get(k) for t in table],
                "units": [metric_unit(k, u) for u in comm_units],
                "change_pct": [None]
                + [None if unitless(k) else change_pct(base, t.get(k)) for t in table[1:]],
            }
        )
    failures = []
    for metric, op, limit, pct in thresholds:
        if pct and unitless(metric) and metric == "comm.totals.detections":
            raise LocusError(
                "--fail-if comm.totals.detections: an exact run's detections are its "
                "aggregates, not transfers: gate comm.totals.all (or .false) instead",
                2,
            )
        if pct and unitless(metric):
            raise LocusError(
                f"--fail-if {metric}: the runs' comm volumes are in different units (soft and "
                "exact/hw backends): record both with the same backend",
                2,
            )
        base = table[0].get(metric)
        for i, t in enumerate(table[1:], start=1):
            v = t.get(metric)
            if v is None or (pct and base is None):
                # A gate that cannot be checked is not a pass.
                failures.append(f"{ns.runs[i]}: {metric} is missing (n/a), the gate cannot pass")
                continue
            x = change_pct(base, v) if pct else v
            if x is not None and _trips(op, x, limit):
                shown = (
                    (f"{x:+.1f}%" if not math.isinf(x) else f"{v:g} from 0") if pct else f"{x:g}"
                )
                failures.append(
                    f"{ns.runs[i]}: {metric} = {shown} ({op}{limit:g}{'%' if pct else ''})"
                )
    for r in rows:
        r["change_pct"] = [_json_pct(x) if fmt_json else x for x in r["change_pct"]]

    sys.stdout.write(_render(fmt, ns.runs, rows, failures))
    for f in failures:
        print(f"locus: threshold tripped: {f}", file=sys.stderr)
    return 1 if failures else 0


# The comm lens's volumes: in its `unit` (docs/lenses/comm.md), which differs between backends.
COMM_VOLUMES = ("comm.totals.all", "comm.totals.true", "comm.totals.false")


def metric_unit(metric: str, comm_unit: str | None) -> str | None:
    """The unit of a metric's value in a run whose comm volumes are in `comm_unit`: that
    unit for a comm volume (`lines`, `s`, `samples`), `s` for a time (`*_s`), `B` for
    `comm.totals.bytes`, else None (a count, a ratio)."""
    if metric in COMM_VOLUMES:
        return comm_unit
    if metric == "comm.totals.bytes":
        return "B"
    if metric.endswith("_s"):
        return "s"
    return None


def _cell(metric: str, v, unit: str | None = None) -> str:
    from locus.render.units import count, nbytes, seconds

    if v is None:
        return "n/a"
    if metric in COMM_VOLUMES:
        from locus.render.comm import volume

        # volume() gives "850 ms" (s), "2.2 M lines", "N samples"; an unknown unit is
        # named after the number.
        if unit in ("s", "lines", "samples"):
            return volume(v, unit)
        return f"{v:.3g}" + (f" {unit}" if unit else "")
    if unit == "B":
        return nbytes(v)
    if metric.endswith("_s"):
        return seconds(v)
    if isinstance(v, int):
        return count(v)
    return f"{v:.3g}"


def _render(fmt: str, runs: list[str], rows: list[dict], failures: list[str]) -> str:
    if fmt == "json":
        return json_text({"runs": runs, "metrics": rows, "failures": failures}, indent=1) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        head = ["metric"] + [f"run{i}" for i in range(len(runs))]
        head += [f"run{i}_change_pct" for i in range(1, len(runs))]
        w.writerow(head)
        for r in rows:
            w.writerow(
                [r["metric"]]
                + ["" if v is None else v for v in r["values"]]
                + ["" if c is None else f"{c:.2f}" for c in r["change_pct"][1:]]
            )
        return buf.getvalue()
    head = ["metric"] + [f"run {i}" for i in range(len(runs))]
    lines = [f"run {i}: {p}" for i, p in enumerate(runs)]
    body = []
    for r in rows:
        cells = [r["metric"]]
        units = r.get("units") or [None] * len(r["values"])
        for i, v in enumerate(r["values"]):
            c = _cell(r["metric"], v, units[i])
            x = r["change_pct"][i] if i else None
            if x is not None:
                c += " (from 0)" if math.isinf(x) else f" ({x:+.0f}%)"
            cells.append(c)
        body.append(cells)
    if fmt == "md":
        out = lines + ["", "| " + " | ".join(head) + " |", "|---" + "|---:" * len(runs) + "|"]
        out += ["| " + " | ".join(c) + " |" for c in body]
        return "\n".join(out) + "\n"
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    out = lines + [""]
    for cells in [head, *body]:
        out.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
            )
        )
    return "\n".join(out) + "\n"
