#!/usr/bin/env python3
"""The comm lens against its ground truth, and its cost.

Accuracy: each ComDetective microbenchmark (workloads/comm_*) runs twice, built with
`locus cc` under the `exact` backend (every cache-line transfer counted: the oracle, which
must equal the workload's constructed truth) and plain under the `soft` backend. Compared
on the data lines only (the `data` range of the workload's --truth; the turn counter the
threads spin on is hidden from `exact` but seen by `soft`):
- false/total: soft vs exact vs the configured fraction (comm_falseshare);
- point-to-point: largest cell outside the pairs / largest cell (comm_p2p);
- the write-volume trend: volume rises with the sharing fraction and the thread count;
- total: soft's volume is CPU time (one sample per period of a thread's CPU time), exact's
  a number of transfers. They share no unit, so the total is compared as the soft volume per
  exact transfer across the runs: a constant ratio means soft's totals are proportional.

Cost: wall time and peak RSS with `--lens comm` (soft, default period) against without, in
one run, interleaved, medians: the four microbenchmarks, `sysbench mutex` and `stress-ng
--memthrash`; and the exact backend's slowdown (instrumented binary under locus vs plain).

Usage: bench/comm.py [-n 3] [--only accuracy|overhead]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

WL = common.REPO / "workloads" / "build"
TIME = "/usr/bin/time"


def record(argv: list[str], options: list[str], name: str) -> tuple[dict, dict, float]:
    """(report lenses.comm, truth or {}, wall seconds of the whole locus command)."""
    run = common.CACHE / f"comm-{name}"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [*common.locus_argv(), "record", "-o", str(run), "--lens", "comm", *options, "--"]
    t0 = time.monotonic()
    p = subprocess.run([*cmd, *argv], capture_output=True, env=common.locus_env(), text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"record failed ({p.returncode}): {' '.join(argv)}\n{p.stderr}")
    truth = {}
    for line in p.stderr.splitlines():
        if line.startswith("{"):
            truth = json.loads(line)
    r = subprocess.run(
        [*common.locus_argv(), "report", str(run), "--lens", "comm", "--format", "json"],
        capture_output=True,
        env=common.locus_env(),
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"report failed: {r.stderr}")
    return json.loads(r.stdout)["lenses"]["comm"], truth, wall


def on_data(comm: dict, truth: dict) -> dict:
    """all/true/false volume of the cache lines inside the workload's data range, and the
    thread matrix restricted to them (from the lines table, which lists every line)."""
    lo, hi = truth.get("data", [0, 2**64])
    tot = {"all": 0.0, "true": 0.0, "false": 0.0}
    for ln in comm["lines"]:
        a = int(ln["address"], 16)
        if lo <= a < hi:
            for k in tot:
                tot[k] += ln[k]
    return tot


ROUNDS = {"comm_falseshare": 1_000_000, "comm_writevol": 1_000_000, "comm_p2p": 500_000}


def both(name: str, args: list[str], tag: str) -> dict:
    """{backend: (comm, truth)} for exact (instrumented binary) and soft (plain binary)."""
    out = {}
    for backend in ("exact", "soft"):
        exe = WL / "exact" / name if backend == "exact" else WL / name
        comm, truth, _ = record([str(exe), *args, "--truth"], ["--backend", backend], tag + backend)
        out[backend] = (comm, truth)
    return out


def accuracy() -> dict:
    out: dict = {}
    rows = []
    for frac in (0.25, 0.5, 0.75):
        res: dict = {"configured": frac}
        r = both("comm_falseshare", ["2", str(ROUNDS["comm_falseshare"]), str(frac)], f"fs{frac}")
        for backend, (comm, truth) in r.items():
            t = on_data(comm, truth)
            res[backend] = {
                "false_fraction": t["false"] / t["all"] if t["all"] else None,
                "all": t["all"],
                "truth_false_fraction": truth.get("expected", {}).get("false_fraction"),
            }
        rows.append(res)
    out["falseshare"] = rows
    p2p = {}
    for backend, (comm, truth) in both("comm_p2p", ["4", str(ROUNDS["comm_p2p"])], "p2p").items():
        idx = {t["tid"]: t["index"] for t in comm["threads"]}
        m = comm["matrices"]["thread"]["all"]
        wtid = truth.get("tids", [])
        cells_in, cells_out = [], []
        for i, ti in enumerate(wtid):
            for j, tj in enumerate(wtid):
                if j > i and ti in idx and tj in idx:
                    v = m[idx[ti]][idx[tj]]
                    (cells_in if (i, j) in ((0, 1), (2, 3)) else cells_out).append(v)
        big = max(cells_in + cells_out, default=0)
        p2p[backend] = {
            "max_in_pairs": max(cells_in, default=0),
            "max_outside": max(cells_out, default=0),
            "outside_over_max": max(cells_out, default=0) / big if big else None,
        }
    out["p2p"] = p2p
    trend = []
    for threads in ("2", "4"):
        for frac in (0.1, 0.5, 0.9):
            row: dict = {"threads": int(threads), "share_fraction": frac}
            r = both("comm_writevol", [threads, str(ROUNDS["comm_writevol"]), str(frac)], "wv")
            for backend, (comm, truth) in r.items():
                row[backend] = on_data(comm, truth)["all"]
                row["truth"] = truth.get("expected", {}).get("transfers")
            row["soft_per_exact"] = row["soft"] / row["exact"] if row["exact"] else None
            trend.append(row)
    out["writevol"] = trend
    return out


def timed(argv: list[str], options: list[str] | None) -> tuple[float, int]:
    rss = common.CACHE / "comm-maxrss.txt"
    inner = [TIME, "-f", "%M", "-o", str(rss), *argv]
    if options is not None:
        run = common.CACHE / "comm-overhead"
        shutil.rmtree(run, ignore_errors=True)
        inner = [*common.locus_argv(), "record", "-o", str(run), "--lens", "comm", *options, "--"]
        # The exact backend records only instrumented programs: no /usr/bin/time around it.
        inner += argv if "exact" in options else [TIME, "-f", "%M", "-o", str(rss), *argv]
    t0 = time.monotonic()
    p = subprocess.run(inner, capture_output=True, env=common.locus_env())
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(inner)}\n{p.stderr.decode(errors='replace')}")
    if options is not None and "exact" in options:
        return wall, 0
    return wall, int(rss.read_text().split()[-1])


def overhead(n: int) -> dict:
    progs = {
        "comm_writevol": [str(WL / "comm_writevol"), "2"],
        "comm_falseshare": [str(WL / "comm_falseshare"), "2"],
        "comm_readwrite": [str(WL / "comm_readwrite"), "1"],
        "comm_p2p": [str(WL / "comm_p2p"), "4"],
        "sysbench_mutex": "sysbench mutex --threads=4 --mutex-num=4 --mutex-locks=10000000 "
        "--mutex-loops=50 run".split(),
        "stress_memthrash": "stress-ng --memthrash 2 --timeout 3s --metrics-brief".split(),
    }
    out = {}
    for name, argv in progs.items():
        if not shutil.which(argv[0]):
            continue
        plain, soft = [], []
        for _ in range(n):
            plain.append(timed(argv, None))
            soft.append(timed(argv, ["--backend", "soft"]))
        pw, sw = common.median([w for w, _ in plain]), common.median([w for w, _ in soft])
        pr, sr = common.median([r for _, r in plain]), common.median([r for _, r in soft])
        out[name] = {
            "plain_wall_s": pw,
            "soft_wall_s": sw,
            "wall_ratio": sw / pw,
            "plain_maxrss_kb": pr,
            "soft_maxrss_kb": sr,
            "maxrss_ratio": sr / pr,
        }
        print(f"  {name}: time x{sw / pw:.3f} rss x{sr / pr:.3f}", flush=True)
    # Exact: instrumented under locus vs plain, fixed rounds so the work is the same.
    ex = {}
    for name, args in (
        ("comm_writevol", ["2", "2000"]),
        ("comm_falseshare", ["2", "4000"]),
        ("comm_readwrite", ["1", "3000"]),
        ("comm_p2p", ["4", "3000"]),
    ):
        pw = common.median([timed([str(WL / name), *args], None)[0] for _ in range(n)])
        xw = common.median(
            [timed([str(WL / "exact" / name), *args], ["--backend", "exact"])[0] for _ in range(n)]
        )
        ex[name] = {"plain_wall_s": pw, "exact_wall_s": xw, "ratio": xw / pw}
        print(f"  exact {name}: x{xw / pw:.2f}", flush=True)
    out["exact"] = ex
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--only", choices=("accuracy", "overhead"))
    args = ap.parse_args()
    common.CACHE.mkdir(parents=True, exist_ok=True)
    if not (WL / "exact" / "comm_p2p").exists():
        subprocess.run(["make", "-s", "-C", str(common.REPO / "workloads"), "exact"], check=True)
    data = {**common.stamp(), "n": args.n}
    if args.only in (None, "accuracy"):
        print("accuracy", flush=True)
        data["accuracy"] = accuracy()
        print(json.dumps(data["accuracy"], indent=1), flush=True)
    if args.only in (None, "overhead"):
        print("overhead", flush=True)
        data["overhead"] = overhead(args.n)
    path = common.write_result(f"comm{'-' + args.only if args.only else ''}.json", data)
    parts = []
    if "overhead" in data:
        parts += [
            f"{k} x{v['wall_ratio']:.2f}" for k, v in data["overhead"].items() if k != "exact"
        ]
    common.append_history(f"- {data['date']} `{data['git_rev']}` comm: " + ", ".join(parts))
    print(f"written {path.relative_to(common.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
