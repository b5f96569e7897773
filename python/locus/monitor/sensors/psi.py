"""/proc/pressure: pressure stall information (PSI) for CPU, memory, I/O (and IRQ).

`some` is the share of time at least one task was stalled on the resource, `full` the
share of time all non-idle tasks were stalled at once. avg10 is the kernel's own 10 s
running average (a gauge, in %); total is the cumulative stall time in microseconds,
published as a rate: microseconds of stall per second (1e6 us/s = stalled all the time).
"""

from __future__ import annotations

import os

from locus.monitor.sensors.base import EventInfo, ProcFile, Sensor, event_id

DIR = "/proc/pressure"
RESOURCES = ("cpu", "memory", "io", "irq")
# token positions in "some avg10=.. avg60=.. avg300=.. total=..\nfull avg10=.. ..."
LINES = {"some": 0, "full": 5}
WHAT = {
    "some": "at least one task was stalled on",
    "full": "all non-idle tasks were stalled at once on",
}


class Psi(Sensor):
    name = "psi"
    description = "pressure stall information: time tasks wait for CPU, memory, I/O"
    order = 40
    rate = 100.0
    rate_reason = "three files at ~3 us each; avg10 only changes every 2 s"

    def probe(self) -> str:
        self._have: list[tuple[str, list[str]]] = []
        d = self.path(DIR)
        if not os.path.isdir(d):
            return f"no {DIR}: the kernel has no PSI (CONFIG_PSI)"
        why = ""
        for res in RESOURCES:
            p = os.path.join(d, res)
            if not os.path.exists(p):
                continue
            try:
                f = ProcFile(p)
                try:
                    tokens = f.read().split()
                finally:
                    f.close()
            except OSError as e:
                why = f"{DIR}/{res}: {e.strerror} (PSI disabled: boot with psi=1)"
                continue
            lines = [k for k, i in LINES.items() if i < len(tokens) and tokens[i] == k.encode()]
            if lines:
                self._have.append((res, lines))
        if not self._have:
            return why or f"{DIR} has no readable resource"
        return ""

    def available(self) -> list[EventInfo]:
        out = []
        for res, lines in self._have:
            for line in lines:
                what = f"{WHAT[line]} {res}"
                n = f"{res}_{line}_avg10"
                out.append(
                    EventInfo(
                        event_id(self.name, "", n), self.name, "", n, "%", "gauge",
                        f"share of time {what}, kernel's 10 s average",
                    )
                )  # fmt: skip
                n = f"{res}_{line}_total"
                out.append(
                    EventInfo(
                        event_id(self.name, "", n), self.name, "", n, "us/s", "counter",
                        f"stall time during which {what}, per second",
                    )
                )  # fmt: skip
        return out

    def heading(self, event: EventInfo) -> str:
        res, line, what = event.event.split("_")
        return f"{res[:3]}{line[0]}{'10' if what == 'avg10' else 'us'}"

    def open(self) -> None:
        # One reader per resource file; each enabled event is (reader, token position).
        self._files: list[ProcFile] = []
        self._plan: list[tuple[int, int, bool]] = []
        names: dict[str, int] = {}
        for e in self.enabled:
            res, line, what = e.event.split("_")
            if res not in names:
                names[res] = len(self._files)
                self._files.append(ProcFile(self.path(f"{DIR}/{res}")))
            pos = LINES[line] + (1 if what == "avg10" else 4)
            self._plan.append((names[res], pos, what == "total"))

    def fetch(self) -> list:
        return [f.read() for f in self._files]

    def parse(self, raw: list) -> list:
        tokens = [r.split() for r in raw]
        out = []
        for i, pos, total in self._plan:
            t = tokens[i][pos]
            # "avg10=1.23" / "total=123": the number starts after '=' (6 chars in both)
            out.append(int(t[6:]) if total else float(t[6:]))
        return out

    def close(self) -> None:
        for f in getattr(self, "_files", []):
            f.close()
