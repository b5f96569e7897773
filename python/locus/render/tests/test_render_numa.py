"""The numa lens's PNG heat maps: a small cell is told from an empty one."""

from __future__ import annotations

import pytest

from locus.render import numa as rn


def test_plot_small_cell_is_blue_and_not_zero_percent(monkeypatch, tmp_path):
    """3 samples beside 997: the cell was drawn nearly white and labelled "0%", as an empty
    one was."""
    pytest.importorskip("matplotlib")
    m = {"rows": ["unpinned", 0, 1], "columns": [0, 1], "values": [[0, 0], [997, 3], [0, 0]]}
    report = {
        "run": {"command": ["./prog"]},
        "lenses": {"numa": {"access_matrix": m, "cpu_matrix": m, "unit": "samples",
                            "emulated": False}},
    }  # fmt: skip
    figs = []
    monkeypatch.setattr(rn, "save", lambda plt, fig, outdir, stem: figs.append(fig) or [])
    rn.plot(report, str(tmp_path))
    ax = figs[0].axes[0]
    im = ax.images[0]
    rgba = im.to_rgba(im.get_array())
    assert tuple(rgba[0][0][:3]) == (1.0, 1.0, 1.0)  # empty: white
    assert min(rgba[1][1][:3]) < 0.85  # 3 of 1000: a visible blue
    labels = {
        (round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts
    }
    assert labels[(1, 1)] == "<1%" and labels[(1, 0)] == "100%" and labels[(0, 0)] == "0%"
