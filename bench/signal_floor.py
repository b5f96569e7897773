#!/usr/bin/env python3
"""The floor of any CPU-time sampler on this machine: a CPU-bound loop's own CPU time with a
task-clock perf event raising SIGTRAP every 1 ms (the soft backend's default period) and an
empty handler, against the same loop without it, in one run, interleaved, medians. Prints
the ratio and the cost per signal: the kernel's signal delivery and return, and in a virtual
machine the timer's exits to the hypervisor, which the guest's own profilers cannot see.
The comm lens's soft backend pays this plus its handler (docs/lenses/comm.md, Cost).

Usage: bench/signal_floor.py [-n 5] [--period-ns 1000000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--period-ns", type=int, default=1_000_000)
    args = ap.parse_args()
    common.CACHE.mkdir(parents=True, exist_ok=True)
    exe = common.CACHE / "signal_floor"
    src = Path(__file__).resolve().parent / "src" / "signal_floor.c"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    signals = []
    for _ in range(args.n):
        for mode in ("off", "on"):
            p = subprocess.run(
                [str(exe), "1" if mode == "on" else "0", str(args.period_ns)],
                capture_output=True,
                text=True,
            )
            if p.returncode != 0:
                raise SystemExit(f"signal_floor failed: {p.stderr.strip()} (perf_event_open?)")
            f = p.stdout.split()
            cpu[mode].append(float(f[1]))
            if mode == "on":
                signals.append(int(f[3]))
    off, on, sig = common.median(cpu["off"]), common.median(cpu["on"]), common.median(signals)
    per = (on - off) / sig * 1e6 if sig else float("nan")
    data = {
        **common.stamp(),
        "n": args.n,
        "period_ns": args.period_ns,
        "cpu_s_off": off,
        "cpu_s_on": on,
        "signals": sig,
        "ratio": on / off,
        "us_per_signal": per,
    }
    path = common.write_result("signal-floor.json", data)
    print(f"signal floor at {args.period_ns} ns: x{on / off:.3f} ({per:.1f} us a signal)")
    print(f"written {path}")
    common.append_history(
        f"- {data['date']} `{data['git_rev']}` signal floor: x{on / off:.3f} of a CPU-bound "
        f"loop's CPU time, {per:.1f} us a signal at {args.period_ns} ns (n={args.n})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
