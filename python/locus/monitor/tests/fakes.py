"""Shared by the monitor tests: a scripted sensor (each read returns the next raw values)
and wait_for."""

from __future__ import annotations

import itertools
import time

from locus.monitor.sensors.base import EventInfo, Sensor


class Scripted(Sensor):
    """Counters `up` (+10 per read) and `down` (-4 per read: a level that falls) and the
    gauge `level` (the read number)."""

    name = "fake"
    order = 1
    rate = 1000.0

    def __init__(self, name: str = "fake", rate: float = 1000.0, fail_after: int | None = None):
        super().__init__("/")
        self.name = name
        self.rate = rate
        self.reads = 0
        self.fail_after = fail_after
        self.closed = False
        self._n = itertools.count()

    def probe(self) -> str:
        return ""

    def available(self) -> list[EventInfo]:
        mk = lambda ev, unit, kind: EventInfo(  # noqa: E731
            f"{self.name}::{ev}", self.name, "", ev, unit, kind, f"scripted {ev}"
        )
        return [
            mk("up", "events/s", "counter"),
            mk("down", "pages/s", "counter"),
            mk("level", "kB", "gauge"),
        ]

    def defaults(self) -> list[str]:
        return [f"{self.name}::up", f"{self.name}::down"]

    def open(self) -> None:
        self.closed = False

    def parse(self, raw: list) -> list:
        return raw

    def fetch(self) -> list:
        if self.fail_after is not None and self.reads >= self.fail_after:
            raise OSError(5, "Input/output error")
        n = next(self._n)
        self.reads += 1
        raw = {"up": 10 * n, "down": 1000 - 4 * n, "level": n}
        return [raw[e.event] for e in self.enabled]

    def close(self) -> None:
        self.closed = True


class Absent(Sensor):
    name = "gone"
    order = 2

    def probe(self) -> str:
        return "not on this machine (test)"


def wait_for(cond, timeout: float = 10.0, poll: float = 0.005) -> None:
    """Returns once cond() is true; AssertionError after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(poll)
