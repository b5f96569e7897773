#!/usr/bin/env python3
"""The comm lens against its ground truth, and its cost.

Accuracy: each ComDetective microbenchmark (workloads/comm_*) runs free-running (`--free`:
no turns, threads hammer their data for ~1 s with the configured fractions), twice: built
with `locus cc` under the `exact` backend (every cache-line transfer counted: the oracle)
and plain under the `soft` backend. Compared on the data lines only (the `data` range of
the workload's --truth):
- false/total (comm_falseshare, fractions 0.1 ... 0.9): soft vs the configured fraction
  and vs exact;
- point-to-point (comm_p2p, 4 threads): largest cell outside the pairs / largest cell, and
  the share of the total outside the pairs;
- the write-volume trend (comm_writevol, sharing fraction 0.1/0.5/0.9, 2 and 4 threads):
  does each backend's volume rise with the fraction and the thread count. As in the paper's
  listing, every thread does a fixed amount of work (WRITEVOL_ITERATIONS), so 4 threads do
  twice the work of 2: with a ~1 s time limit instead, the volume is bounded by what two
  cores can move in a second and cannot grow with threads on a 2-core machine;
- total: soft's volume is CPU time (one detection per period of a thread's CPU time spent
  in an access to a line another thread wrote), exact's a number of transfers. A timer
  sample picks an access with probability proportional to its duration, so samples give
  shares of time, never access counts: no honest conversion of soft's seconds into
  transfers exists without an access count (a PMU). The total is therefore compared in
  normalised form: each run's volume relative to the same backend's volume on a reference
  run (2 threads, fraction 0.5), soft vs exact (within 15 %?), and the communication
  density of both (soft: detections per sampled access; exact: transfers per access),
  given for information: their ratio is the time weighting of communicating accesses.
  These runs last ~1 s of wall time each (not a fixed amount of work), so that the plain
  and the instrumented binary share in the same 10 ms slots of the clock: the fraction of
  the run spent sharing is the same for both. With a fixed amount of work it is not: the
  instrumented binary's private iterations are slowed far more than its contended shared
  ones, so at 2 threads and fraction 0.9 it spent 6.5x the reference's time sharing against
  the plain binary's 7.6x, and no estimator could agree with both (`total_fixed_work`,
  kept for information). A timed run needs its threads running at once: one whose threads
  had under 90 % of their CPUs (`busy`: CPU seconds over wall seconds, over min(threads,
  CPUs)) is run again, up to 3 times, and every row keeps its runs' `busy`.
  The same timed comparison is made on comm_readwrite (1 reader at read fractions 0.1/0.5/0.9
  and 3 readers at 0.5, relative to 1 reader at 0.5: `total_readwrite`), and across
  comm_falseshare's fractions (relative to 0.5, `n` runs each: `total_falseshare`).
  comm_p2p has one configuration: its total has no reference to be relative to.
  A row is `oversubscribed` when the workload has more threads than the machine CPUs: its
  threads take turns, which time samples and transfers count differently (the report's
  note on runnable threads), so such a row says more about the host than about the method;
  the history line counts the rows within 15 % and says how many are oversubscribed.

Between processes (`between_processes`, also `--only procs`): comm_procs (2 processes
false-sharing a line of shared memory, inherited at the fork or a memfd each maps at its own
address), soft only, as the exact backend counts within a process: the false fraction
against the configured one, and the volume against comm_falseshare --free with 2 threads at
the same fraction (`volume_over_threads`: the method between processes runs on the board the
run's processes share, watchpoints included, as between threads).

Cost: wall time and peak RSS with `--lens comm` (soft, default period) against without, in
one run, interleaved, medians (the RSS also as KiB added, `maxrss_added_kb`: mostly a fixed
amount, which a 1.5 MB program reads as a large ratio): the four microbenchmarks
(free-running, a fixed amount of work: what their slowest thread did in ~1 s of a plain
calibration run; comm_p2p at least 15 rounds whatever -n: its 4 threads on 2 CPUs make its
run time vary by half), `sysbench mutex` (at least 15 rounds whatever -n: its run time is
bimodal; `rounds` in the JSON gives each row's; `plain_wall_range` the plain runs' fastest
and slowest, in the history line where they differ by over a quarter),
`stress-ng --memthrash` and `sysbench threads` (context switches); and the exact backend's
slowdown (instrumented binary under locus vs plain). Where the program prints its own run
time (the workloads, sysbench), `program_ratio` is the ratio of those: the slowdown of the
program itself, without locus's fixed start and stop (~45 ms a run here), which the wall
ratio of a 1 s program includes. Each round also runs the program with an empty shared
library preloaded (`LD_PRELOAD`, as the runtime is; no locus): `floor_maxrss_ratio` and
`floor_maxrss_added_kb` are the peak RSS that loading any library costs the program before
it runs a line of code (the loader's work and pages, the kernel's 64 KiB fault-around of
the code it touches), the floor under the `maxrss_ratio` of any preloaded tool.

Disk (`--only disk`, and in the full run): what `--keep-samples` thinning saves and what it
costs, scaled down: comm_falseshare (2 threads, fraction 0.5, every sample a detection or
nearly) free-running for ~8 s, recorded with `--keep-samples 0` (every record written) and
`--keep-samples 500` (a thread's ~8,000 samples then go 500 at full rate, 500 at 1 in 2, 500
at 1 in 4, ...: the default 65,536 reaches the same point after ~65 s, ~17 min, ... of a busy
thread). `bytes_ratio`: the samples and events files' records, thinned over whole;
`volume_per_sample_ratio`: the volume a sample finds (thinned run's over the whole run's:
1 when the weights are unbiased, within the runs' ~3 % error); `samples_estimate_ratio`:
the written samples' periods summed over the samples the runtime counted. Per run, `n`
pairs.

Usage: bench/comm.py [-n 3] [--only accuracy|overhead|exact|procs|disk]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from locus.selfcheck import data_totals as on_data  # noqa: E402

WL = common.REPO / "workloads" / "build"
TIME = "/usr/bin/time"


def record(argv: list[str], options: list[str], name: str) -> tuple[dict, dict, float]:
    """(report lenses.comm, truth or {}, wall seconds of the whole locus command). The CPU
    seconds the command used are left in truth["_cpu_s"] (when there is a truth)."""
    run = common.CACHE / f"comm-{name}"
    shutil.rmtree(run, ignore_errors=True)
    cmd = [*common.locus_argv(), "record", "-o", str(run), "--lens", "comm", *options, "--"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run([*cmd, *argv], capture_output=True, env=common.locus_env(), text=True)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode != 0:
        raise SystemExit(f"record failed ({p.returncode}): {' '.join(argv)}\n{p.stderr}")
    truth = {}
    for line in p.stderr.splitlines():
        if line.startswith("{"):
            truth = json.loads(line)
    if truth:
        truth["_cpu_s"] = cpu
    r = subprocess.run(
        [*common.locus_argv(), "report", str(run), "--lens", "comm", "--format", "json"],
        capture_output=True,
        env=common.locus_env(),
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"report failed: {r.stderr}")
    return json.loads(r.stdout)["lenses"]["comm"], truth, wall


def density(comm: dict, truth: dict) -> float | None:
    """Communication per access, the unit-free quantity both backends estimate: exact, the
    transfers on the data lines per access seen (its `samples` count every access); soft,
    the detections on the data lines per sampled access (a time-based sample picks an access
    with probability proportional to its CPU time, so this is the share of the CPU time in
    accesses that spends it in communicating ones)."""
    n = comm.get("samples") or 0
    d = on_data(comm, truth)
    if not n:
        return None
    return (d["all"] if comm.get("backend") == "exact" else d["detections"]) / n


# Fixed work per thread for the write-volume trend, as in ComDetective's listing: iterations
# each thread runs (the instrumented binary runs ~25x slower than the plain one; soft needs
# enough of the plain binary's CPU time for a few hundred samples per run).
WRITEVOL_ITERATIONS = {"exact": "4000000", "soft": "200000000"}


def busy(truth: dict) -> float | None:
    """CPUs the run kept busy (CPU seconds of the locus command over the workload's wall
    time) against what its threads could (min(threads, CPUs)): ~1 for an undisturbed run."""
    secs, cpu = truth.get("seconds"), truth.get("_cpu_s")
    if not secs or cpu is None:
        return None
    return cpu / secs / min(int(truth.get("threads") or 1), os.cpu_count() or 1)


# A timed run whose threads had less than this share of their CPUs is run again (up to
# TIMED_TRIES times): transfers need two threads running at once, and another program on a
# 2-CPU host cut a timed run's transfers up to 30x (exact, 4 threads, fraction 0.5).
BUSY_MIN = 0.9
TIMED_TRIES = 3


def both(name: str, args: list[str], tag: str, rounds: dict | None = None) -> dict:
    """{backend: (comm, truth)}: the free-running workload under exact (instrumented binary)
    and soft (plain binary); args[1] (rounds) is replaced by rounds[backend] if given, else
    (timed runs) a run disturbed by other work on the host is run again (BUSY_MIN); truth
    gets `busy` and `tries`."""
    out = {}
    for backend in ("exact", "soft"):
        exe = WL / "exact" / name if backend == "exact" else WL / name
        a = [args[0], rounds[backend], *args[2:]] if rounds else args
        argv = [str(exe), *a, "--free", "--truth"]
        for tries in range(1, (1 if rounds else TIMED_TRIES) + 1):
            comm, truth, _ = record(argv, ["--backend", backend], tag + backend)
            b = busy(truth)
            truth.update(busy=b, tries=tries)
            if b is None or b >= BUSY_MIN:
                break
        out[backend] = (comm, truth)
    return out


def thread_matrix(comm: dict, truth: dict) -> list[list[float]]:
    """The thread matrix (all) in the workload's thread order (truth `tids`)."""
    idx = {t["tid"]: t["index"] for t in comm["threads"]}
    m = comm["matrices"]["thread"]["all"]
    tids = truth.get("tids", [])
    return [[m[idx[a]][idx[b]] if a in idx and b in idx else 0.0 for b in tids] for a in tids]


def within(x: float | None, ref: float | None, rel: float) -> bool | None:
    if x is None or not ref:
        return None
    return abs(x / ref - 1) <= rel


FALSESHARE_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)


def accuracy(n: int = 1) -> dict:
    """Soft against exact on the free-running workloads (see the module docstring); the
    write-volume rows run `n` times per backend (medians, and the spread: a free-running
    run's volume depends on how much its threads overlap, which varies from run to run)."""
    out: dict = {}
    rows = []
    for frac in FALSESHARE_FRACTIONS:
        res: dict = {"configured": frac}
        r = both("comm_falseshare", ["2", "-", str(frac)], f"fs{frac}")
        for backend, (comm, truth) in r.items():
            t = on_data(comm, truth)
            res[backend] = {
                "false_fraction": t["false"] / t["all"] if t["all"] else None,
                "all": t["all"],
                "detections": t["detections"],
                "samples": comm.get("samples"),
            }
        fs, fx = res["soft"]["false_fraction"], res["exact"]["false_fraction"]
        res["soft_minus_configured"] = fs - frac if fs is not None else None
        res["soft_minus_exact"] = fs - fx if fs is not None and fx is not None else None
        res["exact_minus_configured"] = fx - frac if fx is not None else None
        res["within_5_points"] = fs is not None and abs(fs - frac) <= 0.05
        print(f"  falseshare {frac}: soft {fs} exact {fx}", flush=True)
        rows.append(res)
    out["falseshare"] = rows

    p2p: dict = {}
    for backend, (comm, truth) in both("comm_p2p", ["4", "-"], "p2p").items():
        m = thread_matrix(comm, truth)
        cells_in, cells_out = [], []
        for i in range(len(m)):
            for j in range(i + 1, len(m)):
                (cells_in if (i, j) in ((0, 1), (2, 3)) else cells_out).append(m[i][j])
        big = max(cells_in + cells_out, default=0)
        total = sum(cells_in) + sum(cells_out)
        p2p[backend] = {
            "cells_in_pairs": cells_in,
            "cells_outside": cells_out,
            "outside_over_max": max(cells_out, default=0) / big if big else None,
            "outside_share": sum(cells_out) / total if total else None,
            "detections": on_data(comm, truth)["detections"],
        }
    p2p["within_5_percent"] = (p2p["soft"]["outside_over_max"] or 0) <= 0.05
    print(f"  p2p outside/max: soft {p2p['soft']['outside_over_max']}", flush=True)
    out["p2p"] = p2p

    trend = writevol_rows(n, WRITEVOL_ITERATIONS, "wv")
    timed_rows = writevol_rows(n, None, "wt")
    out["writevol"] = trend
    out["writevol_trend"] = trend_check(trend)
    out["writevol_timed"] = timed_rows
    out["total"] = totals(timed_rows)
    out["total_fixed_work"] = totals(trend)
    # The same comparison on the read-write benchmark (1 writer; `threads` is the number of
    # readers, the workload's first argument) and across the false-sharing fractions.
    rw = volume_rows("comm_readwrite", READWRITE_ROWS, n, None, "rw")
    out["readwrite_timed"] = rw
    out["total_readwrite"] = totals(rw, (1, 0.5))
    fs = volume_rows("comm_falseshare", [(2, f) for f in FALSESHARE_FRACTIONS], n, None, "fst")
    out["falseshare_timed"] = fs
    out["total_falseshare"] = totals(fs, (2, 0.5))
    out["between_processes"] = between_processes(n)
    return out


# Between processes (comm_procs, soft only: the exact backend counts within a process): the
# false fraction against the configured one, and the volume against the same sharing between
# threads (comm_falseshare --free, same fraction).
PROCS_FRACTIONS = (0.2, 0.5, 0.8)


def between_processes(n: int) -> list[dict]:
    rows = []
    soft = ["--backend", "soft"]
    for frac in PROCS_FRACTIONS:
        # The same sharing between threads, the reference of both kinds of mapping.
        fs = [str(WL / "comm_falseshare"), "2", "-", str(frac), "--free"]
        ref = [record(fs, soft, f"procs-threads{frac}{k}")[0]["totals"] for k in range(n)]
        for mode in ("anonymous", "file"):
            got = []
            for k in range(n):
                extra = ["--file"] if mode == "file" else []
                argv = [str(WL / "comm_procs"), "2", "-", str(frac), "16", *extra, "--truth"]
                comm = record(argv, soft, f"procs{frac}{mode}{k}")[0]
                got.append((comm["totals"], ref[k]))
            med = common.median
            row = {
                "configured": frac,
                "mode": mode,
                "false_fraction": med([t["false"] / t["all"] for t, _ in got if t["all"]]),
                "detections": med([t["detections_between_processes"] for t, _ in got]),
                "between_share": med(
                    [t["between_processes"] / t["all"] for t, _ in got if t["all"]]
                ),
                "volume_over_threads": med([t["all"] / th["all"] for t, th in got if th["all"]]),
            }
            row["within_5_points"] = abs(row["false_fraction"] - frac) <= 0.05
            print(f"  procs {mode} {frac}: {row}", flush=True)
            rows.append(row)
    return rows


# comm_readwrite's rows: (readers, read fraction); 3 readers and the writer are 4 threads on
# this host's 2 CPUs.
READWRITE_ROWS = [(1, 0.1), (1, 0.5), (1, 0.9), (3, 0.5)]


def writevol_rows(n: int, rounds: dict | None, tag: str) -> list[dict]:
    """comm_writevol at 2 and 4 threads and sharing fractions 0.1/0.5/0.9 under both
    backends, `n` runs each (medians, and every run's volume): a fixed amount of work per
    thread (`rounds`: iterations by backend), or with `rounds` None the workload's ~1 s of
    wall time, in which both binaries share in the same 10 ms slots of the clock."""
    configs = [(t, f) for t in (2, 4) for f in (0.1, 0.5, 0.9)]
    return volume_rows("comm_writevol", configs, n, rounds, tag)


def volume_rows(
    name: str, configs: list[tuple[int, float]], n: int, rounds: dict | None, tag: str
) -> list[dict]:
    """`name` at each (threads, fraction) of `configs` under both backends, `n` runs each
    (medians, and every run's volume); `rounds` as in writevol_rows."""
    rows = []
    for threads_n, frac in configs:
        threads = str(threads_n)
        row: dict = {"threads": int(threads), "share_fraction": frac}
        runs: dict[str, list[dict]] = {"exact": [], "soft": []}
        for _ in range(max(n, 1)):
            r = both(name, [threads, "-", str(frac)], f"{tag}{threads}-{frac}", rounds)
            for backend, (comm, truth) in r.items():
                d = on_data(comm, truth)
                runs[backend].append(
                    {
                        "all": d["all"],
                        "detections": d["detections"],
                        "samples": comm.get("samples"),
                        "density": density(comm, truth),
                        "busy": truth.get("busy"),
                        "tries": truth.get("tries"),
                    }
                )
        for backend, rs in runs.items():
            mid = sorted(rs, key=lambda x: x["all"])[(len(rs) - 1) // 2]  # the median run
            row[backend] = dict(mid, runs=[x["all"] for x in rs], busy=[x["busy"] for x in rs])
        # More threads than CPUs: they take turns, which time samples and transfers count
        # differently (the report's note on runnable threads), whatever the method.
        row["oversubscribed"] = int(truth.get("threads") or threads_n) > (os.cpu_count() or 1)
        rows.append(row)
        print(
            f"  {name[5:]} {threads} {frac} ({'fixed work' if rounds else '1 s'}): "
            f"soft {row['soft']['all']:.4g} s ({row['soft']['detections']} det) "
            f"exact {row['exact']['all']:.4g}",
            flush=True,
        )
    return rows


def rises(xs: list[float]) -> bool:
    return all(b > a for a, b in zip(xs, xs[1:]))


def trend_check(trend: list[dict]) -> dict:
    """Does each backend's volume rise with the sharing fraction (per thread count) and with
    the thread count (per fraction)?"""
    res = {}
    for backend in ("exact", "soft"):
        v = {(r["threads"], r["share_fraction"]): r[backend]["all"] for r in trend}
        fr = sorted({f for _, f in v})
        th = sorted({t for t, _ in v})
        res[backend] = {
            "rises_with_fraction": all(rises([v[(t, f)] for f in fr]) for t in th),
            "rises_with_threads": all(rises([v[(t, f)] for t in th]) for f in fr),
        }
    return res


def totals(trend: list[dict], reference: tuple[int, float] = (2, 0.5)) -> dict:
    """The total, compared where the units allow (see the module docstring): for each run,
    soft's and exact's volume relative to the same backend's volume on a reference run
    (threads, fraction), and the communication density (per access) of both."""
    ref = next(r for r in trend if (r["threads"], r["share_fraction"]) == reference)
    rows = []
    for r in trend:
        rs = r["soft"]["all"] / ref["soft"]["all"] if ref["soft"]["all"] else None
        rx = r["exact"]["all"] / ref["exact"]["all"] if ref["exact"]["all"] else None
        ds, dx = r["soft"]["density"], r["exact"]["density"]
        rows.append(
            {
                "threads": r["threads"],
                "share_fraction": r["share_fraction"],
                "soft_relative": rs,
                "exact_relative": rx,
                "relative_within_15_percent": within(rs, rx, 0.15),
                "oversubscribed": r.get("oversubscribed"),
                "soft_density": ds,
                "exact_density": dx,
                "density_soft_over_exact": ds / dx if ds is not None and dx else None,
            }
        )
    return {"reference": {"threads": reference[0], "share_fraction": reference[1]}, "runs": rows}


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
    return wall, int(rss.read_text().split()[-1]), program_time(p.stdout + p.stderr)


# What the programs print of their own run time: the workloads' "... in 0.958 s", sysbench's
# "total time: 1.2345s". Their ratio leaves out locus's fixed start and stop (the launcher,
# the runtime's start, the records' end: ~45 ms a run on this host).
OWN_TIME = re.compile(rb" in ([0-9.]+) s$|total time:\s+([0-9.]+)s", re.M)


def empty_preload_rss(argv: list[str]) -> int:
    """Peak RSS (kB) of one run of argv with an empty shared library preloaded
    (`LD_PRELOAD`, as locus's runtime is): the floor of any preloaded tool's cost, the
    loader's work and its pages, before the tool runs any code."""
    lib = common.CACHE / "empty-preload.so"
    if not lib.exists():
        src = common.CACHE / "empty-preload.c"
        src.write_text("int locus_bench_empty_preload;\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    rss = common.CACHE / "comm-maxrss-floor.txt"
    env = {**os.environ, "LD_PRELOAD": str(lib)}
    subprocess.run([TIME, "-f", "%M", "-o", str(rss), *argv], capture_output=True, env=env)
    return int(rss.read_text().split()[-1])


def program_time(out: bytes) -> float | None:
    m = OWN_TIME.search(out)
    return float(m.group(1) or m.group(2)) if m else None


# The microbenchmarks' cost runs: (threads, arguments after the work limit). Each does a
# fixed amount of work (~1 s plain), free-running, so that its wall time grows with the
# slowdown: their default (~1 s of turns) stops at a deadline, and its wall ratio was
# locus's fixed start and stop cost, whatever the sampler cost meanwhile (and turn
# hand-offs vary 10x by where the scheduler puts the threads).
MICRO_OVERHEAD = {
    "comm_writevol": ("2", ["0.5"]),
    # No line shared: two CPU-bound threads on two CPUs, the sampler's own cost without
    # the contended runs' dependence on how the scheduler overlaps the threads.
    "comm_writevol private": ("2", ["0"]),
    "comm_falseshare": ("2", ["0.5"]),
    "comm_readwrite": ("1", ["0.5"]),
    "comm_p2p": ("4", []),
}


def fixed_work(name: str) -> list[str]:
    """argv of `name` free-running for a number of iterations per thread that takes ~1 s
    plain on this host: what its slowest thread did in ~1 s, scaled by one timed plain run
    of that (its threads' rates change when the others finish)."""
    threads, rest = MICRO_OVERHEAD[name]
    exe = str(WL / name.split()[0])
    p = subprocess.run(
        [exe, threads, "-", *rest, "--free", "--truth"], capture_output=True, text=True
    )
    truth = json.loads([x for x in p.stderr.splitlines() if x.startswith("{")][0])
    limit = max(1, min(truth["iterations"]))
    t0 = time.monotonic()
    subprocess.run([exe, threads, str(limit), *rest, "--free"], capture_output=True, check=True)
    wall = max(time.monotonic() - t0, 0.05)
    return [exe, threads, str(max(1, int(limit / wall))), *rest, "--free"]


def overhead(n: int) -> dict:
    progs = {
        **{name: fixed_work(name) for name in MICRO_OVERHEAD},
        "sysbench_mutex": "sysbench mutex --threads=4 --mutex-num=4 --mutex-locks=10000000 "
        "--mutex-loops=50 run".split(),
        "stress_memthrash": "stress-ng --memthrash 2 --timeout 3s --metrics-brief".split(),
        # sched_yield under mutexes: ~1 M context switches a second (the sampler's tick).
        "sysbench_threads": "sysbench threads --threads=4 --events=8000 --time=0 run".split(),
    }
    return common.overhead(
        progs,
        n,
        lambda argv, under: timed(argv, ["--backend", "soft"] if under else None),
        "soft",
        floor=empty_preload_rss,
        # sysbench mutex runs in one of two modes (1.1-1.4 s or 1.6-2.3 s here, plain or
        # not): a median of 5 read x1.11 and x1.21 for one runtime in two runs an hour apart,
        # where 30 rounds interleaved read x1.08 (its own time). comm_p2p's 4 threads on 2
        # CPUs run 0.56-0.89 s plain from run to run (which threads share a CPU decides how
        # often a pair's lines move): medians of 3 read x1.08 to x1.36 for one runtime.
        least={"sysbench_mutex": 15, "comm_p2p": 15},
    )


EXACT_BUILDS = (
    # (name, plain build, exact build): gcc with the hit test inlined into its assembly
    # (locus cc's default), gcc calling the hooks in liblocus.so (LOCUS_CC_INLINE=0), clang
    # with LOCUS_CC_LTO=1 inlining it at link time, and clang with locus cc's default (each
    # against its own compiler's plain build).
    ("gcc", "", "exact"),
    ("gcc-calls", "", "exact-calls"),
    ("clang-lto", "clang", "exact-lto"),
    # clang with locus cc's default (the hit test inlined into the assembly, as for gcc).
    ("clang", "clang", "exact-clang"),
)


def exact_overhead(n: int) -> dict:
    # Exact: the instrumented build under locus against the plain build, free-running for
    # the same time: the slowdown is the ratio of the work done (iterations, summed over
    # threads). Turn-taking runs would measure hand-off latency instead of access cost.
    ex = {}
    for name, args in (
        ("comm_writevol", ["2", "-", "0.5"]),
        ("comm_falseshare", ["2", "-", "0.5"]),
        ("comm_readwrite", ["1", "-", "0.5"]),
        ("comm_p2p", ["4", "-"]),
    ):
        for build, plain_dir, exact_dir in EXACT_BUILDS:
            if not (WL / exact_dir / name).exists():
                print(f"  exact {name} {build}: not built (needs clang), skipped", flush=True)
                continue
            rates = {}
            for backend in ("plain", "exact"):
                its = []
                for _ in range(n):
                    if backend == "plain":
                        exe = WL / plain_dir / name if plain_dir else WL / name
                        p = subprocess.run(
                            [str(exe), *args, "--free", "--truth"], capture_output=True, text=True
                        )
                        truth = json.loads(
                            [x for x in p.stderr.splitlines() if x.startswith("{")][0]
                        )
                    else:
                        _c, truth, _w = record(
                            [str(WL / exact_dir / name), *args, "--free", "--truth"],
                            ["--backend", "exact"],
                            f"{exact_dir}-{name}",
                        )
                    its.append(sum(truth["iterations"]) / truth["seconds"])
                rates[backend] = common.median(its)
            key = name if build == "gcc" else f"{name} {build}"
            ex[key] = {
                "build": build,
                "plain_iterations_per_s": rates["plain"],
                "exact_iterations_per_s": rates["exact"],
                "ratio": rates["plain"] / rates["exact"],
            }
            print(f"  exact {key}: x{ex[key]['ratio']:.2f}", flush=True)
    return ex


DISK_SECONDS = 8.0  # of free-running work per thread
DISK_KEEP = 500


def disk(n: int) -> dict:
    from locus.rundir import COMM_EVENT_DTYPE, COMM_SAMPLE_DTYPE, read_records

    calib = fixed_work("comm_falseshare")  # ~1 s of work per thread
    argv = [*calib[:2], str(int(int(calib[2]) * DISK_SECONDS)), *calib[3:]]
    rows = []
    for _ in range(n):
        got = {}
        for keep in (0, DISK_KEEP):
            name = f"disk-{keep}"
            opts = ["--backend", "soft", "--keep-samples", str(keep)]
            comm, _truth, _wall = record(argv, opts, name)
            run = common.CACHE / f"comm-{name}"
            size = periods = 0
            for pdir in (run / "procs").iterdir():
                s = read_records(pdir / "comm.samples.bin", COMM_SAMPLE_DTYPE)
                e = read_records(pdir / "comm.events.bin", COMM_EVENT_DTYPE)
                s, e = s[s["kind"] == 1], e[e["kind"] == 1]
                size += s.nbytes + e.nbytes
                periods += int(s["periods"].astype("int64").sum())
            got[keep] = (size, comm["totals"]["all"] / max(comm["samples"], 1),
                         periods / max(comm["samples"], 1), comm["samples"])  # fmt: skip
        rows.append(
            {
                "samples": got[0][3],
                "bytes_whole": got[0][0],
                "bytes_thinned": got[DISK_KEEP][0],
                "bytes_ratio": got[DISK_KEEP][0] / max(got[0][0], 1),
                "volume_per_sample_ratio": got[DISK_KEEP][1] / got[0][1] if got[0][1] else None,
                "samples_estimate_ratio": got[DISK_KEEP][2],
            }
        )
    keys = ("bytes_ratio", "volume_per_sample_ratio", "samples_estimate_ratio")
    return {
        "keep": DISK_KEEP,
        "seconds": DISK_SECONDS,
        "runs": rows,
        **{k: common.median([r[k] for r in rows]) for k in keys},
    }


def spread(row: dict) -> str:
    """The plain runs' wall time range (", plain 0.49-1.06 s") when it spans over a quarter."""
    lo, hi = row.get("plain_wall_range") or (0, 0)
    return f", plain {lo:.2f}-{hi:.2f} s" if lo > 0 and hi > 1.25 * lo else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--only", choices=("accuracy", "overhead", "exact", "procs", "disk"))
    args = ap.parse_args()
    common.CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["make", "-s", "-C", str(common.REPO / "workloads"), "exact", "exact-calls"], check=True
    )
    if shutil.which("clang"):
        subprocess.run(
            ["make", "-s", "-C", str(common.REPO / "workloads"), "exact-lto", "exact-clang"],
            check=True,
        )
    data = {**common.stamp(), "n": args.n}
    if args.only in (None, "accuracy"):
        print("accuracy", flush=True)
        data["accuracy"] = accuracy(args.n)
        print(json.dumps(data["accuracy"], indent=1), flush=True)
    if args.only == "procs":
        print("between processes", flush=True)
        data["between_processes"] = between_processes(args.n)
    if args.only in (None, "overhead"):
        print("overhead", flush=True)
        data["overhead"] = overhead(args.n)
    if args.only in (None, "exact"):
        print("exact", flush=True)
        data["exact"] = exact_overhead(args.n)
    if args.only in (None, "disk"):
        print("disk", flush=True)
        data["disk"] = disk(args.n)
        print(json.dumps(data["disk"], indent=1), flush=True)
    path = common.write_result(f"comm{'-' + args.only if args.only else ''}.json", data)
    parts = []
    if "overhead" in data:
        parts += [
            f"{k} x{v['wall_ratio']:.2f}"
            + (f" (own time x{v['program_ratio']:.2f})" if "program_ratio" in v else "")
            + f" rss x{v['maxrss_ratio']:.2f}"
            + (f" ({v['maxrss_added_kb']:+.0f} KiB)" if "maxrss_added_kb" in v else "")
            + (
                f" (empty preload x{v['floor_maxrss_ratio']:.2f})"
                if "floor_maxrss_ratio" in v
                else ""
            )
            + spread(v)
            for k, v in data["overhead"].items()
            if k != "exact"
        ]
    if "exact" in data:
        parts += [f"exact {k} x{v['ratio']:.1f}" for k, v in data["exact"].items()]
    if "disk" in data:
        d = data["disk"]
        parts.append(
            f"disk: --keep-samples {d['keep']} over {d['seconds']:.0f} s of 2 threads writes "
            f"x{d['bytes_ratio']:.2f} the bytes, volume per sample x"
            f"{d['volume_per_sample_ratio']:.2f} of the whole run's, samples estimated x"
            f"{d['samples_estimate_ratio']:.2f}"
        )
    if "accuracy" in data:
        parts.append("accuracy: see " + path.name)
        for key, name in (
            ("total", "writevol"),
            ("total_readwrite", "readwrite"),
            ("total_falseshare", "falseshare"),
        ):
            runs = data["accuracy"].get(key, {}).get("runs", [])
            ok = sum(1 for r in runs if r["relative_within_15_percent"])
            over = sum(1 for r in runs if r.get("oversubscribed"))
            parts.append(
                f"{name} totals {ok} of {len(runs)} within 15 %"
                + (f" ({over} with more threads than CPUs)" if over else "")
            )
    procs = data.get("between_processes") or data.get("accuracy", {}).get("between_processes")
    if procs:
        parts.append(
            "between processes false/total "
            + ", ".join(
                f"{r['mode'][:4]} {r['configured']}: {r['false_fraction']:.2f}"
                f" (x{r['volume_over_threads']:.2f} of threads)"
                for r in procs
            )
        )
    common.append_history(f"- {data['date']} `{data['git_rev']}` comm: " + ", ".join(parts))
    print(f"written {path.relative_to(common.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
