"""Reader of a locus run directory (docs/format.md).

The numpy dtypes below mirror runtime/include/locus_format.h field for field; that header is
the contract and the itemsize asserts catch any drift. Every binary file is read whole with
np.fromfile: a missing or empty file reads as an empty array, records with kind 0 (unused
chunk tails) are dropped. The runtime extends its files in whole chunks, so even a killed
writer leaves whole records: RunDir.open refuses a run with a file that is not a whole
number of its records (cut, or partly copied), or without files meta.json says it has
(check_run_files, check_proc_files), rather than report what is left as the run.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from locus import FORMAT_VERSION
from locus.errors import LocusError
from locus.sampler import (  # noqa: F401 (the PROC_ flags are read from here too)
    PROC_EXECED,
    PROC_EXITED,
    PROC_FINISHED,
    PROC_FORKED,
    PROC_SANDBOXED,
    PROC_SIGNALED,
    image_no,
    process_of_run,
)

PROC_MAGIC = 0x31434F5355434F4C

CLOCK_TSC = 1
CLOCK_MONOTONIC = 2


THREAD_MAIN = 1
THREAD_ADOPTED = 2
THREAD_EXITED = 4
THREAD_JOINED = 8

LC_HEADER = 0xFFFF

PROC_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("format_version", "<u4"),
        ("pid", "<u4"),
        ("ppid", "<u4"),
        ("clock", "<u4"),
        ("tsc0", "<u8"),
        ("ns0", "<u8"),
        ("tsc1", "<u8"),
        ("ns1", "<u8"),
        ("start_ns", "<u8"),
        ("end_ns", "<u8"),
        ("exit_status", "<i4"),
        ("flags", "<u4"),
        ("self_ns", "<u8"),
        ("records", "<u8"),
        ("dropped", "<u8"),
        ("threads", "<u8"),
        ("fastpath_ns_per_call_x1000", "<u8"),
        ("untimed_calls", "<u8"),
        ("exec_ns", "<u8"),
        ("heap_dropped", "<u8"),
        ("sandbox_ns", "<u8"),
        ("reserved", "<u8", (13,)),
    ]
)

# Bounds no record of the runtime's exceeds (readers drop damaged rows by them): Linux's
# largest pid (pid_max at most 2^22), CPU number (NR_CPUS) and node number (MAX_NUMNODES).
PID_MAX, CPU_MAX, NODE_MAX = 1 << 22, 8192, 1024
THREAD_FLAGS = 15  # MAIN | ADOPTED | EXITED | JOINED
THREAD_DTYPE = np.dtype(
    [
        ("tid", "<u4"),
        ("serial", "<u4"),
        ("parent_tid", "<u4"),
        ("flags", "<u4"),
        ("start", "<u8"),
        ("end", "<u8"),
        ("start_routine", "<u8"),
        ("self_ticks", "<u8"),
        ("records", "<u8"),
        ("dropped", "<u8"),
    ]
)

LOCK_EVENT_DTYPE = np.dtype(
    [
        ("lock", "<u8"),
        ("site", "<u8"),
        ("obj", "<u8"),
        ("t_req", "<u8"),
        ("t_acq", "<u8"),
        ("t_rel", "<u8"),
        ("tid", "<u4"),
        ("weight", "<u4"),
        ("stack", "<u4"),
        ("kind", "<u2"),
        ("flags", "<u2"),
    ]
)

LOCK_COUNT_DTYPE = np.dtype(
    [
        ("lock", "<u8"),
        ("site", "<u8"),
        ("acquisitions", "<u8"),
        ("contended", "<u8"),
        ("failed", "<u8"),
        ("timed", "<u8"),
        ("tid", "<u4"),
        ("serial", "<u4"),
        ("reserved", "<u4"),
        ("kind", "<u2"),
        ("flags", "<u2"),
    ]
)

LOCK_OBJECT_DTYPE = np.dtype(
    [
        ("lock", "<u8"),
        ("site", "<u8"),
        ("t", "<u8"),
        ("attr", "<u8"),
        ("reserved", "<u8", (2,)),
        ("tid", "<u4"),
        ("stack", "<u4"),
        ("kind", "<u2"),
        ("flags", "<u2"),
        ("pad", "<u4"),
    ]
)

STACK_DEPTH = 30
STACK_DTYPE = np.dtype(
    [
        ("id", "<u4"),
        ("depth", "<u4"),
        ("pc", "<u8", (STACK_DEPTH,)),
        ("reserved", "<u8"),
    ]
)

SCHED_DTYPE = np.dtype(
    [
        ("t_ns", "<u8"),
        ("service_ns", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("reserved", "<u4", (2,)),
    ]
)

# comm lens (struct locus_comm_sample, _event, _thread, struct locus_alloc)
COMM_SAMPLE_DTYPE = np.dtype(
    [
        ("t", "<u8"),
        ("addr", "<u8"),
        ("ip", "<u8"),
        ("node", "<i4"),
        ("periods", "<u4"),
        ("caller", "<u8"),
        ("tid", "<u4"),
        ("cpu", "<i4"),
        ("flags", "<u4"),
        ("len", "<u2"),
        ("kind", "<u2"),
        ("thin", "<u4"),  # the record stands for `thin` samples (0, 1: every one written)
        ("pad", "<u4"),
    ]
)

_COMM_EVENT_HEAD = [
    ("t", "<u8"),
    ("line", "<u8"),
    ("src_ip", "<u8"),
    ("dst_ip", "<u8"),
    ("volume", "<f8"),
    ("src_tid", "<u4"),
    ("dst_tid", "<u4"),
    ("src_cpu", "<i2"),
    ("dst_cpu", "<i2"),
    ("src_off", "u1"),
    ("src_len", "u1"),
    ("dst_off", "u1"),
    ("dst_len", "u1"),
]
_COMM_EVENT_TAIL = [("flags", "<u2"), ("kind", "<u2"), ("dst_flags", "<u4")]
# Format version 2: the callers of the two instructions (system libraries), 128 bytes.
COMM_EVENT_DTYPE = np.dtype(
    [
        *_COMM_EVENT_HEAD,
        ("src_caller", "<u8"),
        ("dst_caller", "<u8"),
        ("reserved", "<u8", (6,)),
        *_COMM_EVENT_TAIL,
    ]
)
# Format version 1 (runs of locus before 2026-11-28): 64 bytes, no callers.
COMM_EVENT_V1_DTYPE = np.dtype([*_COMM_EVENT_HEAD, *_COMM_EVENT_TAIL])

COMM_THREAD_DTYPE = np.dtype(
    [
        ("tid", "<u4"),
        ("backend", "<u4"),
        ("period_ns", "<u8"),
        ("signals", "<u8"),
        ("samples", "<u8"),
        ("skipped", "<u8"),
        ("undecoded", "<u8"),
        ("kernel", "<u8"),
        ("published", "<u8"),
        ("armed", "<u8"),
        ("traps", "<u8"),
        ("detections", "<u8"),
        ("dropped", "<u8"),
        ("self_ns", "<u8"),
        ("watchpoints", "<u4"),
        ("kind", "<u2"),
        ("flags", "<u2"),
        ("name", "S16"),
    ]
)

ALLOC_DTYPE = np.dtype(
    [
        ("t", "<u8"),
        ("addr", "<u8"),
        ("size", "<u8"),
        ("site", "<u8"),
        ("reserved", "<u8", (2,)),
        ("tid", "<u4"),
        ("stack", "<u4"),
        ("kind", "<u2"),
        ("flags", "<u2"),
        ("dev", "<u4"),
    ]
)

# enum locus_comm_backend, LOCUS_AC_*, LOCUS_CE_*, enum locus_alloc_kind
BK_NONE, BK_HW, BK_SOFT, BK_EXACT = 0, 1, 2, 3
AC_STORE, AC_SKID, AC_ATOMIC, AC_STACK = 1, 2, 4, 8
CE_TRUE, CE_TRAP, CE_EXACT, CE_LOADED, CE_PROCS, CE_GUESSED = 1, 2, 4, 8, 16, 32
AL_MALLOC, AL_FREE, AL_MMAP, AL_MUNMAP, AL_STACK, AL_FRAME, AL_TLS = 1, 2, 3, 4, 5, 6, 7
ALF_FILE = 1  # LOCUS_ALF_FILE: an mmap of a file (reserved = offset, inode; dev)
ALF_REMAP = 2  # LOCUS_ALF_REMAP: an mremap's new range (reserved[0] = the old address)
ALF_SHARED = 4  # LOCUS_ALF_SHARED: with ALF_FILE, mapped MAP_SHARED and writable
ALF_SYSV = 8  # LOCUS_ALF_SYSV: with ALF_SHARED, a System V segment (shmat)
ALF_NEW = 16  # LOCUS_ALF_NEW: a heap block made by C++ operator new
ALF_TIMED = 32  # LOCUS_ALF_TIMED: a frame recorded again when its call comes back to a depth

assert PROC_DTYPE.itemsize == 256
assert THREAD_DTYPE.itemsize == 64
assert LOCK_EVENT_DTYPE.itemsize == 64
assert LOCK_COUNT_DTYPE.itemsize == 64
assert LOCK_OBJECT_DTYPE.itemsize == 64
assert STACK_DTYPE.itemsize == 256
assert SCHED_DTYPE.itemsize == 32
# numa lens (struct locus_numa_touch, struct locus_numa_pin)
NUMA_TOUCH_DTYPE = np.dtype(
    [
        ("t", "<u8"),
        ("addr", "<u8"),
        ("ip", "<u8"),
        ("region", "<u8"),
        ("nodes", "<u8"),
        ("tid", "<u4"),
        ("pages", "<u4"),
        ("node", "<i2"),
        ("cpu", "<i2"),
        ("flags", "<u2"),
        ("kind", "<u2"),
        ("caller", "<u8"),
    ]
)

NUMA_PIN_DTYPE = np.dtype(
    [
        ("kind", "<u2"),
        ("what", "u1"),
        ("mode", "u1"),
        ("tid", "<u4"),
        ("caller", "<u4"),
        ("ncpus", "<u4"),
        ("t", "<u8"),
        ("nodes", "<u8"),
        ("ip", "<u8"),
        ("policy_nodes", "<u8"),
        ("addr", "<u8"),
        ("len", "<u8"),
    ]
)

NUMA_COUNT_DTYPE = np.dtype(
    [
        ("t", "<u8"),
        ("addr", "<u8"),
        ("ip", "<u8"),
        ("nodes", "<u8"),
        ("count", "<u8"),
        ("tid", "<u4"),
        ("node", "<i2"),
        ("flags", "<u2"),
        ("kind", "<u2"),
        ("pad16", "<u2"),
        ("pad32", "<u4"),
        ("reserved", "<u8"),
    ]
)

assert NUMA_COUNT_DTYPE.itemsize == 64
assert NUMA_TOUCH_DTYPE.itemsize == 64
assert NUMA_PIN_DTYPE.itemsize == 64
assert COMM_SAMPLE_DTYPE.itemsize == 64
assert COMM_EVENT_DTYPE.itemsize == 128 and COMM_EVENT_V1_DTYPE.itemsize == 64
assert COMM_THREAD_DTYPE.itemsize == 128
assert ALLOC_DTYPE.itemsize == 64
# The allocation hot path's small records (struct locus_heap, struct locus_free): heap.bin
# and frees.bin; allocs() returns them as ALLOC_DTYPE rows with the rest.
HEAP_DTYPE = np.dtype([("t", "<u8"), ("addr", "<u8"), ("size_tid", "<u8"), ("site", "<u8")])
FREE_DTYPE = np.dtype([("t", "<u8"), ("addr", "<u8")])
HEAP_SIZE_BITS = 40
HEAP_TID_MASK = (1 << 22) - 1  # of size_tid >> HEAP_SIZE_BITS
HEAP_NEW = 1 << 63  # in size_tid: made by C++ operator new (ALF_NEW)
assert HEAP_DTYPE.itemsize == 32 and FREE_DTYPE.itemsize == 16


# The record files of a process directory (proc.bin apart) and of the run, by record type:
# RunDir.open checks that each is a whole number of its records.
PROC_RECORD_FILES = {
    "threads.bin": THREAD_DTYPE,
    "locks.events.bin": LOCK_EVENT_DTYPE,
    "locks.counts.bin": LOCK_COUNT_DTYPE,
    "locks.objects.bin": LOCK_OBJECT_DTYPE,
    "stacks.bin": STACK_DTYPE,
    "comm.samples.bin": COMM_SAMPLE_DTYPE,
    "comm.events.bin": COMM_EVENT_DTYPE,
    "comm.threads.bin": COMM_THREAD_DTYPE,
    "allocs.bin": ALLOC_DTYPE,
    "heap.bin": HEAP_DTYPE,
    "frees.bin": FREE_DTYPE,
    "numa.touch.bin": NUMA_TOUCH_DTYPE,
    "numa.pins.bin": NUMA_PIN_DTYPE,
    "numa.counts.bin": NUMA_COUNT_DTYPE,
}
RUN_RECORD_FILES = {"sched.bin": SCHED_DTYPE}


def read_records(path: str, dtype: np.dtype) -> np.ndarray:
    """All whole records of `path` (a missing file: none). A partial trailing record is not
    read; RunDir.open has refused a run with one (the runtime never leaves one)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return np.zeros(0, dtype=dtype)
    n = size // dtype.itemsize
    if n == 0:
        return np.zeros(0, dtype=dtype)
    try:
        return np.fromfile(path, dtype=dtype, count=n)
    except OSError as e:
        raise LocusError(f"cannot read {path}: {e.strerror or e}") from None


def damaged(run: str, what: str) -> LocusError:
    """The error of a run that lost part of its files (cut, partly copied, deleted)."""
    return LocusError(f"{run} is damaged: {what}; record it again")


def _whole(run: str, rel: str, dtype: np.dtype) -> None:
    """Refuses a file of `run` that is not a whole number of its records: the runtime
    extends its files in whole chunks (and the launcher sched.bin in whole rows), so a
    partial record is a cut file, whose records would read as a run with fewer."""
    try:
        size = os.stat(os.path.join(run, rel)).st_size
    except OSError:
        return
    if size % dtype.itemsize:
        raise damaged(
            run,
            f"{rel} is {size} bytes, not a whole number of {dtype.itemsize}-byte records "
            "(truncated or partly copied?)",
        )


def check_run_files(run: str, meta: dict) -> None:
    """meta.json's processes against procs/ (the launcher wrote their number at the end:
    entries are never removed, a daemon may add some), and the run's own record files."""
    listed = meta.get("processes")
    procs_dir = os.path.join(run, "procs")
    if isinstance(listed, int) and not isinstance(listed, bool) and listed > 0:
        if not os.path.isdir(procs_dir):
            raise damaged(
                run, f"procs/ is missing (meta.json lists {_count(listed, 'process', 'processes')})"
            )
        held = len(os.listdir(procs_dir))
        if held < listed:
            raise damaged(
                run,
                f"procs/ holds {held} of the {_count(listed, 'process', 'processes')} "
                "meta.json lists",
            )
    for name, dtype in RUN_RECORD_FILES.items():
        _whole(run, name, dtype)


def check_proc_files(run: str, name: str, h: np.void, meta: dict) -> None:
    """The record files of the process directory procs/NAME (its proc.bin header `h`)."""
    for fname, dtype in PROC_RECORD_FILES.items():
        if fname == "comm.events.bin" and int(h["format_version"]) < 2:
            dtype = COMM_EVENT_V1_DTYPE
        _whole(run, f"procs/{name}/{fname}", dtype)
    if not int(h["flags"]) & PROC_FINISHED:
        return  # killed: what it wrote is kept (docs/format.md)
    pdir = os.path.join(run, "procs", name)
    # A process that finished created threads.bin at its start, right after proc.bin.
    if not os.path.exists(os.path.join(pdir, "threads.bin")):
        raise damaged(run, f"procs/{name}/threads.bin is missing")
    # Every thread the runtime samples in writes its counters (at its first sample, then as
    # it goes, at its end and at exit): samples beside an empty counter file are a cut
    # file. In a run `locus record` wrote (its meta.json's `processes`; the synthetic runs
    # of locus.synth* write what a test needs).
    ct = os.path.join(pdir, "comm.threads.bin")
    if (
        isinstance(meta.get("processes"), int)
        and os.path.exists(ct)
        and os.path.getsize(ct) == 0
        and _has_record(os.path.join(pdir, "comm.samples.bin"), COMM_SAMPLE_DTYPE)
    ):
        raise damaged(
            run,
            f"procs/{name}/comm.threads.bin is empty though process {name} took samples "
            "(its threads' counters are lost)",
        )


def _has_record(path: str, dtype: np.dtype) -> bool:
    """Whether the file's first chunk holds a used record (the first thread to write claims
    offset 0 and writes its first record there at once)."""
    try:
        with open(path, "rb") as f:
            data = f.read(4096 // dtype.itemsize * dtype.itemsize)
    except OSError:
        return False
    a = np.frombuffer(data[: len(data) // dtype.itemsize * dtype.itemsize], dtype=dtype)
    return bool((a["kind"] != 0).any())


def start_unix(meta: dict) -> float | None:
    """Unix time the run started: meta.json `start_unix`, else its `start_time` (ISO 8601,
    to the second: the start was in the second after it)."""
    t = meta.get("start_unix")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
        return float(t)
    st = meta.get("start_time")
    if isinstance(st, str):
        try:
            return datetime.datetime.fromisoformat(st).timestamp() + 1.0
        except (ValueError, OverflowError, OSError):
            return None
    return None


def _count(n: int, one: str, many: str = "") -> str:
    """'1 process', '3 processes'."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def _pids(procs: list) -> str:
    """'process 12', 'processes 12, 15, ...'."""
    pids = ", ".join(str(p.pid) for p in procs[:5]) + (", ..." if len(procs) > 5 else "")
    return f"process {pids}" if len(procs) == 1 else f"processes {pids}"


def read_text(path: str) -> str:
    """A text file of the run, "" when it cannot be read. Bytes that are not UTF-8 (a file
    name in Latin-1, in maps) are kept as the file system's own decoding keeps them, so that
    the path opens again (with "replace", a program named so was never symbolized)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""


@dataclass
class Proc:
    """One process image: procs/<pid> or procs/<pid>.<k> (an image after exec)."""

    key: str
    path: str
    hdr: np.void
    origin_ns: int
    threads: np.ndarray = field(repr=False)
    thread_start_s: np.ndarray = field(repr=False)
    thread_end_s: np.ndarray = field(repr=False)
    start_s: float = 0.0
    end_s: float | None = None
    # ns per tick of a sibling's TSC calibration, for a process killed before its own was
    # taken (RunDir.open sets it; the TSC is one clock machine-wide).
    fallback_rate: float | None = None
    # Unix time the run started (meta.json), and the run's {path: note} of the executables
    # and libraries that changed since (rebuilt): symbolize.for_proc fills it as it names
    # code and data in them (RunDir.open shares one dict between the processes).
    start_unix: float | None = field(default=None, repr=False)
    changed_files: dict | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return int(self.hdr["pid"])

    @property
    def ppid(self) -> int:
        return int(self.hdr["ppid"])

    @property
    def flags(self) -> int:
        return int(self.hdr["flags"])

    @property
    def complete(self) -> bool:
        return bool(self.flags & PROC_FINISHED)

    def seconds(self, ticks: np.ndarray) -> np.ndarray:
        """Raw ticks of this process's clock as float seconds since the run origin."""
        h = self.hdr
        t = np.asarray(ticks, dtype=np.uint64)
        off = (int(h["ns0"]) - self.origin_ns) / 1e9
        if int(h["clock"]) == CLOCK_TSC:
            dtsc = int(h["tsc1"]) - int(h["tsc0"])
            dns = int(h["ns1"]) - int(h["ns0"])
            if dtsc > 0 and dns > 0:
                rate = dns / dtsc / 1e9
            elif self.fallback_rate:
                rate = self.fallback_rate
            else:
                raise LocusError(f"{self.path}: proc.bin has no usable clock calibration")
            # Integer difference first: raw TSC values do not fit a float's mantissa.
            return (t.astype(np.int64) - np.int64(h["tsc0"])).astype(np.float64) * rate + off
        return (t.astype(np.int64) - np.int64(h["ns0"])).astype(np.float64) / 1e9 + off

    def ns_to_s(self, ns: int) -> float:
        return (int(ns) - self.origin_ns) / 1e9

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def records(self, name: str, dtype: np.dtype) -> np.ndarray:
        a = read_records(self.file(name), dtype)
        if "kind" in dtype.names:
            a = a[a["kind"] != 0]
        return a

    def lock_events(self) -> np.ndarray:
        return self.records("locks.events.bin", LOCK_EVENT_DTYPE)

    def lock_objects(self) -> np.ndarray:
        return self.records("locks.objects.bin", LOCK_OBJECT_DTYPE)

    def lock_counts(self) -> np.ndarray:
        """Count slots of the newest table of each thread, header records removed."""
        raw = read_records(self.file("locks.counts.bin"), LOCK_COUNT_DTYPE)
        if len(raw) == 0:
            return raw
        best: dict[int, tuple[int, int, int]] = {}
        for i in np.flatnonzero(raw["kind"] == LC_HEADER):
            serial, gen, n = int(raw["serial"][i]), int(raw["site"][i]), int(raw["lock"][i])
            if serial == 0 or n <= 1:
                continue
            if serial not in best or gen > best[serial][0]:
                best[serial] = (gen, int(i), n)
        # A table is one chunk: its header then n-1 slots, contiguous in the file.
        keep = np.zeros(len(raw), dtype=bool)
        for _gen, i, n in best.values():
            keep[i + 1 : i + n] = True
        keep &= (raw["kind"] != 0) & (raw["kind"] != LC_HEADER)
        return raw[keep]

    def comm_samples(self) -> np.ndarray:
        return self.records("comm.samples.bin", COMM_SAMPLE_DTYPE)

    def comm_events(self) -> np.ndarray:
        """The detections, as COMM_EVENT_DTYPE rows (a version 1 run's without callers)."""
        if int(self.hdr["format_version"]) >= 2:
            return self.records("comm.events.bin", COMM_EVENT_DTYPE)
        old = self.records("comm.events.bin", COMM_EVENT_V1_DTYPE)
        out = np.zeros(len(old), dtype=COMM_EVENT_DTYPE)
        for f in COMM_EVENT_V1_DTYPE.names:
            out[f] = old[f]
        return out

    def comm_threads(self) -> np.ndarray:
        return self.records("comm.threads.bin", COMM_THREAD_DTYPE)

    def allocs(self) -> np.ndarray:
        """Every allocation record as ALLOC_DTYPE rows: allocs.bin, plus heap.bin (kind
        MALLOC) and frees.bin (kind FREE), whose unused space has a 0 last word."""
        parts = [self.records("allocs.bin", ALLOC_DTYPE)]
        h = read_records(self.file("heap.bin"), HEAP_DTYPE)
        h = h[h["site"] != 0]
        if len(h):
            a = np.zeros(len(h), dtype=ALLOC_DTYPE)
            a["t"], a["addr"], a["site"] = h["t"], h["addr"], h["site"]
            a["size"] = h["size_tid"] & np.uint64((1 << HEAP_SIZE_BITS) - 1)
            tid = (h["size_tid"] >> np.uint64(HEAP_SIZE_BITS)) & np.uint64(HEAP_TID_MASK)
            a["tid"] = tid.astype(np.uint32)
            a["flags"] = np.where((h["size_tid"] & np.uint64(HEAP_NEW)) != 0, ALF_NEW, 0)
            a["kind"] = AL_MALLOC
            parts.append(a)
        f = read_records(self.file("frees.bin"), FREE_DTYPE)
        f = f[f["addr"] != 0]
        if len(f):
            a = np.zeros(len(f), dtype=ALLOC_DTYPE)
            a["t"], a["addr"], a["kind"] = f["t"], f["addr"], AL_FREE
            parts.append(a)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def stacks(self) -> np.ndarray:
        s = read_records(self.file("stacks.bin"), STACK_DTYPE)
        return s[s["id"] != 0]

    def maps_text(self) -> str:
        """The process's maps at start, at exit and before each dlclose (maps.dl): a library
        unloaded during the run is still found."""
        return "\n".join(read_text(self.file(f)) for f in ("maps", "maps.exit", "maps.dl"))

    def mapped_files(self) -> dict[tuple[int, int], str]:
        """(device, inode) -> path of the files the program mapped while the comm or numa
        lens recorded its mmaps (mapped_files.txt: "INODE DEV PATH" lines), read once."""
        cached = getattr(self, "_mapped_files", None)
        if cached is not None:
            return cached
        out: dict[tuple[int, int], str] = {}
        for ln in read_text(self.file("mapped_files.txt")).splitlines():
            ino, _, rest = ln.partition(" ")
            dev, _, path = rest.partition(" ")
            if ino.isdigit() and dev.isdigit() and path:
                out.setdefault((int(dev), int(ino)), path)
        self._mapped_files = out
        return out

    def mmapped_text(self) -> str:
        """The files the program mapped with mmap while the comm or numa lens recorded its
        mmaps (allocs.bin's ALF_FILE records; paths from mapped_files.txt), as maps lines: a
        file mapped and unmapped between the maps copies at start and exit is still found
        (a JIT's copy of its own code: each worker of node maps V8's builtins again, and
        unmaps them when it ends). Permissions are not recorded: shown as r-xp."""
        al = self.records("allocs.bin", ALLOC_DTYPE)
        if not len(al):
            return ""
        files = self.mapped_files()
        rows = al[(al["kind"] == AL_MMAP) & ((al["flags"] & ALF_FILE) != 0) & (al["size"] > 0)]
        out = []
        for addr, size, res, dev in zip(
            rows["addr"].tolist(),
            rows["size"].tolist(),
            rows["reserved"].tolist(),
            rows["dev"].tolist(),
        ):
            path = files.get((dev, res[1]))
            if path and path.startswith("/"):
                maj, mi = os.major(dev), os.minor(dev)
                out.append(
                    f"{addr:x}-{addr + size:x} r-xp {res[0]:x} {maj:02x}:{mi:02x} {res[1]} {path}"
                )
        return "\n".join(dict.fromkeys(out))

    def perf_map_text(self) -> str:
        """The JIT symbol map the process wrote (/tmp/perf-PID.map, copied at the run's
        end), or ""."""
        return read_text(self.file("perf.map"))


class RunDir:
    """An opened run directory: meta.json, the processes, the launcher's samples."""

    def __init__(self, path: str, meta: dict, procs: list[Proc], origin_ns: int):
        self.path = path
        self.meta = meta
        self.procs = procs
        self.origin_ns = origin_ns
        self._sched: np.ndarray | None = None
        # Process directories left out (no usable proc.bin: killed as it started): the run
        # is incomplete.
        self.left_out: list[str] = []
        # {path: note} of the files named in the maps that changed since the run (rebuilt),
        # found while naming code and data in them (symbolize.for_proc).
        self.changed_files: dict[str, str] = {}
        self.start_unix = start_unix(meta)
        for p in procs:
            p.start_unix = self.start_unix
            p.changed_files = self.changed_files

    @classmethod
    def open(cls, path: str) -> RunDir:
        meta_path = os.path.join(path, "meta.json")
        if not os.path.isdir(path) or not os.path.isfile(meta_path):
            raise LocusError(f"{path} is not a locus run directory (no meta.json)")
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise LocusError(f"{meta_path} cannot be parsed: {e}") from None
        if not isinstance(meta, dict):
            raise LocusError(f"{meta_path} cannot be parsed: not a JSON object")
        if not meta.keys() & {"format_version", "locus_version", "lenses"}:
            # Another tool's meta.json: "lens 'comm' was not recorded" said too little.
            raise LocusError(f"{path} is not a locus run directory (its meta.json is not locus's)")
        ver = meta.get("format_version", FORMAT_VERSION)
        if not isinstance(ver, int) or ver > FORMAT_VERSION:
            raise LocusError(
                f"{path} uses run format version {ver}, this locus reads up to version "
                f"{FORMAT_VERSION}: upgrade locus"
            )
        check_run_files(path, meta)
        hdrs = []
        left_out = []
        procs_dir = os.path.join(path, "procs")
        names = sorted(os.listdir(procs_dir)) if os.path.isdir(procs_dir) else []
        for name in names:
            pdir = os.path.join(procs_dir, name)
            if not os.path.isdir(pdir):
                continue
            pbin = os.path.join(pdir, "proc.bin")
            if not os.path.isfile(pbin):
                # The runtime creates proc.bin first, right after the directory: an empty
                # directory is a process killed as it started; beside other files, or in a
                # run the launcher found complete, proc.bin was lost.
                if os.listdir(pdir) or meta.get("complete") is True:
                    raise damaged(path, f"procs/{name} has no proc.bin")
                print(
                    f"locus: warning: process {name} left no records (killed as it started?): "
                    "it is left out",
                    file=sys.stderr,
                )
                left_out.append(name)
                continue
            raw = read_records(pbin, PROC_DTYPE)
            if len(raw) != 1 or int(raw[0]["magic"]) != PROC_MAGIC:
                # One process's damage (a full disk, a kill at its first instruction) does
                # not take the others' records with it.
                print(
                    f"locus: warning: {pbin} is damaged (bad magic or size): process {name} "
                    "is left out",
                    file=sys.stderr,
                )
                left_out.append(name)
                continue
            h = raw[0]
            if int(h["format_version"]) > FORMAT_VERSION:
                raise LocusError(
                    f"{pbin} uses run format version {int(h['format_version'])}, this locus "
                    f"reads up to version {FORMAT_VERSION}: upgrade locus"
                )
            check_proc_files(path, name, h, meta)
            hdrs.append((name, pdir, h))
        origin = meta.get("start_ns")
        if not isinstance(origin, int) or origin <= 0:
            starts = [int(h["start_ns"]) for _, _, h in hdrs if int(h["start_ns"])]
            origin = min(starts) if starts else 0
        rates = [
            (int(h["ns1"]) - int(h["ns0"])) / (int(h["tsc1"]) - int(h["tsc0"])) / 1e9
            for _, _, h in hdrs
            if int(h["clock"]) == CLOCK_TSC
            and int(h["tsc1"]) > int(h["tsc0"])
            and int(h["ns1"]) > int(h["ns0"])
        ]
        rate = float(np.median(rates)) if rates else None
        procs = [_load_proc(name, pdir, h, origin, rate) for name, pdir, h in hdrs]
        procs.sort(key=lambda p: (p.start_s, p.pid, p.key))
        run = cls(path, meta, procs, origin)
        run.left_out = left_out
        return run

    # ---- meta ----

    @property
    def lenses(self) -> list[str]:
        lenses = self.meta.get("lenses")
        if isinstance(lenses, list) and lenses:
            return [str(x) for x in lenses]
        # A launcher killed before writing lenses: infer from the files present.
        found = []
        for lens, files in (
            ("locks", ("locks.events.bin", "locks.counts.bin")),
            ("comm", ("comm.events.bin", "comm.threads.bin")),
            ("numa", ("numa.touch.bin", "numa.pins.bin")),
        ):
            if any(os.path.exists(p.file(f)) for p in self.procs for f in files):
                found.append(lens)
        return found

    @property
    def duration_s(self) -> float:
        d = self.meta.get("duration_s")
        if isinstance(d, (int, float)) and d > 0:
            return float(d)
        end = self.meta.get("end_ns")
        if isinstance(end, int) and end > self.origin_ns:
            return (end - self.origin_ns) / 1e9
        ends = [p.end_s for p in self.procs if p.end_s is not None]
        ends += [float(np.max(p.thread_end_s)) for p in self.procs if len(p.thread_end_s)]
        return max(ends) if ends else 0.0

    @property
    def complete(self) -> bool:
        """Every process finished its records (exit, exec, or the runtime's handler of a
        fatal signal) and none was left out. The launcher's `complete` is what it saw when
        the program exited: a process that outlived it (a daemon) and finished later is
        whole now. A launcher that never finished its meta.json (no end_ns) leaves the
        run incomplete."""
        if self.left_out or not all(p.complete for p in self.procs):
            return False
        if self.meta.get("complete") is True:
            return True
        return bool(self.procs) and isinstance(self.meta.get("end_ns"), int)

    def notes(self) -> list[str]:
        """What the report says of the run as a whole: processes that outlived the program
        (a daemon), or are still running as it is read."""
        out = []
        end = self.meta.get("end_ns")
        # A process is its last image: one that exec'd (`sh -c 'prog &'`) ended there.
        last: dict[int, Proc] = {}
        for p in self.procs:
            if p.pid not in last or image_no(p.key) > image_no(last[p.pid].key):
                last[p.pid] = p
        if isinstance(end, int) and end > 0:
            late = [
                p
                for p in last.values()
                if p.complete and not p.flags & PROC_EXECED and int(p.hdr["end_ns"]) > end
            ]
            if late:
                after = (max(int(p.hdr["end_ns"]) for p in late) - end) / 1e9
                one = len(late) == 1
                out.append(
                    f"{_pids(late)} outlived the program (a daemon?): "
                    f"{'it' if one else 'they'} finished {'its' if one else 'their'} records "
                    f"{after:.2f} s after the program exited, so they are whole; the run's "
                    "duration and scheduler samples end at the program's exit"
                )
        running = [p for p in last.values() if not p.complete and process_of_run(p.pid, self.path)]
        if running:
            one = len(running) == 1
            out.append(
                f"{_pids(running)} {'is' if one else 'are'} still running (a daemon?): "
                f"{'its' if one else 'their'} records are not finished; report again when "
                f"{'it has' if one else 'they have'} ended"
            )
        return out

    @property
    def host(self) -> dict:
        h = self.meta.get("host")
        return h if isinstance(h, dict) else {}

    @property
    def cpus(self) -> int | None:
        c = self.host.get("cpus")
        return int(c) if isinstance(c, int) and 0 < c <= CPU_MAX else None

    def sched(self) -> np.ndarray:
        """Launcher samples with a float `t` column (seconds since the run origin)."""
        if self._sched is None:
            s = read_records(os.path.join(self.path, "sched.bin"), SCHED_DTYPE)
            self._sched = s[s["t_ns"] != 0]
        return self._sched

    def sched_seconds(self, t_ns: np.ndarray) -> np.ndarray:
        return (np.asarray(t_ns).astype(np.int64) - np.int64(self.origin_ns)) / 1e9


def _load_proc(name: str, pdir: str, h: np.void, origin: int, rate: float | None) -> Proc:
    threads = read_records(os.path.join(pdir, "threads.bin"), THREAD_DTYPE)
    # A slot pthread_create reserved for a thread that never ran (the create failed, or the
    # process ended first) has no tid. Slot i holds serial i + 1 (runtime/core/thread.c): a
    # row that does not, or has a tid no pid can be, or unknown flags, is damage.
    slot = np.arange(1, len(threads) + 1, dtype=np.uint64)
    threads = threads[
        (threads["serial"] != 0)
        & (threads["tid"] != 0)
        & (threads["serial"].astype(np.uint64) == slot)
        & (threads["tid"] <= PID_MAX)
        & ((threads["flags"] & ~np.uint32(THREAD_FLAGS)) == 0)
    ]
    threads = threads[np.argsort(threads["serial"], kind="stable")]
    p = Proc(
        key=name,
        path=pdir,
        hdr=h,
        origin_ns=origin,
        threads=threads,
        thread_start_s=np.zeros(0),
        thread_end_s=np.zeros(0),
        fallback_rate=rate,
    )
    p.start_s = p.ns_to_s(int(h["start_ns"])) if int(h["start_ns"]) else 0.0
    # Killed after a seccomp filter: its records (and what is known of it) end at the filter.
    end_ns = int(h["end_ns"]) or int(h["exec_ns"]) or int(h["sandbox_ns"])
    p.end_s = p.ns_to_s(end_ns) if end_ns else None
    if len(threads):
        p.thread_start_s = p.seconds(threads["start"])
        end = p.seconds(threads["end"])
        # A thread that never exited cleanly ends with its process (NaN: unknown yet).
        end[threads["end"] == 0] = np.nan if p.end_s is None else p.end_s
        p.thread_end_s = end
    return p
