#!/usr/bin/env python3
"""Accuracy of the locks lens against a schedule with a known truth (workloads/schedule).

Records `schedule --truth` N times (default: sampled mode and --time-all, 5 runs each) and
prints, per thread, the error of locus's wait and hold against the designed truth, the
schedule's own measured noise (what the program timed itself), and whether the critical path
(events, critical wait, critical hold) matches. Writes bench/results/accuracy.json.

Usage: bench/accuracy.py [-n 5] [--mode sampled|time-all|both]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SCHEDULE = common.REPO / "workloads" / "build" / "schedule"


def parse_truth(stderr: str) -> dict:
    for line in reversed(stderr.splitlines()):
        if line.startswith("{") and '"workload"' in line:
            return json.loads(line)
    raise SystemExit(f"schedule printed no truth:\n{stderr}")


def one_run(mode: str) -> dict:
    run_dir = common.CACHE / "accuracy-run"
    shutil.rmtree(run_dir, ignore_errors=True)
    opts = ["--time-all"] if mode == "time-all" else []
    rec = subprocess.run(
        [*common.locus_argv(), "record", "-o", str(run_dir), *opts, "--", str(SCHEDULE), "--truth"],
        capture_output=True,
        text=True,
        env=common.locus_env(),
    )
    if rec.returncode != 0:
        raise SystemExit(f"locus record failed ({rec.returncode}):\n{rec.stderr}")
    truth = parse_truth(rec.stderr)
    rep = subprocess.run(
        [*common.locus_argv(), "report", str(run_dir), "--format", "json"],
        capture_output=True,
        text=True,
        env=common.locus_env(),
    )
    if rep.returncode != 0:
        raise SystemExit(f"locus report failed ({rep.returncode}):\n{rep.stderr}")
    locks = json.loads(rep.stdout)["lenses"]["locks"]
    by_tid = {t["tid"]: t for t in locks["threads"]}
    threads = []
    for t in truth["threads"]:
        row = by_tid.get(t["tid"], {})
        out = {"name": t["name"], "acquisitions_ok": row.get("acquisitions") == t["acquisitions"]}
        for key in ("wait", "hold"):
            designed = t[f"{key}_ms"] / 1e3
            got = row.get(f"{key}_s")
            out[f"{key}_truth_s"] = designed
            out[f"{key}_locus_s"] = got
            out[f"{key}_self_s"] = t[f"measured_{key}_ms"] / 1e3
            out[f"{key}_err_s"] = None if got is None else got - designed
        threads.append(out)
    cp, tcp = locks["summary"]["critical_path"], truth["critical_path"]
    return {
        "max_deviation_ms": truth["max_deviation_ms"],
        "threads": threads,
        "critical_path": {
            "events": cp["events"],
            "events_truth": tcp["events"],
            "wait_s": cp["wait_s"],
            "wait_truth_s": tcp["wait_ms"] / 1e3,
            "hold_s": cp["hold_s"],
            "hold_truth_s": tcp["hold_ms"] / 1e3,
            "match": cp["events"] == tcp["events"]
            and abs(cp["wait_s"] - tcp["wait_ms"] / 1e3) <= max(0.05 * tcp["wait_ms"] / 1e3, 0.002)
            and abs(cp["hold_s"] - tcp["hold_ms"] / 1e3) <= 0.05 * tcp["hold_ms"] / 1e3,
        },
    }


def rel(err: float | None, truth: float) -> str:
    if err is None:
        return "missing"
    if truth == 0:
        return f"{err * 1e3:+.2f}ms"
    return f"{100 * err / truth:+.2f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="runs per mode (default 5)")
    ap.add_argument("--mode", choices=("sampled", "time-all", "both"), default="both")
    args = ap.parse_args()
    if not SCHEDULE.exists():
        raise SystemExit("workloads/build/schedule is missing: run `make build`")
    common.CACHE.mkdir(parents=True, exist_ok=True)
    modes = ["sampled", "time-all"] if args.mode == "both" else [args.mode]
    results: dict[str, list] = {}
    rows = []
    for mode in modes:
        results[mode] = []
        for i in range(args.n):
            r = one_run(mode)
            results[mode].append(r)
            for t in r["threads"]:
                rows.append(
                    [
                        f"{mode} #{i + 1} {t['name']}",
                        "ok" if t["acquisitions_ok"] else "WRONG",
                        rel(t["wait_err_s"], t["wait_truth_s"]),
                        rel(t["hold_err_s"], t["hold_truth_s"]),
                        rel(t["wait_self_s"] - t["wait_truth_s"], t["wait_truth_s"]),
                        rel(t["hold_self_s"] - t["hold_truth_s"], t["hold_truth_s"]),
                    ]
                )
            cp = r["critical_path"]
            rows.append(
                [
                    f"{mode} #{i + 1} critical path (noise {r['max_deviation_ms']:.2f}ms)",
                    f"{cp['events']}/{cp['events_truth']} ev",
                    rel(cp["wait_s"] - cp["wait_truth_s"], cp["wait_truth_s"]),
                    rel(cp["hold_s"] - cp["hold_truth_s"], cp["hold_truth_s"]),
                    "match" if cp["match"] else "MISMATCH",
                    "",
                ]
            )
    headers = ["run / thread", "acq", "wait err", "hold err", "noise wait", "noise hold"]
    print(common.table(headers, rows))
    summary = {}
    for mode, runs in results.items():
        errs = [
            abs(t[f"{k}_err_s"]) / t[f"{k}_truth_s"]
            for r in runs
            for t in r["threads"]
            for k in ("wait", "hold")
            if t[f"{k}_err_s"] is not None and t[f"{k}_truth_s"] > 0
        ]
        summary[mode] = {
            "max_rel_err": max(errs) if errs else None,
            "critical_path_match": sum(r["critical_path"]["match"] for r in runs),
            "runs": len(runs),
        }
    print()
    for mode, s in summary.items():
        worst = "n/a" if s["max_rel_err"] is None else f"{100 * s['max_rel_err']:.2f}%"
        print(
            f"{mode}: worst per-thread error {worst}, "
            f"critical path matched {s['critical_path_match']}/{s['runs']}"
        )
    data = {**common.stamp(), "n": args.n, "summary": summary, "runs": results}
    path = common.write_result("accuracy.json", data)
    parts = []
    for mode, s in summary.items():
        worst = "n/a" if s["max_rel_err"] is None else f"{100 * s['max_rel_err']:.2f}%"
        parts.append(f"{mode} worst {worst} cp {s['critical_path_match']}/{s['runs']}")
    common.append_history(
        f"- {data['date']} `{data['git_rev']}` accuracy (n={args.n}): " + ", ".join(parts)
    )
    print(f"\nwritten {path.relative_to(common.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
