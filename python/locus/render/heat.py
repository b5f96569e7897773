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
