"""The comm lens's renderers on hand-made reports: the grouped heat map, the volume a CPU or
node map cannot show, and the PNG heat maps' colours."""

from __future__ import annotations

import pytest

from locus.render import comm as rc
from locus.render.comm import MAX_CELLS, aggregate, heatmap_lines
from locus.report import Filters, build
from locus.rundir import RunDir
from locus.synth_comm import SynthCommRun


def _sym(n: int, pairs: dict[tuple[int, int], float]) -> list[list[float]]:
    """An n x n matrix as the analysis gives it: a pair's volume at [a][b] and [b][a]."""
    m = [[0.0] * n for _ in range(n)]
    for (a, b), v in pairs.items():
        m[a][b] = m[b][a] = v
    return m


def _report(by: str, m: list[list[float]], total: float, unit: str = "lines", notes=()) -> dict:
    zero = [[0.0] * len(m) for _ in m]
    mats = {k: {"all": zero, "true": zero, "false": zero} for k in ("thread", "core", "node")}
    mats[by] = {"all": m, "true": zero, "false": m}
    return {
        "run": {"command": ["./prog"], "duration_s": 1.0},
        "lenses": {
            "comm": {
                "view": {"by": by, "kind": "all"},
                "unit": unit,
                "matrices": mats,
                "totals": {"all": total, "true": 0.0, "false": total},
                "threads": [],
                "notes": list(notes),
            }
        },
    }


# -- grouped cells ---------------------------------------------------------------------------


def test_grouped_diagonal_cell_counts_each_pair_once():
    """40 indices, 2 per cell: a pair inside a group was counted twice on the diagonal (the
    whole block summed [a][b] and [b][a]), a pair across groups once."""
    n = 40
    m, blocks = aggregate(_sym(n, {(2, 3): 5.0, (0, 39): 7.0, (4, 6): 1.0}))
    assert len(blocks) == 20 and blocks[1] == (2, 4)
    assert m[1][1] == 5.0  # pair (2, 3), inside group 1: once (was 10)
    assert m[0][19] == m[19][0] == 7.0  # across groups: once, as before
    assert m[2][3] == m[3][2] == 1.0
    assert sum(map(sum, m)) - sum(m[i][i] for i in range(20)) == 2 * (7.0 + 1.0)
    # The matrix's own volume, each pair once: the diagonal plus the upper triangle.
    assert sum(m[i][j] for i in range(20) for j in range(i, 20)) == 13.0


def test_grouped_map_maximum_is_a_pairs_volume():
    """64 threads in pairs (2k, 2k+1), 2 threads per cell: every pair is a diagonal cell,
    and the legend's maximum was twice the largest pair's volume."""
    n = 64
    m = _sym(n, {(2 * k, 2 * k + 1): 10.0 + k for k in range(n // 2)})
    pic = heatmap_lines(_report("thread", m, sum(10.0 + k for k in range(n // 2))))
    assert "(2 threads per cell)" in pic[0]
    assert any("of max 41 lines" in ln for ln in pic), pic  # pair (62, 63): 41, not 82
    rows = [ln for ln in pic if ln[:5].strip().isdigit()]
    assert len(rows) == MAX_CELLS and all(r[6:].strip("·") for r in rows)  # a shaded cell each
    text = "\n".join(pic)
    assert "between the threads of groups i and j" in text and "each pair once" in text
    assert "symmetric (M + Mᵀ)" not in text


def test_ungrouped_map_keeps_its_legend():
    pic = heatmap_lines(_report("thread", _sym(4, {(0, 1): 3.0}), 3.0))
    assert "per cell" not in pic[0]
    assert any("symmetric (M + Mᵀ): row i, column j" in ln for ln in pic)


# -- volume within one CPU or node -----------------------------------------------------------


@pytest.mark.parametrize(("by", "axis"), [("core", "CPU"), ("node", "node")])
def test_map_says_what_was_exchanged_within_one_index(by, axis):
    """850 exchanged, 257 of it between two CPUs: the map showed "max 257" and nothing of
    the 593 exchanged between threads of one CPU."""
    pic = heatmap_lines(_report(by, _sym(2, {(0, 1): 257.0}), 850.0))
    (line,) = [ln for ln in pic if "not shown" in ln]
    assert f"593 lines of 850 lines (70 %) was exchanged within one {axis}" in line, line
    assert pic.index(line) > max(i for i, ln in enumerate(pic) if "max 257 lines" in ln)


def test_no_within_line_when_all_is_between():
    for by in ("core", "node", "thread"):
        pic = heatmap_lines(_report(by, _sym(2, {(0, 1): 850.0}), 850.0))
        assert not any("not shown" in ln for ln in pic), pic


def test_within_line_from_a_recorded_run(tmp_path):
    """Through the analysis: 3 transfers between CPUs 0 and 1, 7 between two threads on CPU
    1 (exact: lines), and 2 without a recorded CPU (the analysis's note names them)."""
    run = SynthCommRun(backend="exact", cpus=2)
    p = run.proc(pid=10)
    for i in range(3):
        p.thread(10 + i, 0.0, 1.0)
    c = run.comm(p)
    c.event(src=10, dst=11, line=0x601000, src_cpu=0, dst_cpu=1, count=3)
    c.event(src=11, dst=12, line=0x602000, src_cpu=1, dst_cpu=1, count=7)
    path = run.write(str(tmp_path / "r"))
    rep = build(RunDir.open(path), ["comm"], Filters(by="core"))
    line = [ln for ln in heatmap_lines(rep) if "not shown" in ln]
    assert line == ["      not shown: 7 lines of 10 lines (70 %) was exchanged within one CPU"]

    c.event(src=10, dst=12, line=0x603000, count=2)  # no CPU
    path = run.write(str(tmp_path / "r2"))
    rep = build(RunDir.open(path), ["comm"], Filters(by="core"))
    (line,) = [ln for ln in heatmap_lines(rep) if "not shown" in ln]
    assert "9 lines of 12 lines" in line and "within one CPU or without a recorded CPU" in line


# -- PNG heat maps ---------------------------------------------------------------------------


def _figure(monkeypatch, report, tmp_path):
    """The figure rc.plot draws (not written)."""
    figs = []

    def keep(plt, fig, outdir, stem):
        figs.append(fig)
        return []

    monkeypatch.setattr(rc, "save", keep)
    rc.plot(report, str(tmp_path / "plots"))
    return figs[0]


def test_plot_small_cell_is_not_white(monkeypatch, tmp_path):
    """A cell of 60 beside one of 10,000: on a linear scale from white it was drawn
    (0.994, 0.994, 0.994), an empty cell white."""
    pytest.importorskip("matplotlib")
    m = _sym(3, {(0, 1): 10_000.0, (1, 2): 60.0})
    fig = _figure(monkeypatch, _report("thread", m, 10_060.0), tmp_path)
    im = fig.axes[0].images[0]
    zero, small, big = (im.to_rgba(im.get_array())[i][j][:3] for i, j in ((0, 2), (1, 2), (0, 1)))
    assert tuple(zero) == (1.0, 1.0, 1.0)  # an empty cell: white
    assert max(small) < 0.9  # visibly grey
    assert max(big) < 0.05  # the maximum: black
    assert len(fig.axes) == 4  # three panels and the colour bar
    assert "white: none" in fig.axes[3].get_ylabel()


def test_plot_without_volume_has_no_colour_bar(monkeypatch, tmp_path):
    """No volume at all: the colour bar went 0 to 1, a scale of nothing."""
    pytest.importorskip("matplotlib")
    fig = _figure(monkeypatch, _report("thread", _sym(2, {}), 0.0), tmp_path)
    assert len(fig.axes) == 3
    assert all("none" in [t.get_text() for t in ax.texts] for ax in fig.axes)


def test_plot_writes_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")
    paths = rc.plot(_report("core", _sym(2, {(0, 1): 5.0}), 9.0), str(tmp_path / "p"))
    assert [p.rsplit(".", 1)[1] for p in paths] == ["png", "svg"]
