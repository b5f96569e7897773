"""The comm lens's node matrix on real NUMA nodes (the 2-node guest: CPU 0 on node 0, CPU 1
on node 1). comm_falseshare's two workers, bound one per node (`--bind scatter`), exchange
every line they share across the nodes: the node matrix holds the whole volume off its
diagonal, the core matrix between CPUs 0 and 1, and the report's CPU-to-node map is the
guest's. Soft sampling, and the exact backend (every transfer counted, with the CPUs of
both ends). Recorded in the guest, reported on the host."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCUS = REPO / ".venv" / "bin" / "locus"
WL = REPO / "workloads" / "build"


def rec(backend: str, prog: str) -> str:
    return (
        f"{LOCUS} record -o $JOB_DIR/run --lens comm --backend {backend} --bind scatter -- "
        f"{prog} 2> $JOB_DIR/err.txt"
    )


VM_JOBS = {
    "comm_nodes_soft": rec("soft", f"{WL}/comm_falseshare 2 - 0.9 --free"),
    "comm_nodes_exact": rec("exact", "$VM_SHARED/comm_exact/comm_falseshare 2 2000 0.9"),
}


def vm_prepare(shared: Path) -> None:
    """comm_falseshare built by `locus cc` for the exact backend, on the host."""
    out = shared / "comm_exact"
    out.mkdir(exist_ok=True)
    cmd = [str(LOCUS), "cc", "-O2", "-g", "-std=c11", "-D_GNU_SOURCE", "-pthread"]
    cmd += ["-o", str(out / "comm_falseshare"), str(REPO / "workloads" / "comm_falseshare.c")]
    subprocess.run(cmd, check=True)


def report(job_dir: Path) -> dict:
    r = subprocess.run(
        [str(LOCUS), "report", str(job_dir / "run"), "--lens", "comm", "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["lenses"]["comm"]


@pytest.mark.parametrize("job", ["comm_nodes_soft", "comm_nodes_exact"])
def test_node_matrix_across_real_nodes(numavm, job):
    c = report(numavm.ok(job).job_dir)
    assert c["cpu_node"][:2] == [0, 1], c["cpu_node"]
    total = c["totals"]["all"]
    assert total > 0, c["counters"]
    node = c["matrices"]["node"]["all"]
    assert node[0][0] == node[1][1] == 0 and node[0][1] == pytest.approx(node[1][0])
    # Symmetrised (M + Mt): each cell holds the pair's whole volume, both directions.
    assert node[0][1] >= 0.9 * total, (node, total)
    core = c["matrices"]["core"]["all"]
    assert core[0][1] >= 0.9 * total, (core, total)
    # The workers' thread cell carries the same volume as the node cell.
    th = c["matrices"]["thread"]["all"]
    assert max(max(r) for r in th) == pytest.approx(node[0][1], rel=0.1)
