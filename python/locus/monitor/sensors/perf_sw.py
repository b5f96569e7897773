"""Scheduler and memory software events counted by the kernel for the whole system, per CPU
(perf_event_open with pid -1, one event group per CPU).

System-wide events need perf_event_paranoid <= 0 or CAP_PERFMON (root has it); otherwise the
sensor is absent and says so. Each read of a CPU's group interrupts that CPU (an IPI, ~10 us
per CPU in a VM), so the sensor's highest rate shrinks as the CPU count grows: one read per
CPU costs at most ~1% of a core in total. The counts include the monitor's own wake-ups.
"""

from __future__ import annotations

import os

from locus.monitor import perfevent
from locus.monitor.sensors.base import EventInfo, PerfGroupSensor, event_id

# name: (config, unit, heading, description)
EVENTS = {
    "context-switches": (3, "switches/s", "cs", "context switches on this CPU"),
    "cpu-migrations": (4, "migrations/s", "migr", "tasks migrated to this CPU from another"),
    "page-faults": (2, "faults/s", "flt", "page faults taken on this CPU"),
    "major-faults": (6, "faults/s", "majf", "major page faults (I/O needed) on this CPU"),
    "minor-faults": (5, "faults/s", "minf", "minor page faults on this CPU"),
}


class PerfSoftware(PerfGroupSensor):
    name = "perf"
    description = "scheduler and fault software events per CPU (perf_event_open, system-wide)"
    order = 50
    rate = 100.0
    rate_reason = "each read interrupts the CPU it covers; at most ~1000 CPU reads per second"

    def probe(self) -> str:
        self._cpus = perfevent.online_cpus(self.root)
        try:
            fd = perfevent.open_counter(perfevent.PERF_TYPE_SOFTWARE, 3, self._cpus[0])
        except OSError as e:
            return perfevent.refusal(e, self.root)
        os.close(fd)
        return ""

    def available(self) -> list[EventInfo]:
        out = []
        for cpu in self._cpus:
            src = f"cpu{cpu}"
            for name, (_, unit, _, desc) in EVENTS.items():
                out.append(
                    EventInfo(
                        event_id(self.name, src, name), self.name, src, name, unit, "counter", desc
                    )
                )
        return out

    def heading(self, event: EventInfo) -> str:
        return EVENTS[event.event][2]

    def open(self) -> None:
        # Enabled events are CPU-major (available() order): one group per CPU, in order.
        by_cpu: dict[str, list[str]] = {}
        for e in self.enabled:
            by_cpu.setdefault(e.source, []).append(e.event)
        self.open_groups(
            perfevent.open_group(
                [(perfevent.PERF_TYPE_SOFTWARE, EVENTS[n][0], 0, 0) for n in names], int(src[3:])
            )
            for src, names in by_cpu.items()
        )

    def parse(self, raw: list) -> list:
        out: list = []
        for g, data in zip(self.groups, raw):
            out += g.parse(data)
        return out
