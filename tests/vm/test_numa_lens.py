"""The numa lens on real NUMA nodes (the 2-node guest): recordings of the numa workloads,
whose truth comes from the construction and from the kernel (move_pages in the workload),
and of a real Debian program. Recorded in the guest, reported on the host.

Node 0 has CPU 0, node 1 has CPU 1, node 2 has memory only (attached to node 1: distance 14
from it, 30 from node 0); the workloads pin worker k to CPU k, so worker 1 runs on node 1."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCUS = REPO / ".venv" / "bin" / "locus"
WL = REPO / "workloads" / "build"


def rec(args: str, prog: str, backend: str = "soft", exe_dir: str = str(WL)) -> str:
    return (
        f"{LOCUS} record -o $JOB_DIR/run --lens numa --backend {backend} {args} -- "
        f"{exe_dir}/{prog} --truth 2> $JOB_DIR/truth.err"
    )


VM_JOBS = {
    "numa_ft_serial": rec("", "numa_firsttouch 2 8 --init serial --iters 20"),
    "numa_ft_parallel": rec("", "numa_firsttouch 2 8 --init parallel --iters 20"),
    "numa_ft_thp": rec("", "numa_firsttouch 2 16 --init parallel --iters 5 --thp"),
    "numa_policy": rec("", "numa_policy 2"),
    # Exact: the soft sampler skips nearly every sample of numa_policy's read loop (its load,
    # movsbq (%rdx),%rdx, overwrites its own base register: no address to recompute).
    "numa_memory_only": rec("", "numa_policy 8 --target 2", "exact", "$VM_SHARED/exact"),
    "numa_pinning": rec("", "numa_pinning 0.3"),
    "numa_hydro": rec("", "numa_hydro 2 8 --iters 20"),
    "numa_ft_exact": rec(
        "", "numa_firsttouch 2 2 --init serial --iters 2", "exact", "$VM_SHARED/exact"
    ),
    "numa_sysbench": (
        f"{LOCUS} record -o $JOB_DIR/run --lens numa -- sysbench memory --threads=2 "
        "--memory-block-size=1M --memory-total-size=256M run > $JOB_DIR/out.txt"
    ),
}


def vm_prepare(shared: Path) -> None:
    """The exact backend's builds (locus cc) of numa_firsttouch and numa_policy, on the host."""
    out = shared / "exact"
    out.mkdir(exist_ok=True)
    for name in ("numa_firsttouch", "numa_policy"):
        subprocess.run(
            [
                str(LOCUS),
                "cc",
                "-O2",
                "-g",
                "-std=c11",
                "-D_GNU_SOURCE",
                "-pthread",
                "-o",
                str(out / name),
                str(REPO / "workloads" / f"{name}.c"),
                "-ldl",
            ],
            check=True,
        )


def truth(job_dir: Path) -> dict:
    for line in (job_dir / "truth.err").read_text().splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no truth line in {job_dir / 'truth.err'}")


def report(job_dir: Path, *extra: str) -> dict:
    r = subprocess.run(
        [str(LOCUS), "report", str(job_dir / "run"), "--lens", "numa", "--format", "json", *extra],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["lenses"]["numa"]


def run_of(numavm, name: str) -> tuple[dict, dict]:
    res = numavm.ok(name)
    return report(res.job_dir), truth(res.job_dir)


def alloc_of(numa: dict, lo: int, hi: int) -> dict:
    """The allocation holding [lo, hi)."""
    for a in numa["allocations"]:
        start = int(str(a["address"]), 0)
        if start <= lo and hi <= start + a["size"] + 4096:
            return a
    raise AssertionError(f"no allocation holds {lo:#x}-{hi:#x}: {numa['allocations']}")


def by_node(d: dict) -> dict[str, int]:
    return {str(k): int(v) for k, v in d.items() if int(v)}


def test_topology_is_real(numavm):
    numa, _ = run_of(numavm, "numa_ft_serial")
    assert numa["emulated"] is False
    assert [n["id"] for n in numa["nodes"]] == [0, 1, 2]
    assert [n["memory_only"] for n in numa["nodes"]] == [False, False, True]
    assert numa["access_matrix"]["columns"] == [0, 1, 2]
    assert numa["access_matrix"]["rows"] == ["unpinned", 0, 1]


@pytest.mark.parametrize("job", ["numa_ft_serial", "numa_ft_parallel"])
def test_placement_and_first_touch_match_the_kernel(numavm, job):
    numa, t = run_of(numavm, job)
    chunks = t["chunks"]
    lo, hi = chunks[0]["lo"], chunks[-1]["hi"]
    a = alloc_of(numa, lo, hi)
    want: dict[str, int] = {}
    for c in chunks:
        for k, v in c["pages_per_node_after_compute"].items():
            want[k] = want.get(k, 0) + v
    assert by_node(a["pages_per_node"]) == by_node(want)
    # First touches: each chunk's pages by its initialiser (a growing block may carry up to
    # 63 pages across a chunk boundary; malloc's header page is main's).
    got = {int(x["tid"]): x["pages"] for x in a["first_touch_threads"]}
    for c in chunks:
        assert got.get(c["init_tid"], 0) >= c["pages"] - 64 - 1, (got, c["init_tid"])


def test_huge_pages_first_touched_on_their_nodes(numavm):
    """THP ("always" in the guest, MADV_HUGEPAGE here): each worker initialises its half of
    the array; every 2 MiB block is first-touched once, as one huge page, on the node of the
    worker that touched it, and the census still matches the kernel page by page."""
    numa, t = run_of(numavm, "numa_ft_thp")
    assert t["thp"] is True and t["huge_pages"] >= 4
    assert t["anon_huge_kb"] >= 2048 * (t["huge_pages"] - 1), t["anon_huge_kb"]
    chunks = t["chunks"]
    a = alloc_of(numa, chunks[0]["lo"], chunks[-1]["hi"])
    want: dict[str, int] = {}
    for c in chunks:
        for k, v in c["pages_per_node_after_compute"].items():
            want[k] = want.get(k, 0) + v
    assert by_node(a["pages_per_node"]) == by_node(want)
    huge = by_node(a["huge_pages_per_node"])
    assert sum(huge.values()) == numa["totals"]["huge_pages"] == t["huge_pages"], huge
    assert set(huge) == {"0", "1"}, huge


def test_serial_init_makes_the_far_worker_remote(numavm):
    numa, t = run_of(numavm, "numa_ft_serial")
    m = numa["access_matrix"]
    row1 = m["values"][m["rows"].index(1)]
    assert row1[m["columns"].index(0)] > 4 * row1[m["columns"].index(1)], m
    assert numa["totals"]["remote"] > 0
    assert any("parallel" in a["text"] for a in numa["advice"]), numa["advice"]


def test_parallel_init_is_mostly_local(numavm):
    numa, _ = run_of(numavm, "numa_ft_parallel")
    tot = numa["totals"]
    assert tot["local"] > 4 * tot["remote"], tot


def test_hydro_is_remote(numavm):
    numa, t = run_of(numavm, "numa_hydro")
    site = next(s for s in numa["sites"] if s["function"] == t["compute_site"])
    assert site["remote"] > 4 * site["local"], site


def test_policies_show_in_log_and_placement(numavm):
    numa, t = run_of(numavm, "numa_policy")
    whats = [e["what"] for e in numa["pinning_log"]]
    assert "mbind" in whats and "move_pages" in whats, whats
    modes = {e.get("mode") for e in numa["pinning_log"] if e["what"] == "mbind"}
    assert {"bind", "interleave"} <= {str(m).lower().removeprefix("mpol_") for m in modes}, modes
    for reg in t["regions"]:
        a = alloc_of(numa, reg["lo"], reg["hi"])
        assert by_node(a["pages_per_node"]) == by_node(reg["pages_per_node_at_end"]), reg["name"]


def test_memory_only_node_is_remote_from_the_other_socket(numavm):
    """Pages bound (and moved) to node 2, which has no CPU and is attached to node 1, read
    by a thread pinned on node 0: memory_only_remote, and the placement says node 2."""
    numa, t = run_of(numavm, "numa_memory_only")
    assert t["target"] == 2
    tot = numa["totals"]
    assert tot["memory_only_remote"] > 0 and tot["memory_only_local"] == 0, tot
    for reg in t["regions"]:
        a = alloc_of(numa, reg["lo"], reg["hi"])
        assert by_node(a["pages_per_node"]) == by_node(reg["pages_per_node_at_end"]), reg["name"]
    m = numa["access_matrix"]
    row0 = m["values"][m["rows"].index(0)]
    assert row0[m["columns"].index(2)] > 0


def test_pinning_log_and_threads(numavm):
    numa, t = run_of(numavm, "numa_pinning")
    th = {x["tid"]: x for x in numa["threads"]}
    roles = {x["role"]: x for x in t["thread_list"]}
    assert th[roles["unpinned"]["tid"]]["pinned"] is False
    assert th[roles["pinned"]["tid"]]["pinned"] is True
    rep = roles["repinned"]["tid"]
    calls = [e for e in numa["pinning_log"] if e["tid"] == rep and e["what"] == "sched_setaffinity"]
    assert len(calls) == 2, numa["pinning_log"]


def test_exact_counts_every_access(numavm):
    numa, t = run_of(numavm, "numa_ft_exact")
    assert numa["backend"] == "exact"
    m = t["compute_matrix"]
    remote_true = sum(v for r, row in m.items() for c, v in row.items() if r != c)
    local_true = sum(v for r, row in m.items() for c, v in row.items() if r == c)
    tot = numa["totals"]
    # Every element access of the compute loop is counted (plus a few others of the init).
    assert tot["remote"] >= remote_true
    assert tot["remote"] <= 1.05 * remote_true + 1000
    assert tot["local"] >= local_true


def test_real_program_sysbench_memory(numavm):
    res = numavm.ok("numa_sysbench")
    numa = report(res.job_dir)
    assert numa["samples"] > 0
    vals = numa["access_matrix"]["values"]
    assert len(vals) == 3 and all(len(r) == 3 for r in vals)
    assert all(v >= 0 for r in vals for v in r)
    assert numa["totals"]["first_touch"] + numa["totals"]["unpinned_first_touch"] > 0
    assert any(s["function"] for s in numa["sites"])
