"""Per NUMA node: allocation counters (node*/numastat) and memory levels (node*/meminfo).

numastat's counters are cheap to read (~3 us per node) and are the NUMA signal worth
sampling fast. A node's meminfo costs ~10 us per read and holds levels that move slowly, so
it is re-read at most every `meminfo_period` seconds; in between, a sample repeats the last
value read (these are gauges: the value as last read, never an interpolation).
"""

from __future__ import annotations

import glob
import os
from operator import itemgetter

from locus.monitor.sensors.base import EventInfo, ProcFile, Sensor, event_id

NODE_DIR = "/sys/devices/system/node"

NUMASTAT = {
    "numa_hit": ("pages allocated on this node as intended", "hit"),
    "numa_miss": (
        "pages allocated on this node although another node was intended (it was full)",
        "miss",
    ),
    "numa_foreign": ("pages intended for this node but allocated on another one", "forgn"),
    "interleave_hit": ("interleave-policy pages allocated on this node as intended", "intlv"),
    "local_node": ("pages allocated on this node by a CPU of this node", "local"),
    "other_node": ("pages allocated on this node by a CPU of another node", "other"),
}
MEMINFO = {
    "MemTotal": ("memory of the node", "total"),
    "MemFree": ("free memory of the node", "free"),
    "MemUsed": ("used memory of the node (total - free)", "used"),
    "Active": ("memory on the node's active LRU lists", "act"),
    "Inactive": ("memory on the node's inactive LRU lists", "inact"),
    "Dirty": ("dirty page cache on the node, waiting for writeback", "dirty"),
    "FilePages": ("page cache on the node", "file"),
    "AnonPages": ("anonymous memory (heap, stacks) on the node", "anon"),
    "Shmem": ("shared memory and tmpfs on the node", "shmem"),
    "KernelStack": ("kernel stacks on the node", "kstack"),
    "PageTables": ("page tables on the node", "ptbl"),
    "Slab": ("kernel slab memory on the node", "slab"),
    "AnonHugePages": ("transparent huge pages backing anonymous memory on the node", "thp"),
    "HugePages_Total": ("huge pages reserved on the node (hugetlbfs pool)", "hptot"),
    "HugePages_Free": ("free huge pages of the node's pool", "hpfree"),
}
MEMINFO_DEFAULTS = ("MemFree", "MemUsed")


def node_dirs(root_dir: str) -> list[tuple[int, str]]:
    out = []
    for p in glob.glob(os.path.join(root_dir, "node[0-9]*")):
        tail = os.path.basename(p)[4:]
        if tail.isdigit():
            out.append((int(tail), p))
    return sorted(out)


class _Picker:
    """Values at fixed token positions of a file whose layout never changes while the
    kernel runs, checked by the name in front of the first one."""

    def __init__(self, file: ProcFile, names: list[bytes], index_of):
        self.file, self.names, self.index_of = file, names, index_of
        self.build(file.read().split())

    def build(self, tokens: list) -> None:
        pos = self.index_of(tokens)
        idx = [pos[n] for n in self.names]
        self.pick = itemgetter(*idx) if len(idx) > 1 else (lambda t, i=idx[0]: (t[i],))
        self.check = idx[0] - 1

    def parse(self, raw: bytes) -> list:
        tokens = raw.split()
        c = self.check
        if c >= len(tokens) or not tokens[c].startswith(self.names[0]):
            self.build(tokens)
        return list(map(int, self.pick(tokens)))


def numastat_index(tokens: list) -> dict:
    return {tokens[i]: i + 1 for i in range(0, len(tokens) - 1, 2)}


def meminfo_index(tokens: list) -> dict:
    out = {}
    for i in range(2, len(tokens) - 1):
        t = tokens[i]
        if t.endswith(b":") and tokens[i - 2] == b"Node":
            out[t[:-1]] = i + 1
    return out


class NumaStat(Sensor):
    name = "numastat"
    description = "per NUMA node: allocation counters (numastat) and memory levels (meminfo)"
    order = 20
    rate = 1000.0
    rate_reason = "numastat costs ~3 us per node; meminfo is re-read at most every 10 ms"
    meminfo_period = 0.01

    def probe(self) -> str:
        self._nodes = node_dirs(self.path(NODE_DIR))
        if not self._nodes:
            return f"no {NODE_DIR}/node*: the kernel has no NUMA support (CONFIG_NUMA)"
        self._stat_names: dict[int, list[str]] = {}
        self._mem_names: dict[int, list[str]] = {}
        for nid, d in self._nodes:
            f = ProcFile(os.path.join(d, "numastat"))
            try:
                self._stat_names[nid] = [n.decode() for n in f.read().split()[0::2]]
            finally:
                f.close()
            try:
                f = ProcFile(os.path.join(d, "meminfo"))
            except OSError:
                self._mem_names[nid] = []
                continue
            try:
                idx = meminfo_index(f.read().split())
            finally:
                f.close()
            self._mem_names[nid] = [n.decode() for n in sorted(idx, key=idx.get)]
        return ""

    def available(self) -> list[EventInfo]:
        out = []
        for nid, _ in self._nodes:
            src = f"node{nid}"
            for n in self._stat_names[nid]:
                desc = NUMASTAT.get(n, (f"node allocation counter `{n}`", n))[0]
                out.append(
                    EventInfo(
                        event_id(self.name, src, n), self.name, src, n, "pages/s", "counter", desc
                    )
                )
            for n in self._mem_names[nid]:
                desc = MEMINFO.get(n, (f"node memory level `{n}`", n))[0]
                unit = "pages" if n.startswith("HugePages_") else "kB"
                out.append(
                    EventInfo(event_id(self.name, src, n), self.name, src, n, unit, "gauge", desc)
                )
        return out

    def defaults(self) -> list[str]:
        return [e.id for e in self.events() if e.kind == "counter" or e.event in MEMINFO_DEFAULTS]

    def heading(self, event: EventInfo) -> str:
        table = NUMASTAT if event.kind == "counter" else MEMINFO
        return table.get(event.event, ("", event.event))[1]

    def open(self) -> None:
        dirs = dict(self._nodes)
        self._stat: list[_Picker] = []
        self._mem: list[_Picker] = []
        # The enabled events of a sensor are in available() order: per node, numastat
        # first, then meminfo, so the readers below concatenate in that same order.
        for nid, _ in self._nodes:
            src = f"node{nid}"
            stat = [
                e.event.encode() for e in self.enabled if e.source == src and e.kind == "counter"
            ]
            mem = [e.event.encode() for e in self.enabled if e.source == src and e.kind == "gauge"]
            if stat:
                f = ProcFile(os.path.join(dirs[nid], "numastat"))
                self._stat.append(_Picker(f, stat, numastat_index))
            else:
                self._stat.append(None)
            if mem:
                f = ProcFile(os.path.join(dirs[nid], "meminfo"))
                self._mem.append(_Picker(f, mem, meminfo_index))
            else:
                self._mem.append(None)
        self._mem_values: list[list] = [[] for _ in self._nodes]
        self._mem_t = -1.0

    def fetch(self) -> tuple:
        """(numastat bytes per node, meminfo bytes per node, or None when not re-read)."""
        stat = [s.file.read() if s is not None else None for s in self._stat]
        if self._mem_t >= 0 and self.now - self._mem_t < self.meminfo_period:
            return stat, None
        self._mem_t = self.now
        return stat, [m.file.read() if m is not None else None for m in self._mem]

    def parse(self, raw: tuple) -> list:
        stat_raw, mem_raw = raw
        out: list = []
        for i, (s, m) in enumerate(zip(self._stat, self._mem)):
            if s is not None:
                out += s.parse(stat_raw[i])
            if m is not None:
                if mem_raw is not None:
                    self._mem_values[i] = m.parse(mem_raw[i])
                out += self._mem_values[i]
        return out

    def close(self) -> None:
        for p in getattr(self, "_stat", []) + getattr(self, "_mem", []):
            if p is not None:
                p.file.close()
