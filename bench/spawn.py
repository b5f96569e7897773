#!/usr/bin/env python3
"""What each recorded process costs at start: a shell loop that runs /bin/true N times, plain
and under `locus record --lens L` for each lens, in one run, interleaved, medians. Prints the
wall-time ratio and the cost per process (the launcher's own start, measured with N = 0, is
subtracted). Spawn-heavy programs (make, shell scripts, test drivers) pay this once per
process: its directory and record files, the copies of its maps, the runtime's and (comm) the
decoder's load, the TSC calibration, the perf events.

Usage: bench/spawn.py [-n 5] [--procs 100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

LENSES = ("locks", "comm", "numa")


def loop(k: int) -> list[str]:
    return ["sh", "-c", f"i=0; while [ $i -lt {k} ]; do /bin/true; i=$((i+1)); done"]


def timed(argv: list[str], lens: str | None) -> float:
    return common.wall_under(argv, lens, common.CACHE / "spawn-run")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--procs", type=int, default=100)
    a = ap.parse_args()
    common.CACHE.mkdir(parents=True, exist_ok=True)
    res: dict = {}
    for lens in LENSES:
        plain, tool, empty, plain0 = [], [], [], []
        for _ in range(a.n):
            plain.append(timed(loop(a.procs), None))
            tool.append(timed(loop(a.procs), lens))
            empty.append(timed(loop(0), lens))
            plain0.append(timed(loop(0), None))
        p, t = common.median(plain), common.median(tool)
        e, p0 = common.median(empty), common.median(plain0)
        # Each iteration is a fork of the shell and the exec'd /bin/true: two recorded
        # process images. What locus adds per iteration, without its launcher's start:
        per = ((t - e) - (p - p0)) / a.procs
        res[lens] = {
            "plain_s": p,
            "locus_s": t,
            "launcher_s": e,
            "wall_ratio": t / p,
            "ms_per_process": per * 1000.0,
        }
        print(f"  {lens}: x{t / p:.2f}, {per * 1000.0:.2f} ms per spawned process", flush=True)
    out = {**common.stamp(), "n": a.n, "procs": a.procs, "spawn": res}
    path = common.write_result("spawn.json", out)
    common.append_history(
        f"- {out['date']} `{out['git_rev']}` spawn ({a.procs} x /bin/true): "
        + ", ".join(f"{k} {v['ms_per_process']:.2f} ms/process" for k, v in res.items())
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
