#!/usr/bin/env python3
"""The numa lens against its ground truth on real NUMA nodes, and its cost.

Accuracy (`--only accuracy`): the numa workloads run in the 2-node QEMU guest
(scripts/numavm, one boot), recorded with `--lens numa` (soft sampling; numa_firsttouch
also with `--backend exact`, built with `locus cc`), each printing its truth (--truth).
The reports (made on the host) are compared with what the kernel says (the workloads'
move_pages queries) and what the construction says:
- first touch: the share of each array's pages whose first-touch thread in the report is
  the thread that initialised them;
- placement: pages per node of each array in the report vs move_pages in the workload;
- local/remote: the remote share of the pinned workers' accesses in the report (sampled
  or exact) vs the share of their element accesses that were remote by construction.

Cost (`--only overhead`): wall time and peak RSS of `locus record --lens numa` (soft, default
period, first-touch protection on) against the plain program, interleaved, medians: the
numa workloads (here, one node) and real programs (sysbench memory, stress-ng --vm, pigz).

Usage: bench/numa.py [-n 3] [--only accuracy|overhead]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

WL = common.REPO / "workloads" / "build"
NUMAVM = common.REPO / "scripts" / "numavm"
TIME = "/usr/bin/time"


def timed(argv: list[str], numa: bool) -> tuple[float, int]:
    rss = common.CACHE / "numa-maxrss.txt"
    inner = [TIME, "-f", "%M", "-o", str(rss), *argv]
    if numa:
        run = common.CACHE / "numa-overhead"
        shutil.rmtree(run, ignore_errors=True)
        inner = [*common.locus_argv(), "record", "-o", str(run), "--lens", "numa", "--", *inner]
    t0 = time.monotonic()
    p = subprocess.run(inner, capture_output=True, env=common.locus_env())
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(inner)}\n{p.stderr.decode(errors='replace')}")
    return wall, int(rss.read_text().split()[-1])


def overhead(n: int) -> dict:
    big = common.CACHE / "numa-pigz-input.bin"
    if not big.exists():
        # 96 MiB of shared libraries: real, compressible data (pigz -p 2 takes ~2-3 s).
        chunks, size = [], 0
        for f in sorted(Path("/usr/lib/x86_64-linux-gnu").glob("*.so*")):
            if size >= 96 << 20 or not f.is_file():
                continue
            b = f.read_bytes()[: (96 << 20) - size]
            chunks.append(b)
            size += len(b)
        big.write_bytes(b"".join(chunks))
    progs = {
        # Long enough (1-3 s) that the launcher's start-up does not dominate the ratio.
        "numa_firsttouch_serial": [
            *(str(WL / "numa_firsttouch"), "2", "64", "--init", "serial", "--iters", "300")
        ],
        "numa_firsttouch_parallel": [
            *(str(WL / "numa_firsttouch"), "2", "64", "--init", "parallel", "--iters", "300")
        ],
        "numa_hydro": [str(WL / "numa_hydro"), "2", "32", "--iters", "500"],
        "sysbench_memory": "sysbench memory --threads=2 --memory-block-size=4M "
        "--memory-total-size=40G run".split(),
        "stress_vm": "stress-ng --vm 2 --vm-bytes 64M --timeout 3s --metrics-brief".split(),
        "pigz": ["pigz", "-p", "2", "-c", str(big)],
    }
    return common.overhead(progs, n, timed, "numa")


# -- accuracy on real NUMA ------------------------------------------------------------------

JOBS = {
    "ft_serial": ("soft", "numa_firsttouch", "2 16 --init serial --iters 20"),
    "ft_parallel": ("soft", "numa_firsttouch", "2 16 --init parallel --iters 20"),
    "hydro": ("soft", "numa_hydro", "2 16 --iters 20"),
    "ft_serial_exact": ("exact", "numa_firsttouch", "2 4 --init serial --iters 2"),
    "ft_parallel_exact": ("exact", "numa_firsttouch", "2 4 --init parallel --iters 2"),
}


def guest_script(work: Path, exact_dir: Path) -> str:
    lines = ["set -u", f"cd {work}"]
    locus = common.REPO / ".venv" / "bin" / "locus"
    for name, (backend, prog, args) in JOBS.items():
        exe = (exact_dir if backend == "exact" else WL) / prog
        lines.append(
            f"{locus} record -o {work / name} --lens numa --backend {backend} -- "
            f"{exe} {args} --truth 2> {work / name}.err > /dev/null || echo FAIL {name}"
        )
    return "\n".join(lines) + "\n"


def report(run: Path) -> dict:
    r = subprocess.run(
        [*common.locus_argv(), "report", str(run), "--lens", "numa", "--format", "json"],
        capture_output=True,
        text=True,
        env=common.locus_env(),
    )
    if r.returncode != 0:
        raise SystemExit(f"report failed: {r.stderr}")
    return json.loads(r.stdout)["lenses"]["numa"]


def truth_of(err: Path) -> dict:
    for line in err.read_text().splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"no truth in {err}")


def alloc_of(numa: dict, lo: int) -> dict | None:
    for a in numa["allocations"]:
        start = int(str(a["address"]), 0)
        if start <= lo < start + a["size"] + 4096:
            return a
    return None


def compare(numa: dict, truth: dict) -> dict:
    """First-touch attribution, placement and the compute loop's remote share of one run
    against its truth (the kernel's move_pages in the workload, and the construction)."""
    arrays = truth.get("chunks") or truth.get("arrays") or []
    allocs: dict[int, tuple[dict, list]] = {}
    for arr in arrays:
        a = alloc_of(numa, arr["lo"])
        if a is not None:
            allocs.setdefault(int(str(a["address"]), 0), (a, []))[1].append(arr)
    got_nodes: dict[str, int] = {}
    want_nodes: dict[str, int] = {}
    agree = total = 0
    for a, arrs in allocs.values():
        for k, v in a["pages_per_node"].items():
            got_nodes[str(k)] = got_nodes.get(str(k), 0) + int(v)
        init: dict[int, int] = {}
        for arr in arrs:
            for k, v in arr["pages_per_node_after_compute"].items():
                want_nodes[k] = want_nodes.get(k, 0) + v
            for ft in arr["first_touch"]:
                init[ft["tid"]] = init.get(ft["tid"], 0) + ft["pages"]
        got_ft = {int(t["tid"]): t["pages"] for t in a["first_touch_threads"]}
        agree += sum(min(got_ft.get(t, 0), p) for t, p in init.items())
        total += sum(init.values())
    res: dict = {
        "allocations_found": f"{len(allocs)}",
        "pages_per_node": {"report": got_nodes, "truth": want_nodes},
        "placement_exact": {k: v for k, v in got_nodes.items() if v}
        == {k: v for k, v in want_nodes.items() if v},
        "first_touch_agreement": agree / total if total else None,
    }
    # The compute loop: its element accesses by node pair are known by construction.
    m = truth.get("compute_matrix", {})
    acc = sum(v for row in m.values() for v in row.values())
    remote_true = sum(v for r, row in m.items() for c, v in row.items() if r != c)
    site = next((x for x in numa["sites"] if x["function"] == truth.get("compute_site")), None)
    res["remote_share_truth"] = remote_true / acc if acc else None
    if site is not None and site["local"] + site["remote"]:
        res["remote_share_report"] = site["remote"] / (site["local"] + site["remote"])
        res["remote_share_error_points"] = 100 * (
            res["remote_share_report"] - res["remote_share_truth"]
        )
    return res


def accuracy() -> dict:
    work = Path(tempfile.mkdtemp(prefix="locus-numa-bench-", dir=str(common.CACHE)))
    exact_dir = work / "exact"
    exact_dir.mkdir()
    for prog in {p for _, p, _ in JOBS.values()}:
        subprocess.run(
            [
                *common.locus_argv(),
                "cc",
                "-O2",
                "-g",
                "-pthread",
                "-D_GNU_SOURCE",
                "-o",
                str(exact_dir / prog),
                str(common.REPO / "workloads" / f"{prog}.c"),
                "-ldl",
            ],
            check=True,
            env=common.locus_env(),
        )
    script = work / "jobs.sh"
    script.write_text(guest_script(work, exact_dir))
    t0 = time.monotonic()
    p = subprocess.run(
        [
            *(sys.executable, str(NUMAVM), "--share", str(work), "--share", str(common.REPO)),
            *("--script", str(script)),
        ],
        capture_output=True,
        text=True,
    )
    print(f"  guest: {time.monotonic() - t0:.1f} s, rc {p.returncode}", flush=True)
    if p.returncode != 0 or "FAIL" in p.stdout:
        raise SystemExit(f"guest run failed:\n{p.stdout}\n{p.stderr}")
    out = {}
    for name in JOBS:
        res = compare(report(work / name), truth_of(work / f"{name}.err"))
        out[name] = res
        print(f"  {name}: {json.dumps(res)}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--only", choices=("accuracy", "overhead"))
    a = ap.parse_args()
    res: dict = {**common.stamp(), "n": a.n}
    parts = []
    if a.only in (None, "overhead"):
        res["overhead"] = overhead(a.n)
        parts.append(
            ", ".join(
                f"{k} x{v['wall_ratio']:.2f} rss x{v['maxrss_ratio']:.2f}"
                for k, v in res["overhead"].items()
            )
        )
    if a.only in (None, "accuracy"):
        res["accuracy"] = accuracy()
        parts.append(
            ", ".join(
                f"{k} ft {v.get('first_touch_agreement', 0):.3f} "
                f"remote {v.get('remote_share_report') or 0:.2f}/"
                f"{v.get('remote_share_truth') or 0:.2f}"
                for k, v in res["accuracy"].items()
            )
        )
    path = common.write_result("numa" + (f"-{a.only}" if a.only else "") + ".json", res)
    common.append_history(f"- {res['date']} `{res['git_rev']}` numa: " + "; ".join(parts))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
