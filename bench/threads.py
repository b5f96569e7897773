#!/usr/bin/env python3
"""What each short-lived thread costs: workloads/churn (N threads created and joined in
waves of 64, each locking one mutex K times), plain and under `locus record --lens L` for
each lens, in one run, interleaved, medians. Prints the wall-time ratio, the time locus adds
per thread, and the run directory's disk use per thread (what `du` counts: a record file's
unused pages are holes). Thread-per-request servers and thread pools that shrink and grow pay
this once per thread: its registry slot, its first page of each record file (or the rest of
an ended thread's), its lock-count table, its stack record and (comm, numa) its perf events.

Usage: bench/threads.py [-n 3] [--threads 20000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

LENSES = ("locks", "comm", "numa")
CHURN = common.REPO / "workloads" / "build" / "churn"
LOCKS_PER_THREAD = 2


def disk_bytes(path: Path) -> int:
    """Blocks allocated under path, in bytes (du's measure, not the files' sizes)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def timed(threads: int, lens: str | None) -> tuple[float, int]:
    run = common.CACHE / "threads-run"
    wall = common.wall_under([str(CHURN), str(threads), str(LOCKS_PER_THREAD)], lens, run)
    return wall, disk_bytes(run) if lens else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--threads", type=int, default=20000)
    a = ap.parse_args()
    common.CACHE.mkdir(parents=True, exist_ok=True)
    res: dict = {}
    for lens in LENSES:
        plain, tool, disk = [], [], []
        for _ in range(a.n):
            plain.append(timed(a.threads, None)[0])
            w, d = timed(a.threads, lens)
            tool.append(w)
            disk.append(d)
        p, t, d = common.median(plain), common.median(tool), common.median(disk)
        res[lens] = {
            "plain_s": p,
            "locus_s": t,
            "wall_ratio": t / p,
            "us_per_thread": (t - p) / a.threads * 1e6,
            "disk_bytes": d,
            "disk_bytes_per_thread": d / a.threads,
        }
        print(
            f"  {lens}: x{t / p:.2f}, {(t - p) / a.threads * 1e6:.0f} us and "
            f"{d / a.threads / 1024:.2f} KiB of run directory per thread",
            flush=True,
        )
    out = {**common.stamp(), "n": a.n, "threads": a.threads, "threads_churn": res}
    path = common.write_result("threads.json", out)
    common.append_history(
        f"- {out['date']} `{out['git_rev']}` threads ({a.threads} x churn): "
        + ", ".join(
            f"{k} x{v['wall_ratio']:.2f} {v['us_per_thread']:.0f} us/thread "
            f"{v['disk_bytes_per_thread'] / 1024:.2f} KiB/thread"
            for k, v in res.items()
        )
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
