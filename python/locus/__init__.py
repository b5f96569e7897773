"""locus: why a multithreaded or MPI program does not scale."""

__version__ = "0.1.0"
FORMAT_VERSION = 2
