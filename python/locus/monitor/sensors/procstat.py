"""/proc/stat: where each CPU's time goes (as % of the interval), context switches,
interrupts, forks and the run queue.

The time fields count in clock ticks (1/CLK_TCK s, 10 ms on most kernels): a CPU's share
over an interval is its tick delta over the sum of the deltas of all its fields, so the
sensor is not sampled faster than CLK_TCK per second (below one tick per interval the
percentages could only be 0 or 100).
"""

from __future__ import annotations

import os

from locus.monitor.sensors.base import EventInfo, ProcFile, Sensor, event_id

PATH = "/proc/stat"

# Field order of a cpu line after its name; guest and guest_nice are already counted in
# user and nice, so they are not added to the total.
TIMES = (
    ("user", "us", "time running user code (including guests)"),
    ("nice", "ni", "time running niced user code"),
    ("system", "sy", "time running kernel code"),
    ("idle", "id", "idle time"),
    ("iowait", "wa", "idle time with I/O outstanding"),
    ("irq", "hi", "time serving hardware interrupts"),
    ("softirq", "si", "time serving software interrupts"),
    ("steal", "st", "time the hypervisor gave to other guests"),
)
# event: (line key, unit, kind, heading, description)
SYSTEM = {
    "ctxt": (b"ctxt", "switches/s", "counter", "cs", "context switches"),
    "intr": (b"intr", "interrupts/s", "counter", "in", "interrupts (all sources)"),
    "softirqs": (b"softirq", "softirqs/s", "counter", "sirq", "software interrupts"),
    "forks": (b"processes", "forks/s", "counter", "fork", "processes and threads created"),
    "procs_running": (b"procs_running", "tasks", "gauge", "r", "tasks runnable or running"),
    "procs_blocked": (b"procs_blocked", "tasks", "gauge", "b", "tasks blocked on I/O"),
}
HEAD = {name: head for name, head, _ in TIMES}
PCT, COUNT, GAUGE = 0, 1, 2


def clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (ValueError, OSError):
        return 100


class ProcStat(Sensor):
    name = "cpu"
    description = "per CPU and total: time shares, context switches, interrupts (/proc/stat)"
    order = 30
    rate = float(clock_ticks())
    rate_reason = "time fields count in clock ticks (1/CLK_TCK s)"

    def probe(self) -> str:
        data = ProcFile.read_once(self.path(PATH))
        self._cpus: list[str] = []
        self._keys: set[bytes] = set()
        for line in data.split(b"\n"):
            key = line.split(None, 1)[0] if line.strip() else b""
            if key.startswith(b"cpu") and key[3:].isdigit():
                self._cpus.append(key.decode())
            self._keys.add(key)
        return "" if b"cpu" in self._keys else f"{PATH} has no cpu line"

    def available(self) -> list[EventInfo]:
        out = []
        for src in ["", *self._cpus]:
            for name, _, desc in TIMES:
                scope = "all CPUs" if not src else src
                out.append(
                    EventInfo(
                        event_id(self.name, src, name),
                        self.name,
                        src,
                        name,
                        "%",
                        "gauge",
                        f"{desc}, % of the interval ({scope})",
                    )
                )
        for name, (key, unit, kind, _, desc) in SYSTEM.items():
            if key in self._keys:
                out.append(
                    EventInfo(event_id(self.name, "", name), self.name, "", name, unit, kind, desc)
                )
        return out

    def heading(self, event: EventInfo) -> str:
        if event.event in SYSTEM:
            return SYSTEM[event.event][3]
        return HEAD.get(event.event, event.event)

    def open(self) -> None:
        self.file = ProcFile(self.path(PATH))
        # The raw reading: the enabled events' raw numbers, then one tick total per CPU
        # line used. plan[i] = (what, total slot) says how values() turns event i into %.
        self._lines: list[bytes] = []  # cpu line keys read, e.g. b"cpu3"
        self._fields: list[tuple[int, int]] = []  # (line slot, field) per enabled event
        self._plan: list[tuple[int, int]] = []
        self._sys: list[tuple[int, bytes]] = []  # (event position, line key)
        field = {name: i for i, (name, _, _) in enumerate(TIMES)}
        for pos, e in enumerate(self.enabled):
            if e.event in SYSTEM and e.source == "":
                key, _, kind, _, _ = SYSTEM[e.event]
                self._sys.append((pos, key))
                self._plan.append((COUNT if kind == "counter" else GAUGE, -1))
                self._fields.append((-1, -1))
                continue
            key = (e.source or "cpu").encode()
            if key not in self._lines:
                self._lines.append(key)
            slot = self._lines.index(key)
            self._fields.append((slot, field[e.event]))
            self._plan.append((PCT, len(self.enabled) + slot))
        self._line_of: dict[bytes, int] = {}
        self._prev_fields: dict[bytes, list[int]] = {}

    def _find(self, lines: list, key: bytes) -> int:
        i = self._line_of.get(key, -1)
        if 0 <= i < len(lines) and lines[i].startswith(key + b" "):
            return i
        self._line_of = {ln.split(None, 1)[0]: j for j, ln in enumerate(lines) if ln.strip()}
        return self._line_of.get(key, -1)

    def fetch(self) -> bytes:
        return self.file.read()

    def parse(self, raw: bytes) -> list:
        lines = raw.split(b"\n")
        rows = []
        for key in self._lines:
            i = self._find(lines, key)
            if i < 0:  # CPU offline: no line; no time passes for it
                rows.append(self._prev_fields.get(key, [0] * 8))
                continue
            row = list(map(int, lines[i].split()[1:9]))
            row += [0] * (8 - len(row))
            self._prev_fields[key] = row
            rows.append(row)
        out: list = [0] * len(self.enabled)
        for pos, (slot, f) in enumerate(self._fields):
            if slot >= 0:
                out[pos] = rows[slot][f]
        for pos, key in self._sys:
            i = self._find(lines, key)
            out[pos] = int(lines[i].split(None, 2)[1]) if i >= 0 else 0
        out += [sum(r) for r in rows]
        return out

    def values(self, prev: list, cur: list, dt: float) -> list:
        out = []
        for (what, tot), c, p in zip(self._plan, cur, prev):
            if what == PCT:
                d = cur[tot] - prev[tot]
                out.append(100.0 * (c - p) / d if d > 0 else 0.0)
            elif what == COUNT:
                out.append((c - p) / dt)
            else:
                out.append(c)
        return out

    def close(self) -> None:
        f = getattr(self, "file", None)
        if f is not None:
            f.close()
