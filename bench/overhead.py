#!/usr/bin/env python3
"""Overhead of `locus record --lens locks` on real programs: wall time and peak RSS.

Each program runs N times without and N times with locus, interleaved (plain, locus, plain,
...) so that a drift of the machine affects both sides alike. Reported: the median wall-time
ratio, the peak-RSS ratio of the target, the launcher's own peak RSS, and for pigz whether the
output is byte-identical.

How peak RSS is measured: the target runs under /usr/bin/time -f %M (in both cases, so the
wrapper's cost cancels), which reports the maxrss of exactly the target process, whether it
is a child of this script or of the locus launcher. The launcher's own peak is its VmHWM in
/proc, polled while it runs (the last reading before it exits).

Usage: bench/overhead.py [-n 3] [--sysbench-locks 40000000] [--only pigz|sysbench]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BIG_TAR = common.CACHE / "big.tar"
BIG_TAR_BYTES = 200 * 1024 * 1024
TAR_SOURCES = ("/usr/share/doc", "/usr/lib/x86_64-linux-gnu")
TIME = "/usr/bin/time"


def build_big_tar() -> Path:
    """~200 MB tar of /usr/share/doc then /usr/lib/x86_64-linux-gnu (sorted, so the same
    machine always builds the same input)."""
    if BIG_TAR.exists() and BIG_TAR.stat().st_size >= BIG_TAR_BYTES // 2:
        return BIG_TAR
    common.CACHE.mkdir(parents=True, exist_ok=True)
    tmp = BIG_TAR.with_suffix(".tmp")
    total = 0
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        for root in TAR_SOURCES:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    p = os.path.join(dirpath, name)
                    if os.path.islink(p) or not os.path.isfile(p):
                        continue
                    try:
                        tar.add(p, recursive=False)
                        total += os.path.getsize(p)
                    except OSError:
                        continue
                    if total >= BIG_TAR_BYTES:
                        break
                if total >= BIG_TAR_BYTES:
                    break
            if total >= BIG_TAR_BYTES:
                break
    tmp.rename(BIG_TAR)
    return BIG_TAR


def vm_hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_once(cmd: list[str], with_locus: bool, out_path: Path) -> dict:
    rss_file = common.CACHE / "maxrss.txt"
    timed = [TIME, "-f", "%M", "-o", str(rss_file), *cmd]
    if with_locus:
        run_dir = common.CACHE / "overhead-run"
        shutil.rmtree(run_dir, ignore_errors=True)
        argv = [*common.locus_argv(), "record", "-o", str(run_dir), "--lens", "locks", "--", *timed]
    else:
        argv = timed
    with open(out_path, "wb") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.PIPE, env=common.locus_env(), cwd=common.CACHE
        )
        launcher_kb = None
        while proc.poll() is None:
            if with_locus:
                launcher_kb = vm_hwm_kb(proc.pid) or launcher_kb
            time.sleep(0.05)
        wall = time.monotonic() - t0
        err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)}\n{err}")
    target_kb = int(rss_file.read_text().split()[-1])
    return {"wall_s": wall, "target_maxrss_kb": target_kb, "launcher_maxrss_kb": launcher_kb}


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def bench(name: str, cmd: list[str], n: int, compare_output: bool) -> dict:
    plain, traced, identical = [], [], True
    for i in range(n):
        for with_locus in (False, True):
            out = common.CACHE / f"{name}.{'locus' if with_locus else 'plain'}.out"
            r = run_once(cmd, with_locus, out)
            (traced if with_locus else plain).append(r)
            print(
                f"  {name} #{i + 1} {'locus' if with_locus else 'plain':5} "
                f"{r['wall_s']:7.2f}s  maxrss {r['target_maxrss_kb'] / 1024:7.1f} MiB",
                flush=True,
            )
        if compare_output:
            a, b = (common.CACHE / f"{name}.{k}.out" for k in ("plain", "locus"))
            identical = identical and digest(a) == digest(b)
    m_plain = common.median([r["wall_s"] for r in plain])
    m_traced = common.median([r["wall_s"] for r in traced])
    rss_plain = common.median([r["target_maxrss_kb"] for r in plain])
    rss_traced = common.median([r["target_maxrss_kb"] for r in traced])
    launcher = [r["launcher_maxrss_kb"] for r in traced if r["launcher_maxrss_kb"]]
    return {
        "command": cmd,
        "n": n,
        "plain_wall_s": [r["wall_s"] for r in plain],
        "locus_wall_s": [r["wall_s"] for r in traced],
        "median_plain_wall_s": m_plain,
        "median_locus_wall_s": m_traced,
        "wall_ratio": m_traced / m_plain,
        "median_plain_maxrss_kb": rss_plain,
        "median_locus_maxrss_kb": rss_traced,
        "maxrss_ratio": rss_traced / rss_plain,
        "launcher_maxrss_kb": max(launcher) if launcher else None,
        "output_identical": identical if compare_output else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3, help="runs per side (default 3)")
    ap.add_argument("--sysbench-locks", type=int, default=40_000_000)
    ap.add_argument("--only", choices=("pigz", "sysbench"))
    args = ap.parse_args()
    for tool in ("pigz", "sysbench", TIME):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: run `make deps`")
    if not (common.REPO / "build" / "liblocus.so").exists():
        raise SystemExit("build/liblocus.so is missing: run `make build`")
    common.CACHE.mkdir(parents=True, exist_ok=True)

    results = {}
    if args.only in (None, "pigz"):
        tar = build_big_tar()
        print(f"pigz on {tar} ({tar.stat().st_size / 2**20:.0f} MiB)", flush=True)
        results["pigz"] = bench("pigz", ["pigz", "-p", "2", "-c", str(tar)], args.n, True)
    if args.only in (None, "sysbench"):
        sysbench = [
            "sysbench",
            "mutex",
            "--threads=4",
            "--mutex-num=4",
            f"--mutex-locks={args.sysbench_locks}",
            "--mutex-loops=50",
            "run",
        ]
        print("sysbench mutex", flush=True)
        results["sysbench_mutex"] = bench("sysbench", sysbench, args.n, False)

    rows = []
    for name, r in results.items():
        launcher = r["launcher_maxrss_kb"]
        rows.append(
            [
                name,
                f"{r['median_plain_wall_s']:.2f}",
                f"{r['median_locus_wall_s']:.2f}",
                f"{r['wall_ratio']:.3f}",
                f"{r['maxrss_ratio']:.3f}",
                f"{launcher / 1024:.1f}" if launcher else "-",
                {True: "yes", False: "NO", None: "-"}[r["output_identical"]],
            ]
        )
    print()
    headers = ["program", "plain s", "locus s", "time x", "rss x", "launcher MiB", "same out"]
    print(common.table(headers, rows))
    data = {**common.stamp(), "results": results}
    path = common.write_result("overhead.json", data)
    summary = ", ".join(
        f"{k} time x{r['wall_ratio']:.2f} rss x{r['maxrss_ratio']:.2f}" for k, r in results.items()
    )
    common.append_history(f"- {data['date']} `{data['git_rev']}` overhead (n={args.n}): {summary}")
    print(f"\nwritten {path.relative_to(common.REPO)}")
    bad = [k for k, r in results.items() if r["output_identical"] is False]
    if bad:
        print(f"output differs under locus: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
