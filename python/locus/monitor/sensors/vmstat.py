"""/proc/vmstat: the kernel's memory-management counters, system-wide.

Every line is published as a counter (a rate per second). The `nr_*` lines are levels
(pages currently free, dirty, ...): their rate is how fast the level changes, negative when
it falls — e.g. `nr_free_pages` goes negative while memory is being allocated.
"""

from __future__ import annotations

from operator import itemgetter

from locus.monitor.sensors.base import EventInfo, ProcFile, Sensor, event_id

PATH = "/proc/vmstat"

DEFAULTS = (
    "numa_hit",
    "numa_miss",
    "numa_foreign",
    "numa_interleave",
    "numa_local",
    "numa_other",
    "pgfault",
    "pgmajfault",
    "pgmigrate_success",
    "pgmigrate_fail",
    "numa_pte_updates",
    "numa_hint_faults",
    "numa_hint_faults_local",
    "numa_pages_migrated",
    "pswpin",
    "pswpout",
    "pgpgin",
    "pgpgout",
)

# name: (unit, description, stat heading)
KNOWN = {
    "numa_hit": ("pages/s", "pages allocated on the node the allocation intended", "hit"),
    "numa_miss": (
        "pages/s",
        "pages allocated on this node although another node was intended (that node was full)",
        "miss",
    ),
    "numa_foreign": (
        "pages/s",
        "pages intended for this node but allocated on another one",
        "forgn",
    ),
    "numa_interleave": ("pages/s", "pages allocated by the interleave policy", "intlv"),
    "numa_local": ("pages/s", "pages allocated on the node of the allocating CPU", "local"),
    "numa_other": ("pages/s", "pages allocated on a node other than the CPU's", "other"),
    "pgfault": ("faults/s", "page faults, minor and major", "flt"),
    "pgmajfault": ("faults/s", "major page faults (the page had to be read from disk)", "majflt"),
    "pgmigrate_success": ("pages/s", "pages migrated between nodes or zones", "migr"),
    "pgmigrate_fail": ("pages/s", "page migrations that failed", "migrf"),
    "numa_pte_updates": (
        "pages/s",
        "page-table entries made inaccessible by automatic NUMA balancing (to sample accesses)",
        "pteup",
    ),
    "numa_huge_pte_updates": (
        "pages/s",
        "huge-page table entries made inaccessible by automatic NUMA balancing",
        "hpteup",
    ),
    "numa_hint_faults": ("faults/s", "NUMA-balancing hinting faults taken", "hint"),
    "numa_hint_faults_local": (
        "faults/s",
        "NUMA-balancing hinting faults on a page already on the faulting CPU's node",
        "hintl",
    ),
    "numa_pages_migrated": ("pages/s", "pages migrated by automatic NUMA balancing", "nmigr"),
    "pswpin": ("pages/s", "pages swapped in", "si"),
    "pswpout": ("pages/s", "pages swapped out", "so"),
    "pgpgin": ("kB/s", "data read from block devices (page-in)", "bi"),
    "pgpgout": ("kB/s", "data written to block devices (page-out)", "bo"),
    "pgfree": ("pages/s", "pages freed", "free"),
    "pgactivate": ("pages/s", "pages moved to an active LRU list", "act"),
    "pgdeactivate": ("pages/s", "pages moved to an inactive LRU list", "deact"),
    "pgrefill": ("pages/s", "pages scanned on the active lists to refill the inactive ones", ""),
    "pgsteal_kswapd": ("pages/s", "pages reclaimed by kswapd", ""),
    "pgsteal_direct": ("pages/s", "pages reclaimed directly by allocating tasks", ""),
    "pgscan_kswapd": ("pages/s", "pages scanned for reclaim by kswapd", ""),
    "pgscan_direct": ("pages/s", "pages scanned for reclaim by allocating tasks", ""),
    "pgrotated": ("pages/s", "pages moved to the tail of the inactive list after writeback", ""),
    "oom_kill": ("kills/s", "processes killed by the OOM killer", "oom"),
    "thp_fault_alloc": ("events/s", "transparent huge pages allocated at a page fault", ""),
    "thp_fault_fallback": (
        "events/s",
        "page faults that wanted a transparent huge page and got small pages",
        "",
    ),
    "thp_collapse_alloc": ("events/s", "huge pages collapsed by khugepaged", ""),
    "thp_split_page": ("events/s", "transparent huge pages split into small pages", ""),
    "compact_stall": ("events/s", "allocations that stalled for memory compaction", ""),
    "compact_success": ("events/s", "compactions that freed a high-order page", ""),
    "compact_fail": ("events/s", "compactions that failed", ""),
    "workingset_refault_anon": ("pages/s", "anonymous pages faulted back soon after reclaim", ""),
    "workingset_refault_file": ("pages/s", "file pages faulted back soon after reclaim", ""),
    "nr_free_pages": ("pages/s", "change of the number of free pages (level: rate of change)", ""),
    "nr_dirty": ("pages/s", "change of the number of dirty pages", ""),
    "nr_writeback": ("pages/s", "change of the number of pages under writeback", ""),
    "nr_anon_pages": ("pages/s", "change of the number of anonymous pages", ""),
    "nr_file_pages": ("pages/s", "change of the number of page-cache pages", ""),
    "nr_swapcached": ("pages/s", "change of the number of pages in the swap cache", ""),
}

KB_COUNTERS = ("nr_kernel_stack", "nr_shadow_call_stack")


def describe(name: str) -> tuple[str, str, str]:
    """(unit, description, heading) of any /proc/vmstat line, known or not."""
    if name in KNOWN:
        unit, desc, head = KNOWN[name]
        return unit, desc, head or name
    if name in KB_COUNTERS:
        return "kB/s", f"change of `{name}` (a level in kB)", name
    if name.startswith("nr_"):
        return "pages/s", f"change of the level `{name}` (pages; negative when it falls)", name
    if name.startswith(("pgalloc_", "pgsteal_", "pgscan_", "pgskip_", "pgdemote_", "pgpromote_")):
        return "pages/s", f"pages counted by `{name}`", name
    if name.startswith(("workingset_", "pgmigrate_", "pglazyfree", "pgreuse")):
        return "pages/s", f"pages counted by `{name}`", name
    return "events/s", f"kernel event counter `{name}`", name


class VmStat(Sensor):
    name = "vmstat"
    description = "system-wide memory-management counters (/proc/vmstat)"
    order = 10
    rate = 100.0
    rate_reason = "one read costs ~30 us (the kernel sums and prints ~190 counters)"

    def probe(self) -> str:
        data = ProcFile.read_once(self.path(PATH))
        self._names = [n.decode() for n in data.split()[0::2]]
        return "" if self._names else f"{PATH} is empty"

    def available(self) -> list[EventInfo]:
        out = []
        for n in self._names:
            unit, desc, _ = describe(n)
            out.append(
                EventInfo(event_id(self.name, "", n), self.name, "", n, unit, "counter", desc)
            )
        return out

    def defaults(self) -> list[str]:
        have = set(self._names)
        return [event_id(self.name, "", n) for n in DEFAULTS if n in have]

    def heading(self, event: EventInfo) -> str:
        return describe(event.event)[2]

    def open(self) -> None:
        self.file = ProcFile(self.path(PATH))
        self._index(self.file.read().split())

    def _index(self, tokens: list) -> None:
        pos = {tokens[i]: i + 1 for i in range(0, len(tokens) - 1, 2)}
        names = [e.event.encode() for e in self.enabled]
        idx = [pos[n] for n in names]
        # One C-level call picks every wanted value out of the token list.
        self._pick = itemgetter(*idx) if len(idx) > 1 else (lambda t, i=idx[0]: (t[i],))
        self._check = (idx[0] - 1, names[0])

    def fetch(self) -> bytes:
        return self.file.read()

    def parse(self, raw: bytes) -> list:
        tokens = raw.split()
        i, name = self._check
        if i >= len(tokens) or tokens[i] != name:
            self._index(tokens)  # the layout moved (never on a running kernel, but cheap)
        return list(map(int, self._pick(tokens)))

    def close(self) -> None:
        f = getattr(self, "file", None)
        if f is not None:
            f.close()
