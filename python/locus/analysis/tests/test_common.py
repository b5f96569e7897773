"""Heap blocks over time: the block alive at an address."""

import numpy as np

from locus.analysis import common
from locus.analysis.common import heap_blocks, live_blocks, thinning
from locus.rundir import (
    AL_FREE,
    AL_MMAP,
    AL_MUNMAP,
    ALF_FILE,
    ALF_REMAP,
    ALLOC_DTYPE,
    COMM_SAMPLE_DTYPE,
)

MIB = 1 << 20


def rows(*recs):
    a = np.zeros(len(recs), dtype=ALLOC_DTYPE)
    for i, (t, kind, addr, size, site, flags, off) in enumerate(recs):
        a[i]["t"], a[i]["kind"], a[i]["addr"], a[i]["size"] = t, kind, addr, size
        a[i]["site"], a[i]["flags"], a[i]["reserved"][0] = site, flags, off
    return a


def test_unmapping_the_front_of_a_mapping_keeps_the_rest():
    """munmap(p, SZ/2) of a file mapping ended the whole block (a partial munmap has the
    mapping's start address): false sharing in the second half read as unattributed."""
    p = 0x7F0000000000
    b, end = heap_blocks(
        rows(
            (10, AL_MMAP, p, 4 * MIB, 0x111, ALF_FILE, 0),
            (20, AL_MUNMAP, p, MIB, 0x222, 0, 0),  # the first MiB
            (30, AL_MUNMAP, p + MIB, MIB, 0x222, 0, 0),  # then the next
            (40, AL_MMAP, p, MIB, 0x333, 0, 0),  # a new mapping where the first was
        )
    )
    at = live_blocks(b, end, np.array([p + 3 * MIB, p + 64, p + MIB + 8, p + 3 * MIB]),
                     np.array([35, 45, 25, 15]))  # fmt: skip
    assert [int(b["site"][i]) for i in at] == [0x111, 0x333, 0x111, 0x111]
    rest = b[at[0]]
    assert int(rest["addr"]) == p + 2 * MIB and int(rest["reserved"][0]) == 2 * MIB
    # Unmapped memory belongs to nothing.
    assert live_blocks(b, end, np.array([p + 64]), np.array([35]))[0] == -1


def test_a_free_still_ends_its_block():
    p = 0x5000
    b, end = heap_blocks(rows((1, 1, p, 64, 0x1, 0, 0), (2, AL_FREE, p, 0, 0x2, 0, 0)))
    assert live_blocks(b, end, np.array([p + 8, p + 8]), np.array([1, 2])).tolist() == [0, -1]


def test_a_mapping_moved_by_mremap_keeps_its_object():
    """mremap(MREMAP_MAYMOVE) of a file mapping: the new range was no block at all (false
    sharing there read as unattributed); it is the old mapping's object, file included."""
    p, q = 0x7F0000000000, 0x7F1000000000
    b, end = heap_blocks(
        rows(
            (10, AL_MMAP, p, MIB, 0x111, ALF_FILE, 0),
            (20, AL_MUNMAP, p, MIB, 0x222, 0, 0),
            (21, AL_MMAP, q, 4 * MIB, 0x222, ALF_REMAP, p),  # reserved[0]: the old address
        )
    )
    at = live_blocks(b, end, np.array([q + 3 * MIB, p + 64]), np.array([30, 30]))
    assert at[1] == -1 and int(b["site"][at[0]]) == 0x111
    assert int(b["flags"][at[0]]) & ALF_FILE and int(b["reserved"][at[0]][0]) == 0


class _Proc:
    def __init__(self, d):
        self.d = d

    def file(self, name):
        return str(self.d / name)


class _Run:
    def __init__(self, dirs):
        self.procs = [_Proc(d) for d in dirs]


def _samples(path, thins, unused=0):
    s = np.zeros(len(thins) + unused, dtype=COMM_SAMPLE_DTYPE)
    s["kind"][: len(thins)] = 1
    s["thin"][: len(thins)] = thins
    s.tofile(path)


def test_thinning_counts_the_records_and_the_largest_rate(tmp_path, monkeypatch):
    """A run's thinning: None when every sample was written (thin 0 or 1), else the records
    the samples files hold (a whole chunk's unused tail not counted; every k-th record of a
    long file, scaled by k) and the largest 1-in-K."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _samples(a / "comm.samples.bin", [0] * 10, unused=6)
    _samples(b / "comm.samples.bin", [1] * 20)
    assert thinning(_Run([a, b]), 30) is None
    _samples(b / "comm.samples.bin", [1] * 100 + [2] * 100 + [4] * 100, unused=20)
    assert thinning(_Run([a, b]), 2000) == {"written": 310, "taken": 2000, "most": 4}
    monkeypatch.setattr(common, "THINNING_READ", 30)  # a long file: read every 10th record
    t = thinning(_Run([b]), 2000)
    assert t["most"] == 4 and abs(t["written"] - 300) <= 10, t
