#!/usr/bin/env python3
"""Speed of the locks analysis on a 1,000,000-event run.

Writes a synthetic run with locus.synth.many_events (8 threads, 16 locks, ~7/8 of the
sections contended) into bench/.cache/, then times:
  - the analysis in-process (the function behind `locus report`, without interpreter start,
    imports or JSON rendering), best of N;
  - the whole command `locus report RUN --format json` (what a user waits for), best of N.
Writes bench/results/analysis_speed.json. The architecture's target: well under a second
for a million events.

Usage: bench/analysis_speed.py [--events 1000000] [-n 3]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

sys.path.append(str(common.REPO / "python"))

ENTRY_POINT = "locus.analysis.locks.analyze(locus.rundir.RunDir.open(run))"


def find_analysis():
    """The function behind `locus report`: open the run, analyse the locks lens (no JSON)."""
    try:
        from locus.analysis.locks import analyze
        from locus.rundir import RunDir
    except ImportError as e:
        print(f"in-process: analysis not importable ({e})")
        return None, None
    return ENTRY_POINT, lambda run: analyze(RunDir.open(run))


def best_of(n: int, fn) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("-n", type=int, default=3, help="repetitions (best is reported)")
    args = ap.parse_args()
    from locus import synth

    run = common.CACHE / f"synth-{args.events}"
    shutil.rmtree(run, ignore_errors=True)
    common.CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    synth.many_events(str(run), n_events=args.events)
    gen_s = time.perf_counter() - t0
    events_bytes = sum(p.stat().st_size for p in run.glob("procs/*/locks.events.bin"))
    print(f"generated {args.events} events ({events_bytes / 2**20:.0f} MiB) in {gen_s:.2f}s")

    name, fn = find_analysis()
    in_process = None
    if fn is not None:
        fn(str(run))  # warm: imports, page cache
        in_process = best_of(args.n, lambda: fn(str(run)))
        print(f"in-process {name}: best {min(in_process):.3f}s of {args.n}")

    argv = [*common.locus_argv(), "report", str(run), "--format", "json"]

    def whole():
        p = subprocess.run(argv, capture_output=True, env=common.locus_env())
        if p.returncode != 0:
            raise SystemExit(f"locus report failed ({p.returncode}): {p.stderr.decode()}")
        return p

    whole()
    command = best_of(args.n, whole)
    print(f"whole command `locus report --format json`: best {min(command):.3f}s of {args.n}")

    data = {
        **common.stamp(),
        "events": args.events,
        "events_bytes": events_bytes,
        "generate_s": gen_s,
        "analysis_entry_point": name,
        "in_process_s": in_process,
        "in_process_best_s": min(in_process) if in_process else None,
        "command_s": command,
        "command_best_s": min(command),
    }
    path = common.write_result("analysis_speed.json", data)
    inproc = "n/a" if not in_process else f"{min(in_process):.3f}s"
    common.append_history(
        f"- {data['date']} `{data['git_rev']}` analysis_speed ({args.events} events): "
        f"in-process {inproc}, command {min(command):.3f}s"
    )
    print(f"written {path.relative_to(common.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
