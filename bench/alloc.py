#!/usr/bin/env python3
"""What an allocation costs under each lens: a C loop of malloc + free pairs (64 blocks in
flight, 16-271 bytes), plain and under `locus record --lens L`, in one run, interleaved,
medians. The program times its own loop (ns per pair), so the launcher's start is not in
the ratio. Under comm and numa every malloc and free writes an allocation record (32 and 16
bytes, docs/runtime.md): this is that cost, which allocation-heavy programs (C++ servers,
redis) pay per call. A block no record named while it lived has its record dropped at its
free when its record is still in the thread's nursery (docs/format.md, heap.bin): the rows
`comm`, `numa` (64 in flight) and `comm temporaries` (each block freed at once) are that
case. The row `comm kept` frees nothing (ns per malloc): a program that keeps what it
allocates, whose every block is recorded.

Usage: bench/alloc.py [-n 5] [--pairs 2000000]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

LENSES = ("locks", "comm", "numa")

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 2000000;
  int flight = argc > 2 ? atoi(argv[2]) : 64; /* blocks in flight: 64, 1, or 0: none freed */
  void *keep[64] = {0};
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < pairs; i++) {
    int k = flight == 1 ? 0 : i & 63;
    if (flight) free(keep[k]);
    keep[k] = malloc(16 + (i & 255));
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  for (int k = 0; k < 64; k++) free(keep[k]);
  printf("%.3f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / pairs);
  return 0;
}
"""


def build() -> Path:
    common.CACHE.mkdir(parents=True, exist_ok=True)
    src, exe = common.CACHE / "alloc_churn.c", common.CACHE / "alloc_churn"
    src.write_text(SOURCE)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def ns_per_pair(exe: Path, pairs: int, lens: str | None, flight: int = 64) -> float:
    run = common.CACHE / "alloc-run"
    shutil.rmtree(run, ignore_errors=True)
    argv = [str(exe), str(pairs), str(flight)]
    if lens is not None:
        argv = [*common.locus_argv(), "record", "-o", str(run), "--lens", lens, "--", *argv]
    p = subprocess.run(argv, check=True, capture_output=True, text=True, env=common.locus_env())
    return float(p.stdout.split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=2000000)
    a = ap.parse_args()
    exe = build()
    res: dict = {}
    for name in (*LENSES, "comm temporaries", "comm kept"):
        lens = name.split()[0]
        flight = {"temporaries": 1, "kept": 0}.get(name.split()[-1], 64)
        plain, tool = [], []
        for _ in range(a.n):
            plain.append(ns_per_pair(exe, a.pairs, None, flight))
            tool.append(ns_per_pair(exe, a.pairs, lens, flight))
        p, t = common.median(plain), common.median(tool)
        res[name] = {"plain_ns_per_pair": p, "locus_ns_per_pair": t, "ratio": t / p}
        print(f"  {name}: {p:.1f} -> {t:.1f} ns per malloc+free (x{t / p:.1f})", flush=True)
    out = {**common.stamp(), "n": a.n, "pairs": a.pairs, "alloc": res}
    path = common.write_result("alloc.json", out)
    common.append_history(
        f"- {out['date']} `{out['git_rev']}` alloc (malloc+free pairs): "
        + ", ".join(
            f"{k} {v['plain_ns_per_pair']:.0f}->{v['locus_ns_per_pair']:.0f} ns"
            for k, v in res.items()
        )
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
