"""The monitor lens of a run: the system counters recorded beside the program
(RUN/monitor.jsonl, docs/monitor.md), summarised per event over the program's lifetime,
with the labels the program or a script set, on the run's time axis (seconds from the
start of the recording, which begins just before the program)."""

from __future__ import annotations

import os

from locus.errors import LocusError
from locus.monitor import recordfile


def analyze(run) -> dict:
    mo = run.meta.get("monitor") or {}
    path = os.path.join(run.path, mo.get("file") or "monitor.jsonl")
    if not os.path.exists(path):
        raise LocusError(f"{path}: missing (the monitor lens wrote nothing)")
    header, records = recordfile.load(path)
    start = float(header.get("start") or 0.0)
    events = header.get("events") or []
    # Per event: time-weighted mean (each value weighted by the time since the previous
    # value of the same event, so sensors read less often than every tick weigh right),
    # min, max, and for counters the total amount (rate x time).
    acc = {e["id"]: [0.0, 0.0, None, None, 0, None] for e in events}  # wsum, w, min, max, n, last_t
    labels = []
    samples = 0
    last_t = start
    for r in records:
        k = recordfile.kind(r)
        if k == "label":
            labels.append({"t_s": round(r["t"] - start, 6), "label": r["label"]})
            continue
        if k != "sample":
            continue
        samples += 1
        t = r["t"]
        for i, v in r["v"].items():
            a = acc.get(i)
            if a is None:
                continue
            w = t - (a[5] if a[5] is not None else t - r.get("dt", 0.0))
            a[0] += v * w
            a[1] += w
            a[2] = v if a[2] is None else min(a[2], v)
            a[3] = v if a[3] is None else max(a[3], v)
            a[4] += 1
            a[5] = t
        last_t = t
    rows = []
    for e in events:
        wsum, w, lo, hi, n, _ = acc[e["id"]]
        mean = wsum / w if w > 0 else None
        rows.append(
            {
                "id": e["id"],
                "unit": e["unit"],
                "kind": e["kind"],
                "samples": n,
                "mean": mean,
                "min": lo,
                "max": hi,
                "total": wsum if e["kind"] == "counter" and n else None,
            }
        )
    notes = []
    absent = mo.get("absent") or {}
    for name, why in absent.items():
        notes.append(f"monitor: sensor {name} absent: {why}")
    return {
        "file": path,
        "interval_ms": header.get("interval_ms"),
        "samples": samples,
        "duration_s": round(last_t - start, 6),
        "events": rows,
        "labels": labels,
        "notes": notes,
    }
