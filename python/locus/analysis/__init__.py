"""Analyses, one module per lens. LENSES is the one table that knows them."""

from locus.analysis import comm, locks, monitor, numa

LENSES = {
    "locks": locks.analyze,
    "comm": comm.analyze,
    "numa": numa.analyze,
    "monitor": monitor.analyze,
}
