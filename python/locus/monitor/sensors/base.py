"""What every sensor shares: the event description, the file reader and the Sensor contract.

A sensor is one source of system counters (a /proc or /sys file, a set of perf events). The
engine asks each sensor class whether it is present here, lets the user pick among its
events, then at every tick the sensor is due calls `fetch()` (the system calls only: the
file's bytes, the counters' raw reads) and, at once or a few ticks later in a batch,
`sample_fetched(raw, now)`, which parses them, keeps the previous reading and returns the
final numbers in the order of the enabled events: counters as a rate per second over the
interval the sensor measured itself, gauges as read. Splitting the two keeps the work done
at each tick of a fast interval to the system calls: parsing and formatting run in batches,
with the interpreter's caches warm. Adding a sensor is adding a file with one Sensor
subclass in this package.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from locus.sysfs import parse_cpulist  # noqa: F401  (the sensors import it from here)


@dataclass
class EventInfo:
    id: str  # f"{sensor}:{source}:{event}", source "" when system-wide
    sensor: str
    source: str
    event: str
    unit: str  # "pages/s", "%", "events/s", "kB", ...
    kind: str  # "counter" (rate per second, may be negative) or "gauge" (as read)
    description: str

    def as_dict(self) -> dict:
        return asdict(self)


def event_id(sensor: str, source: str, event: str) -> str:
    return f"{sensor}:{source}:{event}"


class ProcFile:
    """A /proc or /sys file kept open and re-read from offset 0 (pread) at every sample:
    no open/close per sample, and one buffer size learnt from the first read."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = 4096

    def read(self) -> bytes:
        data = os.pread(self.fd, self.size, 0)
        while len(data) >= self.size:
            # seq_file returns what fits: grow until the whole file comes in one read.
            self.size *= 2
            data = os.pread(self.fd, self.size, 0)
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @classmethod
    def read_once(cls, path: str) -> bytes:
        """The whole file, opened and closed (a sensor's probe)."""
        f = cls(path)
        try:
            return f.read()
        finally:
            f.close()


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class Sensor:
    """The contract between a sensor and the engine (see the module docstring).

    Subclasses set `name`, `description`, `order` (the place of the sensor in the engine's
    stable event order) and `rate` (the highest sampling rate, in Hz, at which reading it
    is still meaningful or cheap; `rate_reason` says which); they implement `probe`,
    `available`, `defaults`, `open`, `fetch` and `parse`, and override `values` when a value
    is neither a plain counter nor a gauge (the CPU percentages). `root` prefixes every path,
    so tests read captured files exactly as the sensor reads the live ones.
    """

    name = ""
    description = ""
    order = 100
    rate = 1000.0
    rate_reason = ""

    def __init__(self, root: str = "/"):
        self.root = root
        self.reason = ""  # why the sensor is absent, when it is
        self._present: bool | None = None
        self._events: list[EventInfo] | None = None
        self.enabled: list[EventInfo] = []
        self._counter = ()  # per enabled event: True for a counter
        self._prev: list | None = None
        self._prev_t = 0.0
        self.now = 0.0  # the tick being read (engine's monotonic clock), for read()
        self.last_dt = 0.0

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    # -- what subclasses implement ----------------------------------------------------------

    def probe(self) -> str:
        """'' when present, else the reason it is not (and how to get it, if known)."""
        raise NotImplementedError

    def available(self) -> list[EventInfo]:
        """Every event this sensor can give here, in its stable order."""
        raise NotImplementedError

    def defaults(self) -> list[str]:
        """Ids of the events enabled when the user names none."""
        return [e.id for e in self.events()]

    def heading(self, event: EventInfo) -> str:
        """A compact column heading for `locus monitor stat`."""
        return event.event

    def open(self) -> None:
        """Prepare reading the enabled events (open files, perf events, index tables)."""
        raise NotImplementedError

    def fetch(self):
        """The raw material of one reading (bytes, tuples): system calls only, no parsing.
        `self.now` is the time of the tick being read."""
        raise NotImplementedError

    def parse(self, raw) -> list:
        """Raw values of the enabled events from one fetch, in order: counters as
        cumulative numbers. Called in fetch order."""
        raise NotImplementedError

    def read(self) -> list:
        return self.parse(self.fetch())

    def close(self) -> None:
        pass

    # -- what the engine calls --------------------------------------------------------------

    def present(self) -> bool:
        if self._present is None:
            try:
                self.reason = self.probe()
            except OSError as e:
                self.reason = f"{e.filename or self.name}: {e.strerror}"
            self._present = not self.reason
        return self._present

    def events(self) -> list[EventInfo]:
        if self._events is None:
            self._events = self.available() if self.present() else []
        return self._events

    def enable(self, ids: list[str]) -> None:
        """Enable the events with these ids (kept in the sensor's own order) and open."""
        wanted = set(ids)
        self.enabled = [e for e in self.events() if e.id in wanted]
        self._counter = tuple(e.kind == "counter" for e in self.enabled)
        self._prev = None
        if self.enabled:
            self.open()

    def values(self, prev: list, cur: list, dt: float) -> list:
        """The published numbers from two raw readings `dt` seconds apart."""
        return [(c - p) / dt if k else c for c, p, k in zip(cur, prev, self._counter)]

    def prime(self, now: float) -> None:
        """Take the reading the next sample's rates are measured from."""
        self.now = now
        self._prev = self.read()
        self._prev_t = now

    def sample(self, now: float) -> list | None:
        """The values over the interval since the previous reading; None on the first."""
        self.now = now
        return self.sample_fetched(self.fetch(), now)

    def sample_fetched(self, raw, now: float) -> list | None:
        """sample() of a reading fetched at `now`."""
        cur = self.parse(raw)
        prev, self._prev = self._prev, cur
        dt = now - self._prev_t
        self._prev_t = now
        if prev is None or dt <= 0:
            return None
        self.last_dt = dt
        return self.values(prev, cur, dt)


class PerfGroupSensor(Sensor):
    """A sensor reading perf event groups, one read per group per sample. A read of a group on
    another CPU interrupts that CPU, so the sensor's rate is capped at READS_PER_S group
    reads per second in all (~1 % of a core)."""

    READS_PER_S = 1000.0

    def open_groups(self, opened) -> None:
        """Keep the groups `opened` (an iterable opening them one by one); on a failure,
        close those already open and re-raise."""
        self.groups: list = []
        try:
            for g in opened:
                self.groups.append(g)
        except OSError:
            self.close()
            raise
        self.rate = min(type(self).rate, self.READS_PER_S / max(1, len(self.groups)))

    def fetch(self) -> list:
        return [g.fetch() for g in self.groups]

    def close(self) -> None:
        for g in getattr(self, "groups", []):
            g.close()
        self.groups = []
