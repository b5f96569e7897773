"""Hardware counters: the core PMU's generic events per CPU (cycles, instructions, cache and
branch misses) and uncore PMU events (memory controllers, interconnect) named in sysfs.

Present only where /sys/bus/event_source/devices has a hardware PMU and perf_event_open
accepts a system-wide event (perf_event_paranoid <= 0 or CAP_PERFMON). Many VMs have no
virtual PMU: there the sensor is absent and says so. Counts are scaled for multiplexing
(count x time enabled / time running) and by the event's sysfs .scale, as perf stat does.
"""

from __future__ import annotations

import os

from locus.monitor import perfevent
from locus.monitor.sensors.base import (
    EventInfo,
    PerfGroupSensor,
    event_id,
    parse_cpulist,
    read_text,
)

DEVICES = "/sys/bus/event_source/devices"
CORE_NAMES = ("cpu", "cpu_core", "cpu_atom")
CORE_PREFIXES = ("armv8_", "armv7_", "arm_cortex")
UNCORE_PREFIXES = ("uncore_", "amd_df", "amd_l3", "arm_cmn", "arm_dsu", "hisi_", "arm_ccn")
# PERF_TYPE_HARDWARE configs: name -> (config, unit, heading, description)
GENERIC = {
    "cycles": (0, "cycles/s", "cyc", "CPU cycles"),
    "instructions": (1, "instructions/s", "ins", "instructions retired"),
    "cache-references": (2, "events/s", "cref", "last-level cache accesses"),
    "cache-misses": (3, "events/s", "cmiss", "last-level cache misses"),
    "branch-instructions": (4, "events/s", "br", "branch instructions retired"),
    "branch-misses": (5, "events/s", "brmiss", "mispredicted branches"),
    "stalled-cycles-frontend": (7, "cycles/s", "stfe", "cycles stalled in the front end"),
    "stalled-cycles-backend": (8, "cycles/s", "stbe", "cycles stalled in the back end"),
    "ref-cycles": (9, "cycles/s", "refcyc", "reference cycles (constant rate)"),
}
CORE_DEFAULTS = ("cycles", "instructions", "cache-misses", "branch-misses")
UNCORE_DEFAULTS = ("cas_count_read", "cas_count_write", "data_reads", "data_writes")
GROUP_MAX = 4  # events per group: fits every PMU's counters, so groups never starve


def parse_bits(spec: str) -> tuple[str, list[int]]:
    """A sysfs format file, "config:0-7,21" -> ("config", [0..7, 21])."""
    field, _, ranges = spec.strip().partition(":")
    bits: list[int] = []
    for r in ranges.split(","):
        a, _, b = r.partition("-")
        bits += range(int(a), int(b or a) + 1)
    return field, bits


def encode_event(spec: str, formats: dict[str, str]) -> tuple[int, int, int]:
    """An event string from sysfs ("event=0x04,umask=0x03") -> (config, config1, config2),
    each term's value spread over the bits its format file names."""
    out = {"config": 0, "config1": 0, "config2": 0}
    for term in spec.strip().split(","):
        if not term:
            continue
        name, _, value = term.partition("=")
        v = int(value, 0) if value else 1
        if name in out:
            out[name] |= v
            continue
        if name not in formats:
            raise ValueError(f"unknown format term '{name}'")
        field, bits = parse_bits(formats[name])
        for i, bit in enumerate(bits):
            if v >> i & 1:
                out[field] |= 1 << bit
    return out["config"], out["config1"], out["config2"]


def is_core(name: str) -> bool:
    return name in CORE_NAMES or name.startswith(CORE_PREFIXES)


def is_uncore(name: str) -> bool:
    return name.startswith(UNCORE_PREFIXES)


class Pmu(PerfGroupSensor):
    name = "pmu"
    description = "hardware counters: core PMU per CPU and uncore PMUs (perf_event_open)"
    order = 60
    rate = 100.0
    rate_reason = "each read interrupts the CPU it covers; at most ~1000 CPU reads per second"

    def __init__(self, root: str = "/", open_group=None):
        super().__init__(root)
        self.open_group = open_group or perfevent.open_group

    def _devices(self) -> list[str]:
        try:
            return sorted(os.listdir(self.path(DEVICES)))
        except OSError:
            return []

    def probe(self) -> str:
        devs = self._devices()
        self._core = [d for d in devs if is_core(d)]
        self._uncore = [d for d in devs if is_uncore(d)]
        if not self._core and not self._uncore:
            found = ", ".join(devs) or "nothing"
            return (
                f"no hardware PMU in {DEVICES} (found: {found}); "
                "a VM without a virtual PMU has none"
            )
        self._cpus = perfevent.online_cpus(self.root)
        self._generic: list[tuple[str, str, int]] = []  # (pmu, event, config)
        refused: OSError | None = None
        for pmu in self._core:
            ptype = self._type(pmu)
            hybrid = len(self._core) > 1
            cpus = self._pmu_cpus(pmu) or self._cpus
            for name, (cfg, _, _, _) in GENERIC.items():
                config = cfg | (ptype << 32 if hybrid else 0)
                try:
                    g = self.open_group([(perfevent.PERF_TYPE_HARDWARE, config, 0, 0)], cpus[0])
                except OSError as e:
                    refused = refused or e
                    continue
                g.close()
                self._generic.append((pmu, name, config))
        self._uncore_events = self._sysfs_events()
        if not self._generic and not self._uncore_events:
            if refused is not None:
                return perfevent.refusal(refused, self.root)
            return "the PMUs here expose no usable event"
        return ""

    def _type(self, pmu: str) -> int:
        return int((read_text(self.path(f"{DEVICES}/{pmu}/type")) or "0").strip() or 0)

    def _pmu_cpus(self, pmu: str) -> list[int]:
        for f in ("cpus", "cpumask"):
            text = read_text(self.path(f"{DEVICES}/{pmu}/{f}"))
            if text and text.strip():
                return parse_cpulist(text)
        return []

    def _sysfs_events(self) -> list[dict]:
        out = []
        for pmu in self._uncore:
            d = self.path(f"{DEVICES}/{pmu}")
            try:
                names = sorted(os.listdir(os.path.join(d, "events")))
                formats = {
                    f: read_text(os.path.join(d, "format", f)) or ""
                    for f in os.listdir(os.path.join(d, "format"))
                }
            except OSError:
                continue
            ptype = self._type(pmu)
            cpus = self._pmu_cpus(pmu) or [0]
            for n in names:
                if "." in n:  # .scale, .unit, .per-pkg, .snapshot describe another event
                    continue
                spec = read_text(os.path.join(d, "events", n)) or ""
                try:
                    config = encode_event(spec, formats)
                except ValueError:
                    continue
                scale = read_text(os.path.join(d, "events", n + ".scale"))
                unit = (read_text(os.path.join(d, "events", n + ".unit")) or "").strip()
                for cpu in cpus:
                    src = pmu if len(cpus) == 1 else f"{pmu}.cpu{cpu}"
                    out.append(
                        {
                            "pmu": pmu,
                            "source": src,
                            "event": n,
                            "type": ptype,
                            "config": config,
                            "cpu": cpu,
                            "scale": float(scale) if scale and scale.strip() else 1.0,
                            "unit": f"{unit}/s" if unit else "events/s",
                        }
                    )
        return out

    def available(self) -> list[EventInfo]:
        out = []
        self._spec: dict[str, tuple] = {}  # id -> (type, config, c1, c2, cpu, scale)
        for cpu in self._cpus:
            src = f"cpu{cpu}"
            for pmu, name, config in self._generic:
                if cpu not in (self._pmu_cpus(pmu) or self._cpus):
                    continue
                _, unit, _, desc = GENERIC[name]
                i = event_id(self.name, src, name)
                self._spec[i] = (perfevent.PERF_TYPE_HARDWARE, config, 0, 0, cpu, 1.0)
                out.append(EventInfo(i, self.name, src, name, unit, "counter", f"{desc} ({pmu})"))
        for u in self._uncore_events:
            i = event_id(self.name, u["source"], u["event"])
            c, c1, c2 = u["config"]
            self._spec[i] = (u["type"], c, c1, c2, u["cpu"], u["scale"])
            desc = f"uncore event {u['event']} of {u['pmu']} (sysfs)"
            out.append(EventInfo(i, self.name, u["source"], u["event"], u["unit"], "counter", desc))
        return out

    def defaults(self) -> list[str]:
        return [
            e.id
            for e in self.events()
            if e.event in CORE_DEFAULTS or any(e.event.startswith(d) for d in UNCORE_DEFAULTS)
        ]

    def heading(self, event: EventInfo) -> str:
        return GENERIC[event.event][2] if event.event in GENERIC else event.event

    def open(self) -> None:
        # Groups of at most GROUP_MAX events of one PMU on one CPU, in enabled order, so
        # the concatenated reads line up with the enabled events.
        self._scale = []
        chunks: list[tuple[tuple, list]] = []
        for e in self.enabled:
            type_, c, c1, c2, cpu, scale = self._spec[e.id]
            key = (type_ if type_ != perfevent.PERF_TYPE_HARDWARE else -1, cpu)
            if not chunks or chunks[-1][0] != key or len(chunks[-1][1]) >= GROUP_MAX:
                chunks.append((key, []))
            chunks[-1][1].append((type_, c, c1, c2))
            self._scale.append(scale)
        self.open_groups(self.open_group(evs, cpu, timed=True) for (_, cpu), evs in chunks)

    def parse(self, raw: list) -> list:
        out: list = []
        for g, data in zip(self.groups, raw):
            enabled, running, *vals = g.parse(data)
            f = enabled / running if running else 0.0
            out += [v * f for v in vals]
        return out

    def values(self, prev: list, cur: list, dt: float) -> list:
        return [(c - p) * s / dt for c, p, s in zip(cur, prev, self._scale)]
