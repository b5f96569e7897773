"""The `soft` backend of the comm lens on the free-running comm workloads (`--free`,
workloads/README.md): threads hammer their data for ~1 s with the configured fractions, no
turns. Only the robust parts of ComDetective's accuracy claims are asserted (the figures
against the exact oracle are bench/comm.py's): the point-to-point pattern (no
communication between threads of different pairs), the false-sharing fraction's extremes
(0.9 mostly false, 0.1 mostly true), and matrices a user can trust (symmetric, zero
diagonal)."""

from __future__ import annotations

import json

import pytest

from locus.selfcheck import data_totals as _on_data


def parse_truth(stderr: bytes) -> dict:
    lines = stderr.decode(errors="replace").splitlines()
    return next(json.loads(x) for x in reversed(lines) if x.startswith("{") and '"workload"' in x)


def _square_symmetric_zero_diagonal(m: list[list[float]]) -> None:
    n = len(m)
    assert all(len(r) == n for r in m)
    for i in range(n):
        assert m[i][i] == 0
        for j in range(n):
            assert m[i][j] == pytest.approx(m[j][i])
            assert m[i][j] >= 0


def _soft(locus, *argv: str) -> tuple[dict, dict]:
    """(lenses.comm of the report, the workload's truth) for a soft recording."""
    proc, run = locus.record(
        [locus.workload(argv[0]), *argv[1:], "--free", "--truth"],
        options=("--lens", "comm", "--backend", "soft"),
    )
    comm = locus.report(run, "--lens", "comm")["lenses"]["comm"]
    assert comm["backend"] == "soft"
    for by in ("thread", "core", "node"):
        for kind in ("all", "true", "false"):
            _square_symmetric_zero_diagonal(comm["matrices"][by][kind])
    return comm, parse_truth(proc.stderr)


def test_p2p_no_communication_across_pairs(locus):
    comm, truth = _soft(locus, "comm_p2p", "4")
    assert truth["mode"] == "free" and truth["expected"]["pattern"] == "pairs"
    idx = {t["tid"]: t["index"] for t in comm["threads"]}
    m = comm["matrices"]["thread"]["all"]
    tids = truth["tids"]
    assert all(t in idx for t in tids)
    cell = {(i, j): m[idx[tids[i]]][idx[tids[j]]] for i in range(4) for j in range(i + 1, 4)}
    inside = cell[(0, 1)] + cell[(2, 3)]
    outside = sum(v for k, v in cell.items() if k not in ((0, 1), (2, 3)))
    assert inside > 0, cell
    assert outside <= 0.1 * inside, cell


@pytest.mark.parametrize("fraction,mostly", [(0.9, "false"), (0.1, "true")])
def test_falseshare_fraction_extremes(locus, fraction, mostly):
    comm, truth = _soft(locus, "comm_falseshare", "2", "-", str(fraction))
    assert truth["expected"]["false_fraction"] == pytest.approx(fraction)
    d = _on_data(comm, truth)
    assert d["detections"] >= 30, d  # enough for a fraction (rse < 20 %)
    assert d[mostly] >= 0.7 * d["all"], d


def test_doctor_check_measures_the_comm_lens(locus):
    """`locus doctor --check` records the bundled false-sharing and point-to-point workloads
    with every sampling backend this machine has, and exact where built, and compares with
    their truth: here soft (and exact), within 5 points of the configured false fractions
    and nothing outside the pairs."""
    p = locus.run("doctor", "--check", "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["check"]
    soft = [r for r in rows if r["backend"] == "soft"]
    assert len(soft) == 3 and all(r["ok"] for r in rows), rows
    # The exact backend too, where the workloads were built with `locus cc`
    # (`make -C workloads exact`: the benchmarks do; `make build` does not).
    from locus import selfcheck

    built = selfcheck.exe("exact", "comm_falseshare").exists()
    assert ("exact" in {r["backend"] for r in rows}) == built, rows
    fs = [r for r in soft if r["check"].startswith("false sharing")]
    assert all(abs(r["measured"] - r["expected"]) <= 0.05 for r in fs)
