"""`locus doctor --check`: the comm lens measured on this machine against the bundled
workloads' known truth, for each sampling backend the machine has (hw, soft), and the exact
backend where the workloads' `locus cc` build exists.

The development machines have no PMU, so the hw backend (PEBS, IBS) was never run there;
this is how a machine that has one finds out whether it answers right: two threads add to
adjacent counters (false sharing) or to one counter (true sharing) in a configured share of
the time (workloads/comm_falseshare --free), and four threads talk in fixed pairs
(workloads/comm_p2p --free). The measured false-sharing share must be within
FALSE_POINTS points of the configured one (the issue's figure), and the communication
outside the pairs at most P2P_OUTSIDE of the total.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads" / "build"
FALSE_POINTS = 5.0  # points of false/total allowed off the configured fraction
P2P_OUTSIDE = 0.05  # share of the volume allowed outside the configured pairs
FRACTIONS = (0.25, 0.75)
TIMEOUT_S = 120


def data_totals(comm: dict, truth: dict) -> dict:
    """all/true/false volume and detections of the cache lines inside the workload's data
    range (the `data` of its --truth line; every line if none), from `lines`, which lists
    every line."""
    lo, hi = truth.get("data", [0, 2**64])
    tot = {"all": 0.0, "true": 0.0, "false": 0.0, "detections": 0}
    for ln in comm["lines"]:
        if lo <= int(ln["address"], 16) < hi:
            for k in tot:
                tot[k] += ln[k]
    return tot


def record(backend: str, argv: list[str], out: str) -> tuple[dict, dict]:
    """(lenses.comm of the report, the workload's truth) of argv under --backend."""
    locus = [sys.executable, "-m", "locus"]
    # One thread per CPU: the free-running workloads measure what threads do at the same
    # time, and two on one CPU barely overlap (a loaded machine failed the checks).
    cmd = [*locus, "record", "-o", out, "--lens", "comm", "--backend", backend]
    cmd += ["--bind", "scatter", "--", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed")
    truth = next((json.loads(x) for x in p.stderr.splitlines() if x.startswith("{")), {})
    r = subprocess.run(
        [*locus, "report", out, "--lens", "comm", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed")
    return json.loads(r.stdout)["lenses"]["comm"], truth


def exe(backend: str, name: str) -> Path:
    """The bundled workload `name` for `backend`: the exact backend records only the build
    instrumented by `locus cc` (workloads/build/exact)."""
    return WORKLOADS / "exact" / name if backend == "exact" else WORKLOADS / name


def _falseshare(backend: str, frac: float, out: str) -> dict:
    argv = [str(exe(backend, "comm_falseshare")), "2", "-", str(frac), "--free", "--truth"]
    comm, truth = record(backend, argv, out)
    d = data_totals(comm, truth)
    got = d["false"] / d["all"] if d["all"] else None
    ok = got is not None and abs(got - frac) * 100 <= FALSE_POINTS
    return {
        "backend": backend,
        "check": f"false sharing {frac:.2f}",
        "expected": frac,
        "measured": got,
        "ok": ok,
        "detail": "false/total on the data lines from "
        + (f"{int(d['all'])} transfers" if backend == "exact" else f"{d['detections']} detections")
        + (f", within {FALSE_POINTS:g} points" if ok else f", not within {FALSE_POINTS:g} points"),
    }


def _p2p(backend: str, out: str) -> dict:
    argv = [str(exe(backend, "comm_p2p")), "4", "-", "--free", "--truth"]
    comm, truth = record(backend, argv, out)
    idx = {t["tid"]: t["index"] for t in comm["threads"]}
    tids = truth.get("tids", [])
    m = comm["matrices"]["thread"]["all"]
    pairs = {frozenset((tids[i], tids[i ^ 1])) for i in range(len(tids))}
    inside = outside = 0.0
    for a in tids:
        for b in tids:
            if a < b and a in idx and b in idx:
                v = m[idx[a]][idx[b]]
                if frozenset((a, b)) in pairs:
                    inside += v
                else:
                    outside += v
    total = inside + outside
    got = outside / total if total else None
    return {
        "backend": backend,
        "check": "point-to-point pairs",
        "expected": 0.0,
        "measured": got,
        "ok": got is not None and got <= P2P_OUTSIDE,
        "detail": f"share of the volume outside the pairs 0-1, 2-3, at most {P2P_OUTSIDE:.0%}",
    }


def _busy() -> str:
    """What to say when other work kept the machine busy, else ""."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cpus = os.cpu_count() or 1
    if load < 0.75 * cpus:
        return ""
    return (
        f"the machine is busy (load average {load:.1f} on {cpus} CPUs): the check's threads "
        "must run at the same time, so run it again when the machine is idle"
    )


def run(backends: list[str]) -> list[dict]:
    """One row per check and backend: {backend, check, expected, measured, ok, detail}."""
    rows: list[dict] = []
    if not backends:
        return [
            {
                "backend": "-",
                "check": "backends",
                "expected": None,
                "measured": None,
                "ok": False,
                "detail": "no comm sampling backend on this machine (see the lenses table)",
            }
        ]
    missing = [
        str(exe(b, n).relative_to(WORKLOADS))
        for b in backends
        for n in ("comm_falseshare", "comm_p2p")
        if not exe(b, n).exists()
    ]
    if missing:
        return [
            {
                "backend": b,
                "check": "workloads",
                "expected": None,
                "measured": None,
                "ok": False,
                "detail": f"not built: {', '.join(missing)} (run `make -C workloads` in the "
                "locus checkout)",
            }
            for b in backends
        ]
    with tempfile.TemporaryDirectory(prefix="locus-check-") as tmp:
        for b in backends:
            for k, frac in enumerate([*FRACTIONS, None]):
                out = os.path.join(tmp, f"{b}-{k}")
                try:
                    row = _p2p(b, out) if frac is None else _falseshare(b, frac, out)
                    if not row["ok"]:
                        # Once more: the free-running workloads measure what the threads do
                        # at the same time, which other work on the machine disturbs.
                        first = row["measured"]
                        row = (
                            _p2p(b, out + "b") if frac is None else _falseshare(b, frac, out + "b")
                        )
                        row["detail"] += (
                            f" (second try; the first measured "
                            f"{'n/a' if first is None else f'{first:.3f}'})"
                        )
                        busy = _busy()
                        if not row["ok"] and busy:
                            row["detail"] += f"; {busy}"
                    rows.append(row)
                except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as e:
                    rows.append(
                        {
                            "backend": b,
                            "check": f"run {k + 1}",
                            "expected": None,
                            "measured": None,
                            "ok": False,
                            "detail": f"could not record: {e}",
                        }
                    )
    return rows
