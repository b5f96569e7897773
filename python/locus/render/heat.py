"""What the heat maps of every lens share: the terminal shading (a character per level of
the largest cell) with its legend, and matplotlib figures written as PNG and SVG."""

from __future__ import annotations

import os

from locus.errors import LocusError

SHADES = "·░▒▓█"


def shade(v: float, vmax: float) -> str:
    if v <= 0 or vmax <= 0:
        return SHADES[0]
    k = min(len(SHADES) - 1, 1 + int((len(SHADES) - 1) * v / vmax * 0.999999))
    return SHADES[k]


def shade_legend(top: str) -> list[str]:
    """The legend's entries: `· 0`, `░ ≤25%`, ..., and the darkest with `top` (what 100 % is)."""
    step = 100 // (len(SHADES) - 1)
    legend = [f"{SHADES[0]} 0"] + [f"{SHADES[k]} ≤{k * step}%" for k in range(1, len(SHADES) - 1)]
    legend.append(f"{SHADES[-1]} ≤100% of {top}")
    return legend


def pyplot(outdir: str):
    """matplotlib.pyplot (Agg) with `outdir` created, or a one-line error."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise LocusError("--plot needs the Python module 'matplotlib': run `make deps`") from None
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as e:
        raise LocusError(f"cannot create {outdir}: {e.strerror or e}") from None
    return plt


# The lightest shade a non-zero cell gets, as a fraction of the colour map: with a linear
# scale from white, a cell of 60 beside a maximum of 10,000 was as white as an empty one.
LOWEST_SHADE = 0.25
ZERO_COLOUR = "white"


def zero_apart(name: str):
    """The matplotlib colour map `name` from LOWEST_SHADE on, its masked cells (the zeros of
    `masked_zeros`) in ZERO_COLOUR: any non-zero cell is visibly darker than an empty one."""
    import matplotlib
    import numpy as np
    from matplotlib.colors import ListedColormap

    base = matplotlib.colormaps[name]
    cmap = ListedColormap(base(np.linspace(LOWEST_SHADE, 1.0, 256)), name=f"{name}_nonzero")
    return cmap.with_extremes(bad=ZERO_COLOUR)


def masked_zeros(m):
    """The matrix `m` (rows of numbers) as an array with its zero (and negative) cells
    masked: they are drawn in the colour map's `bad` colour (zero_apart: white)."""
    import numpy as np

    a = np.asarray(m, dtype=float)
    return np.ma.masked_where(~(a > 0), a)


def save(plt, fig, outdir: str, stem: str) -> list[str]:
    """Write `fig` as OUTDIR/STEM.png and .svg, close it; the paths."""
    paths = []
    for ext in ("png", "svg"):
        p = os.path.join(outdir, f"{stem}.{ext}")
        try:
            fig.savefig(p, dpi=120)
        except OSError as e:
            plt.close(fig)
            raise LocusError(f"cannot write {p}: {e.strerror or e}") from None
        paths.append(p)
    plt.close(fig)
    return paths
