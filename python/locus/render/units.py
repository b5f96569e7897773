"""Numbers with units, chosen per magnitude (every printed number carries its unit)."""

from __future__ import annotations


def _sig3(x: float) -> str:
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def seconds(v: float | None) -> str:
    """3 significant digits, unit chosen per magnitude: 1.23 s, 45.6 ms, 789 µs, 12 ns."""
    if v is None:
        return "n/a"
    a = abs(v)
    sign = "-" if v < 0 else ""
    if a == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if a >= scale:
            return f"{sign}{_sig3(a / scale)} {unit}"
    return f"{sign}{a * 1e9:.0f} ns"


def count(v: int | float | None) -> str:
    if v is None:
        return "n/a"
    v = int(v)
    if abs(v) >= 1_000_000:
        return f"{v / 1e6:.1f} M"
    if abs(v) >= 100_000:
        return f"{v / 1e3:.0f} k"
    return f"{v}"


def percent(v: float | None) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 10:
        return f"{v:.0f} %"
    return f"{v:.1f} %"


def cost_error(lens: dict) -> str:
    """The relative standard error of a sampling lens's handler cost, measured on a share of
    the handlers (`overhead_rse`), as " (±12 %)"; nothing for runs without it."""
    rse = lens.get("overhead_rse")
    return f" (±{rse * 100:.0f} %)" if rse else ""


def threads(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} thr"


def nbytes(v: float | None) -> str:
    if v is None:
        return "n/a"
    for scale, u in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if v >= scale:
            return f"{v / scale:.1f} {u}"
    return f"{v:.0f} B"


def number(v: float | None) -> str:
    """A measurement in its own unit (given beside it): 3 significant digits, k/M/G."""
    if v is None:
        return "n/a"
    a = abs(v)
    for scale, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if a >= scale:
            return f"{'-' if v < 0 else ''}{_sig3(a / scale)}{suffix}"
    if a == 0:
        return "0"
    return f"{'-' if v < 0 else ''}{_sig3(a)}"


def fmt(v, unit: str) -> str:
    if unit == "B":
        return nbytes(v)
    if unit == "s":
        return seconds(v)
    if unit == "%":
        return percent(v)
    if unit == "n":
        return count(v)
    if unit == "thr":
        return threads(v)
    if unit == "num":
        return number(v)
    return "" if v is None else str(v)


def command_line(argv: list[str] | None, limit: int = 200) -> str:
    """A run's command, its words joined by spaces, shortened past `limit` characters to its
    leading words and "… (+N more arguments)" (a command given hundreds of file names)."""
    if not argv:
        return ""
    out = argv[0]
    for i, a in enumerate(argv[1:], 1):
        if len(out) + 1 + len(a) > limit:
            n = len(argv) - i
            return f"{out} … (+{n} more argument{'s' if n > 1 else ''})"
        out += " " + a
    return out
