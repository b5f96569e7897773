#!/usr/bin/env python3
"""The monitor's own cost (docs/monitor.md, "Cost").

CPU use: `locus monitor record` of every present sensor's default events, at 10 Hz and at
1 kHz, run as a user runs it; after a warm-up, the CPU time of all its threads (the sum of
/proc/PID/task/*/schedstat, in ns) over a stretch of wall time: the share of one core it
keeps busy. For scale, the same at 1 kHz with the per-node NUMA counters alone (the fast
path), the floor of this machine: a Python thread that only wakes up 1000 times a
second with the engine's own wait (no sensor, no file), and a C loop that only sleeps and
reads the sensors' files at their rates (no parsing, no output): the least any sampler
written in any language costs here.

Per-sensor read cost: each sensor alone at 100 Hz in this process, CPU time of the sampling
thread per read (system calls + parsing, as the engine does it); and the system calls alone,
2000 back-to-back fetches with hot caches: what the kernel spends producing the files, a
cost no sampler avoids. Their sum over the sensors plus the wake-up floor is the least CPU
any 1 kHz sampler of every sensor can use on this machine.

Record overhead: wall time of a ~2 s CPU-bound program (stress-ng --cpu 1, a fixed number
of bogo ops) under `locus record --lens locks` and `--lens locks,monitor` (4n runs each,
interleaved, medians; the program's own duration from meta.json).

Targets (issue 5): <= 1 % of a core at 10 Hz, <= 5 % at 1 kHz, <= 1 % added wall time.
Usage: bench/monitor.py [-n 3] [--only cpu|sensors|record]
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

sys.path.insert(0, str(common.REPO / "python"))

WARMUP_S = 3.0
NUMASTAT_COUNTERS = "numastat:*:numa_*,numastat:*:*_node,numastat:*:interleave_hit"


def task_cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process, in ns (schedstat: exact, not tick-sampled)."""
    total = 0
    for f in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(f) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def record_cpu(interval: str, seconds: float, events: str | None = None) -> dict:
    out = common.CACHE / "monitor-cpu.jsonl"
    out.unlink(missing_ok=True)
    argv = [*common.locus_argv(), "monitor", "record", "-o", str(out), "--interval", interval]
    if events:
        argv += ["--events", events]
    p = subprocess.Popen(argv, env=common.locus_env(), stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(WARMUP_S)
        lines0 = out.read_text().count('"v"')
        c0, t0 = task_cpu_ns(p.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = task_cpu_ns(p.pid), time.monotonic()
        lines1 = out.read_text().count('"v"')
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    if p.returncode != 0:
        raise SystemExit(f"monitor record failed ({p.returncode}):\n{err}")
    return {
        "cpu_pct": 100.0 * (c1 - c0) / 1e9 / (t1 - t0),
        "samples_per_s": (lines1 - lines0) / (t1 - t0),
    }


def process_cpu_pct(argv: list[str], seconds: float) -> float:
    """CPU % of one core a program uses over `seconds`, after a 1 s warm-up; then killed."""
    p = subprocess.Popen(argv)
    try:
        time.sleep(1.0)
        c0, t0 = task_cpu_ns(p.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = task_cpu_ns(p.pid), time.monotonic()
    finally:
        p.kill()
        p.wait()
    return 100.0 * (c1 - c0) / 1e9 / (t1 - t0)


def floor_cpu(seconds: float) -> float:
    """A thread waking 1000 times a second, doing nothing: this machine's wake-up cost."""
    code = (
        "import threading,time\n"
        "lk=threading.Lock();lk.acquire();nxt=time.monotonic()\n"
        "while True:\n"
        "    nxt+=0.001;d=nxt-time.monotonic()\n"
        "    if d>0: lk.acquire(timeout=d)\n"
    )
    return process_cpu_pct([sys.executable, "-c", code], seconds)


C_LOOP = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static char buf[1 << 16];
/* 1 kHz: sleep to the next tick, read every node's numastat; every 10th tick (the engine's
 * 100 Hz sensors) vmstat, stat, PSI and every node's meminfo. No parsing, no output. */
int main(void) {
  int fast[64], slow[80], nf = 0, ns = 0;
  glob_t g;
  if (glob("/sys/devices/system/node/node*/numastat", 0, NULL, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc && nf < 64; i++) fast[nf++] = open(g.gl_pathv[i], O_RDONLY);
  if (glob("/sys/devices/system/node/node*/meminfo", 0, NULL, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc && ns < 70; i++) slow[ns++] = open(g.gl_pathv[i], O_RDONLY);
  const char *s[] = {"/proc/vmstat", "/proc/stat", "/proc/pressure/cpu", "/proc/pressure/memory",
                     "/proc/pressure/io"};
  for (int i = 0; i < 5; i++) slow[ns++] = open(s[i], O_RDONLY);
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  for (long n = 0;; n++) {
    t.tv_nsec += 1000000;
    if (t.tv_nsec >= 1000000000) t.tv_nsec -= 1000000000, t.tv_sec++;
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
    for (int i = 0; i < nf; i++) (void)!pread(fast[i], buf, sizeof buf, 0);
    if (n % 10 == 0)
      for (int i = 0; i < ns; i++) (void)!pread(slow[i], buf, sizeof buf, 0);
  }
}
"""


def c_loop_cpu(seconds: float) -> float | None:
    """The least a 1 kHz sampler of the /proc and /sys sensors costs here whatever its
    language: a C loop doing only the timed sleeps and the reads (C_LOOP). None without cc."""
    cc = shutil.which("cc")
    if cc is None:
        return None
    src, exe = common.CACHE / "monitor_c_loop.c", common.CACHE / "monitor_c_loop"
    src.write_text(C_LOOP)
    if subprocess.run([cc, "-O2", "-o", str(exe), str(src)], capture_output=True).returncode:
        return None
    return process_cpu_pct([str(exe)], seconds)


def cpu(n: int) -> dict:
    runs: dict[str, list] = {
        "10Hz": [],
        "1kHz": [],
        "1kHz_numastat": [],
        "floor_1kHz": [],
        "c_loop_1kHz": [],
    }
    for _ in range(n):
        runs["10Hz"].append(record_cpu("100ms", 20.0))
        runs["1kHz"].append(record_cpu("1ms", 10.0))
        runs["1kHz_numastat"].append(record_cpu("1ms", 10.0, NUMASTAT_COUNTERS))
        runs["floor_1kHz"].append({"cpu_pct": floor_cpu(10.0), "samples_per_s": 1000.0})
        c = c_loop_cpu(10.0)
        if c is not None:
            runs["c_loop_1kHz"].append({"cpu_pct": c, "samples_per_s": 1000.0})
    out = {}
    for k, rs in runs.items():
        if not rs:
            continue
        out[k] = {
            "cpu_pct": round(common.median([r["cpu_pct"] for r in rs]), 3),
            "samples_per_s": round(common.median([r["samples_per_s"] for r in rs]), 1),
            "runs_cpu_pct": [round(r["cpu_pct"], 3) for r in rs],
        }
    return out


def sensor_costs(seconds: float = 3.0) -> dict:
    """CPU time of the sampling thread per read of each present sensor alone, at 100 Hz."""
    from locus.monitor.engine import Monitor, sensor_classes

    out = {}
    for cls in sensor_classes():
        s = cls()
        if not s.present():
            out[s.name] = {"present": False, "reason": s.reason}
            continue
        m = Monitor(0.01, [s.name], [s])
        spent = [0]
        fetch, process = m._tick, m._process

        def timed(fn, spent=spent):
            def run(*a):
                c = time.thread_time_ns()
                try:
                    return fn(*a)
                finally:
                    spent[0] += time.thread_time_ns() - c

            return run

        m._tick, m._process = timed(fetch), timed(process)
        m.start()
        time.sleep(0.5)
        spent[0], n0 = 0, m.samples
        time.sleep(seconds)
        n = m.samples - n0
        m.stop()
        # The system calls alone, back to back (hot caches, no wake-up, no parsing): the
        # least a read of this sensor costs, whatever the language of the sampler.
        hot = cls()
        hot.events()
        hot.enable(hot.defaults())
        for _ in range(100):
            hot.fetch()
        c, reps = time.thread_time_ns(), 2000
        for _ in range(reps):
            hot.fetch()
        syscall_us = (time.thread_time_ns() - c) / reps / 1000
        hot.close()
        out[s.name] = {
            "present": True,
            "events": len(m.events),
            "us_per_read": round(spent[0] / max(1, n) / 1000, 1),
            "syscall_us_per_read": round(syscall_us, 1),
            "max_rate_hz": hot.rate,
        }
    return out


def stress_argv(ops: int) -> list[str]:
    return ["stress-ng", "--cpu", "1", "--cpu-method", "int64", "--cpu-ops", str(ops), "-q"]


def calibrate(target_s: float = 2.0) -> int:
    ops = 2000
    t0 = time.monotonic()
    subprocess.run(stress_argv(ops), check=True, capture_output=True)
    dt = time.monotonic() - t0
    return max(100, int(ops * target_s / dt))


def recorded_duration(lenses: str, ops: int) -> float:
    run = common.CACHE / "monitor-record"
    shutil.rmtree(run, ignore_errors=True)
    argv = [*common.locus_argv(), "record", "-o", str(run), "--lens", lenses, "--"]
    p = subprocess.run([*argv, *stress_argv(ops)], capture_output=True, env=common.locus_env())
    if p.returncode != 0:
        raise SystemExit(f"record failed: {p.stderr.decode(errors='replace')}")
    return json.loads((run / "meta.json").read_text())["duration_s"]


def record_overhead(n: int) -> dict:
    if not shutil.which("stress-ng"):
        return {"skipped": "stress-ng not installed"}
    ops = calibrate()
    base, mon, alone = [], [], []
    # The program's own duration varies by ~10 % from run to run here (host noise): many
    # more repetitions than for the CPU figures, interleaved, medians.
    for _ in range(4 * n):
        base.append(recorded_duration("locks", ops))
        mon.append(recorded_duration("locks,monitor", ops))
        alone.append(recorded_duration("monitor", ops))
    b, m, a = common.median(base), common.median(mon), common.median(alone)
    return {
        "program": " ".join(stress_argv(ops)),
        "locks_s": round(b, 4),
        "locks_monitor_s": round(m, 4),
        "monitor_s": round(a, 4),
        "added_pct": round(100.0 * (m / b - 1.0), 2),
        "monitor_vs_locks_pct": round(100.0 * (a / b - 1.0), 2),
        "runs": {"locks": base, "locks,monitor": mon, "monitor": alone},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=3, help="repetitions (medians)")
    ap.add_argument("--only", choices=("cpu", "sensors", "record"))
    a = ap.parse_args()
    common.CACHE.mkdir(parents=True, exist_ok=True)
    res = {**common.stamp(), "n": a.n}
    parts = []
    if a.only in (None, "cpu"):
        res["cpu"] = c = cpu(a.n)
        print(common.table(
            ["what", "CPU % of a core", "samples/s", "target"],
            [
                ["10 Hz, all sensors", f"{c['10Hz']['cpu_pct']:.2f}", c["10Hz"]["samples_per_s"],
                 "<= 1"],
                ["1 kHz, all sensors", f"{c['1kHz']['cpu_pct']:.2f}", c["1kHz"]["samples_per_s"],
                 "<= 5"],
                ["1 kHz, numastat only", f"{c['1kHz_numastat']['cpu_pct']:.2f}",
                 c["1kHz_numastat"]["samples_per_s"], ""],
                ["1 kHz wake-ups alone (floor)", f"{c['floor_1kHz']['cpu_pct']:.2f}", 1000, ""],
                *([["1 kHz, C loop: sleeps + reads only", f"{c['c_loop_1kHz']['cpu_pct']:.2f}",
                    1000, ""]] if "c_loop_1kHz" in c else []),
            ],
        ))  # fmt: skip
        parts.append(
            f"cpu 10Hz {c['10Hz']['cpu_pct']:.2f}%, 1kHz {c['1kHz']['cpu_pct']:.2f}% "
            f"(numastat only {c['1kHz_numastat']['cpu_pct']:.2f}%, "
            f"floor {c['floor_1kHz']['cpu_pct']:.2f}%"
            + (f", C loop {c['c_loop_1kHz']['cpu_pct']:.2f}%" if "c_loop_1kHz" in c else "")
            + ")"
        )
    if a.only in (None, "sensors"):
        res["sensors"] = s = sensor_costs()
        rows = [
            [
                k,
                str(v.get("events", "-")),
                f"{v['us_per_read']}" if v["present"] else "absent",
                f"{v['syscall_us_per_read']}" if v["present"] else "",
            ]
            for k, v in s.items()
        ]
        print(
            common.table(
                ["sensor", "events", "us per read (100 Hz)", "system calls alone, us"], rows
            )
        )
        # At 1 kHz each sensor is read at min(1 kHz, its own highest rate) (engine.py).
        pct = sum(
            v["syscall_us_per_read"] * min(1000.0, v["max_rate_hz"]) / 1e4
            for v in s.values()
            if v["present"]
        )
        s["syscalls_1kHz_cpu_pct"] = round(pct, 2)
        line = f"every sensor's system calls at 1 kHz (each at its highest rate): {pct:.2f} %"
        if "cpu" in res:
            floor = res["cpu"]["floor_1kHz"]["cpu_pct"] + pct
            res["cpu"]["floor_1kHz_all_sensors_pct"] = round(floor, 2)
            line += f" of a core; with the wake-ups, a floor of {floor:.2f} %"
        print(line)
        parts.append(
            "read us "
            + ", ".join(
                f"{k} {v['us_per_read']} (syscalls {v['syscall_us_per_read']})"
                for k, v in s.items()
                if isinstance(v, dict) and v["present"]
            )
        )
    if a.only in (None, "record"):
        res["record"] = r = record_overhead(a.n)
        if "skipped" in r:
            print(f"record overhead: skipped ({r['skipped']})")
        else:
            print(
                f"record of `{r['program']}`: --lens locks {r['locks_s']:.3f} s, "
                f"locks,monitor {r['locks_monitor_s']:.3f} s ({r['added_pct']:+.2f} %), "
                f"monitor alone {r['monitor_s']:.3f} s"
            )
            parts.append(f"record {r['added_pct']:+.2f}% wall (locks,monitor vs locks)")
    path = common.write_result("monitor" + (f"-{a.only}" if a.only else "") + ".json", res)
    common.append_history(f"- {res['date']} `{res['git_rev']}` monitor: " + "; ".join(parts))
    print(f"wrote {path.relative_to(common.REPO)}")


if __name__ == "__main__":
    main()
