"""A stand-in for locus.monitor.engine.Monitor and locus.monitor.fifo.ControlFifo with the
same API, producing synthetic samples: the live server's own tests use it so they depend on
no sensor of the machine (test_live_server.py). Run as a script, it serves the web UI with
it: `python tests/browser/fake_engine.py [--port N] [--interval S]` (for working on the page).
"""

from __future__ import annotations

import math
import os
import stat
import tempfile
import threading
import time
from dataclasses import asdict, dataclass


@dataclass
class EventInfo:
    id: str
    sensor: str
    source: str
    event: str
    unit: str
    kind: str
    description: str


def fake_events(ncpu: int = 2) -> list[EventInfo]:
    evs = []
    for c in range(ncpu):
        for ev in ("user", "system"):
            evs.append(
                EventInfo(
                    f"cpu:cpu{c}:{ev}", "cpu", f"cpu{c}", ev, "%", "counter", f"time in {ev} mode"
                )
            )
    evs.append(EventInfo("vmstat::pgfault", "vmstat", "", "pgfault", "faults/s", "counter", "x"))
    evs.append(EventInfo("meminfo:node0:MemFree", "meminfo", "node0", "MemFree", "kB", "gauge", ""))
    return evs


class Monitor:
    def __init__(self, interval_s: float = 1.0, events: list[str] | None = None, sensors=None):
        self.interval_s = float(interval_s)
        self.events = [e for e in fake_events() if not events or e.id in events]
        self.paused = False
        self._subs: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.time()
        self._recording = None

    def header(self) -> dict:
        return {
            "format": "locus-monitor",
            "version": 1,
            "start": self._start,
            "interval_ms": self.interval_s * 1000.0,
            "host": {"hostname": "fake", "ncpu": 2},
            "events": [asdict(e) for e in self.events],
        }

    def subscribe(self, fn) -> None:
        with self._lock:
            self._subs.append(fn)

    def unsubscribe(self, fn) -> None:
        with self._lock:
            if fn in self._subs:
                self._subs.remove(fn)

    def _emit(self, rec: dict) -> None:
        with self._lock:
            subs = list(self._subs)
        for fn in subs:
            fn(rec)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fake-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join()

    def _run(self) -> None:
        last = time.time()
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            now = time.time()
            dt, last = now - last, now
            if self.paused:
                continue
            v = {}
            for i, e in enumerate(self.events):
                v[e.id] = round(50 + 40 * math.sin(now + i), 3)
            self._emit({"t": now, "dt": dt, "v": v})

    def set_interval(self, seconds: float) -> None:
        self.interval_s = float(seconds)
        self._wake.set()
        self._emit({"t": time.time(), "interval_ms": seconds * 1000.0})

    def pause(self) -> None:
        self.paused = True
        self._emit({"t": time.time(), "paused": True})

    def resume(self) -> None:
        self.paused = False
        self._emit({"t": time.time(), "paused": False})

    def label(self, text: str) -> None:
        self._emit({"t": time.time(), "label": text})

    def record_to(self, path: str | None) -> None:
        self._recording = path


class ControlFifo:
    def __init__(self, monitor: Monitor, path: str | None = None):
        self.monitor = monitor
        self._dir = None
        if path is None:
            self._dir = tempfile.mkdtemp(prefix="locus-fake-")
            path = os.path.join(self._dir, "control")
        self.path = path
        os.mkfifo(path, stat.S_IRUSR | stat.S_IWUSR)
        self._stop = False
        # Like the real one: reads from creation on, close() ends it.
        self._thread = threading.Thread(target=self._run, name="fake-fifo", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            with open(self.path) as f:
                for line in f:
                    self.handle(line.strip())

    def handle(self, line: str) -> None:
        m = self.monitor
        if line.startswith("label "):
            m.label(line[6:])
        elif line == "pause":
            m.pause()
        elif line == "resume":
            m.resume()
        elif line.startswith("interval ") and line.endswith("ms"):
            m.set_interval(float(line[9:-2]) / 1000.0)
        elif line.startswith("record "):
            m.record_to(line[7:])

    def close(self) -> None:
        if self._stop:
            return
        self._stop = True
        try:  # unblock the reader's open()
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
        os.unlink(self.path)
        if self._dir:
            os.rmdir(self._dir)


if __name__ == "__main__":
    import argparse
    import asyncio

    from locus.monitor.live import _serve

    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument(
        "--interval",
        default=0.1,
        type=lambda v: float(v[:-2]) / 1000 if v.endswith("ms") else float(v.rstrip("s")),
    )
    ns = ap.parse_args()
    mon = Monitor(ns.interval)
    asyncio.run(_serve(mon, ControlFifo(mon), ns.bind, ns.port))
