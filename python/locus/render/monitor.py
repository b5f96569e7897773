"""Tables of the monitor lens: one row per recorded event, then the labels."""

from __future__ import annotations

from locus.render.tables import Table


def monitor_tables(report: dict) -> list[Table]:
    m = report["lenses"]["monitor"]
    events = Table(
        "monitor_events",
        "System counters over the run (counters: rates; total = rate x time)",
        [
            ("event", "", "id"),
            ("unit", "", "unit"),
            ("mean", "num", "mean"),
            ("min", "num", "min"),
            ("max", "num", "max"),
            ("total", "num", "total"),
        ],
        m["events"],
    )
    labels = Table(
        "monitor_labels", "Labels", [("at", "s", "t_s"), ("label", "", "label")], m["labels"]
    )
    return [events, labels]


def summary_lines(report: dict) -> list[str]:
    m = report["lenses"]["monitor"]
    return [
        f"monitor   {m['samples']} samples every {m['interval_ms']} ms, "
        f"{len(m['events'])} events, {len(m['labels'])} labels ({m['file']})"
    ]
