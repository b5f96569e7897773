"""The sampling engine behind `locus monitor stat|record|live` and `locus record --lens
monitor`: sensors read in one thread at a fixed interval, records handed to subscribers and
written as JSON lines (docs/monitor.md: the format, the events, the control FIFO).

A tick fetches every due sensor (system calls only) with the same `now`, so their rates
share one interval. At intervals under BATCH_S the fetched readings wait and are parsed,
formatted and handed out in batches of about BATCH_S (the work at each tick stays close to
the system calls); at longer intervals each tick is processed at once. A sensor whose
highest rate (`Sensor.rate`) is below the engine's is read every k-th tick and appears only
in those samples, its rates over its own, longer interval. Control calls (label, interval,
pause, resume) from other threads are queued and carried out by the sampling thread, after
the pending samples: subscribers are always called from that one thread, in record order.
"""

from __future__ import annotations

import collections
import fnmatch
import importlib
import inspect
import json
import math
import os
import pkgutil
import signal
import socket
import sys
import threading
import time

from locus.errors import LocusError
from locus.monitor.sensors.base import EventInfo, Sensor

__all__ = ["EventInfo", "Monitor", "parse_interval", "sensor_classes"]

FORMAT = "locus-monitor"
VERSION = 1
MIN_INTERVAL_S = 100e-6
MAX_INTERVAL_S = 3600.0
FLUSH_EVERY_S = 0.1  # a file being written is readable (tail -f, live load) this fresh
BATCH_S = 0.1  # below this interval, ticks are processed in batches this long
BLOCKED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
UNITS_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_interval(text: str) -> float:
    """ "100ms", "1s", "500us", "2 ms", a plain number (ms) -> seconds; ValueError if bad."""
    import re

    s = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s)?", s)
    if not m:
        raise ValueError(f"bad interval '{text}': use e.g. 100ms, 1s, 500us or a number of ms")
    seconds = float(m.group(1)) * UNITS_S[m.group(2) or "ms"]
    check_interval(seconds, text)
    return seconds


def check_interval(seconds: float, text=None) -> None:
    shown = text if text is not None else f"{seconds}s"
    if not (math.isfinite(seconds) and MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S):
        raise ValueError(f"interval '{shown}' out of range: 100us to 3600s")


def interval_ms(seconds: float):
    ms = round(seconds * 1000.0, 6)
    return int(ms) if ms == int(ms) else ms


def sensor_classes() -> list[type[Sensor]]:
    """Every Sensor subclass defined in a module of locus.monitor.sensors, in `order`."""
    import locus.monitor.sensors as pkg

    found: dict[str, type[Sensor]] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name == "base" or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, Sensor) and cls.name and cls.__module__ == mod.__name__:
                found[cls.name] = cls
    return sorted(found.values(), key=lambda c: (c.order, c.name))


def host_info() -> dict:
    nodes = 0
    try:
        nodes = sum(
            1
            for n in os.listdir("/sys/devices/system/node")
            if n.startswith("node") and n[4:].isdigit()
        )
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "nodes": nodes or 1,
        "kernel": os.uname().release,
    }


def select(sensors: list[Sensor], patterns: list[str] | None) -> dict[Sensor, list[str]]:
    """The event ids to enable per present sensor. A pattern is an event id or a glob of
    ids ("vmstat::numa_*", "numastat:*:numa_miss"), or a sensor name alone (its defaults).
    Unknown patterns and events of an absent sensor are errors (exit 2)."""
    present = [s for s in sensors if s.present()]
    if patterns is None:
        return {s: s.defaults() for s in present}
    chosen: dict[Sensor, set[str]] = {s: set() for s in present}
    for pat in patterns:
        pat = pat.strip()
        if not pat:
            continue
        matched = False
        if ":" not in pat:
            for s in sensors:
                if fnmatch.fnmatchcase(s.name, pat):
                    if not s.present():
                        if pat == s.name:
                            raise LocusError(f"sensor '{s.name}' is absent here: {s.reason}", 2)
                        continue
                    chosen[s].update(s.defaults())
                    matched = True
            if not matched:
                names = ", ".join(s.name for s in sensors)
                raise LocusError(f"unknown sensor '{pat}' (sensors: {names})", 2)
            continue
        for s in present:
            ids = [e.id for e in s.events() if fnmatch.fnmatchcase(e.id, pat)]
            if ids:
                chosen[s].update(ids)
                matched = True
        if not matched:
            head = pat.split(":", 1)[0]
            for s in sensors:
                if not s.present() and fnmatch.fnmatchcase(s.name, head):
                    raise LocusError(
                        f"event '{pat}': sensor '{s.name}' is absent here: {s.reason}", 2
                    )
            raise LocusError(
                f"unknown event '{pat}' (`locus monitor stat --list` lists the events)", 2
            )
    return {s: sorted(ids) for s, ids in chosen.items()}


def _instantiate(sensors) -> list[Sensor]:
    out = []
    for s in sensors if sensors is not None else sensor_classes():
        out.append(s() if isinstance(s, type) else s)
    return out


def _block_signals() -> None:
    """Keep asynchronous signals for the main thread (and the launcher's forwarder)."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED_SIGNALS)
    except (AttributeError, OSError, ValueError):
        pass


class Monitor:
    """Samples the enabled events every `interval_s`; see the module docstring."""

    def __init__(
        self,
        interval_s: float = 1.0,
        events: list[str] | None = None,
        sensors: list | None = None,
    ):
        try:
            check_interval(float(interval_s))
        except ValueError as e:
            raise LocusError(str(e), 2) from None
        self.interval_s = float(interval_s)
        self.paused = False
        self.sensors = _instantiate(sensors)
        self.absent = {s.name: s.reason for s in self.sensors if not s.present()}
        wanted = select(self.sensors, events)
        self.active: list[Sensor] = []
        for s, ids in wanted.items():
            if not ids:
                continue
            try:
                s.enable(ids)
            except OSError as e:
                s.close()
                raise LocusError(f"sensor '{s.name}': {e.strerror or e}") from None
            if s.enabled:
                self.active.append(s)
        self.active.sort(key=lambda s: self.sensors.index(s))
        self.events: list[EventInfo] = [e for s in self.active for e in s.enabled]
        if not self.events:
            raise LocusError("no event to monitor (all sensors absent or none selected)", 2)
        self.samples = 0
        self.started_at: float | None = None
        self._subs: list = []
        self._lock = threading.RLock()
        self._file = None
        self._file_path: str | None = None
        self._flushed = 0.0
        self._queue: collections.deque = collections.deque()
        # A lock used as a binary semaphore: the sampling thread sleeps in acquire(timeout)
        # (C level, cheaper than Event.wait at 1 kHz); control calls release it to wake it.
        self._wake = threading.Lock()
        self._wake.acquire()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._final = False
        self._last = 0.0
        self._next = 0.0
        self._ticks = 0
        self._pending: list = []  # fetched ticks not processed yet
        self._batch = 1
        self._templates = {s: self._template(s) for s in self.active}
        self._plan: list = []
        self._replan()

    # -- setup ------------------------------------------------------------------------------

    @staticmethod
    def _template(s: Sensor) -> tuple[list[str], str]:
        """The sensor's fragment of a sample line, formatted in one % operation."""
        ids = [e.id for e in s.enabled]
        return ids, ", ".join(f"{json.dumps(i)}: %.12g" for i in ids)

    def _replan(self) -> None:
        """Which tick each sensor is read on at the current interval (every k-th)."""
        plan = []
        for s in self.active:
            k = max(1, math.ceil(1.0 / (s.rate * self.interval_s) - 1e-9))
            ids, tmpl = self._templates[s]
            plan.append((s, k, ids, tmpl))
        self._plan = plan
        self._ticks = 0
        self._batch = max(1, int(BATCH_S / self.interval_s + 1e-9))

    def absent_lines(self) -> list[str]:
        """One line per sensor that is absent here, with the reason (printed at start)."""
        return [f"locus: monitor: sensor {n} absent: {why}" for n, why in self.absent.items()]

    def every(self, sensor_name: str) -> int:
        """Every how many ticks the sensor is read at the current interval."""
        for s, k, _, _ in self._plan:
            if s.name == sensor_name:
                return k
        return 0

    def header(self, start: float | None = None) -> dict:
        if start is None:
            start = self.started_at if self.started_at is not None else time.time()
        return {
            "format": FORMAT,
            "version": VERSION,
            "start": start,
            "interval_ms": interval_ms(self.interval_s),
            "host": host_info(),
            "events": [e.as_dict() for e in self.events],
            "sensors": [
                {
                    "name": s.name,
                    "present": s.present(),
                    "reason": s.reason,
                    "rate": s.rate,
                    "rate_reason": s.rate_reason,
                }
                for s in self.sensors
            ],
        }

    # -- subscribers and the file -----------------------------------------------------------

    def subscribe(self, fn) -> None:
        with self._lock:
            if fn not in self._subs:
                self._subs = [*self._subs, fn]

    def unsubscribe(self, fn) -> None:
        with self._lock:
            self._subs = [f for f in self._subs if f is not fn]

    def record_to(self, path: str | None) -> None:
        """Write every record from now on to `path` (header first), closing any previous
        file; None stops writing. OSError when the file cannot be created."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as e:
                    print(f"locus: warning: {self._file_path}: {e.strerror}", file=sys.stderr)
                self._file = None
                self._file_path = None
            if path is None:
                return
            f = open(path, "w", buffering=1 << 16)
            f.write(json.dumps(self.header(start=time.time())) + "\n")
            if self.paused:
                f.write(json.dumps({"t": time.time(), "paused": True}) + "\n")
            f.flush()
            self._file = f
            self._file_path = path
            self._flushed = time.monotonic()

    @property
    def file(self) -> str | None:
        return self._file_path

    def _emit(self, record: dict | None, line: str, now: float, force_flush: bool) -> None:
        with self._lock:
            f = self._file
            if f is not None:
                try:
                    f.write(line)
                    if force_flush or now - self._flushed >= FLUSH_EVERY_S:
                        f.flush()
                        self._flushed = now
                except OSError as e:
                    print(
                        f"locus: warning: {self._file_path}: {e.strerror}; recording stopped",
                        file=sys.stderr,
                    )
                    self._file = None
                    self._file_path = None
            subs = self._subs
        if record is None:
            return
        for fn in subs:
            try:
                fn(record)
            except Exception as e:  # a broken consumer must not stop the sampling
                print(f"locus: warning: monitor subscriber failed: {e!r}", file=sys.stderr)
                self.unsubscribe(fn)

    def _emit_control(self, record: dict) -> None:
        self._emit(record, json.dumps(record) + "\n", time.monotonic(), True)

    # -- control ----------------------------------------------------------------------------

    def _control(self, item: tuple) -> None:
        """Run a control action in the sampling thread when it runs, else here."""
        t = self._thread
        if t is not None and t.is_alive() and threading.current_thread() is not t:
            self._queue.append(item)
            self._kick()
        else:
            self._apply(item)

    def _apply(self, item: tuple) -> None:
        self._process()
        what = item[0]
        if what == "label":
            self._emit_control({"t": time.time(), "label": item[1]})
        elif what == "interval":
            self.interval_s = item[1]
            self._replan()
            now = time.monotonic()
            self._next = max(self._last + self.interval_s, now)
            self._emit_control({"t": time.time(), "interval_ms": interval_ms(self.interval_s)})
        elif what == "pause":
            if not self.paused:
                self.paused = True
                self._emit_control({"t": time.time(), "paused": True})
        elif what == "resume":
            if self.paused:
                self.paused = False
                self._prime()
                self._emit_control({"t": time.time(), "paused": False})

    def label(self, text: str) -> None:
        # Stamped when the sampling thread writes it (microseconds later, unless a tick is
        # being read): records then stay in time order in the file.
        self._control(("label", str(text)))

    def set_interval(self, seconds: float) -> None:
        try:
            check_interval(float(seconds))
        except ValueError as e:
            raise LocusError(str(e), 2) from None
        self._control(("interval", float(seconds)))

    def pause(self) -> None:
        self._control(("pause",))

    def resume(self) -> None:
        self._control(("resume",))

    # -- sampling ---------------------------------------------------------------------------

    def _prime(self) -> None:
        now = time.monotonic()
        for s, _, _, _ in list(self._plan):
            try:
                s.prime(now)
            except OSError as e:
                self._drop(s, e)
        self._last = now
        self._next = now + self.interval_s
        self._ticks = 0

    def _drop(self, s: Sensor, err: OSError) -> None:
        if not any(p[0] is s for p in self._plan):
            return
        print(
            f"locus: warning: monitor: sensor {s.name} stopped: {err.strerror or err}",
            file=sys.stderr,
        )
        self._plan = [p for p in self._plan if p[0] is not s]
        s.close()

    def _tick(self, now: float) -> None:
        """Fetch the due sensors; process the batch when it is full."""
        n = self._ticks
        self._ticks = n + 1
        fetched = []
        for p in self._plan:
            if n % p[1]:
                continue
            s = p[0]
            s.now = now
            try:
                fetched.append((p, s.fetch()))
            except OSError as e:
                self._drop(s, e)
        self._pending.append((time.time(), now, now - self._last, fetched))
        self._last = now
        if len(self._pending) >= self._batch:
            self._process()

    def _process(self) -> None:
        """Parse, format and hand out the fetched ticks, in order."""
        pending, self._pending = self._pending, []
        for t, now, dt, fetched in pending:
            frags = []
            v = {} if self._subs else None
            for (s, _, ids, tmpl), raw in fetched:
                try:
                    vals = s.sample_fetched(raw, now)
                except (OSError, ValueError, IndexError) as e:
                    self._drop(s, e if isinstance(e, OSError) else OSError(0, f"unreadable: {e}"))
                    continue
                if vals is None:
                    continue
                frags.append(tmpl % tuple(vals))
                if v is not None:
                    v.update(zip(ids, vals))
            if not frags:
                continue
            self.samples += 1
            body = ", ".join(frags)
            line = f'{{"t": {t:.6f}, "dt": {dt:.9f}, "v": {{{body}}}}}\n'
            self._emit({"t": t, "dt": dt, "v": v} if v is not None else None, line, now, False)

    def sample_once(self) -> None:
        """One tick now, processed at once (tests, and the final sample of a recording)."""
        self._tick(time.monotonic())
        self._process()

    def _kick(self) -> None:
        try:
            self._wake.release()
        except RuntimeError:  # already released: the thread will wake anyway
            pass

    def _drain(self) -> None:
        while self._queue:
            self._apply(self._queue.popleft())

    def _run(self) -> None:
        _block_signals()
        try:
            while True:
                self._drain()
                if self._stopping:
                    break
                if self.paused:
                    self._wake.acquire()
                    continue
                delay = self._next - time.monotonic()
                if delay > 0 and self._wake.acquire(timeout=delay):
                    continue
                now = time.monotonic()
                if now < self._next:
                    continue
                self._tick(now)
                self._next += self.interval_s
                if self._next <= now:  # late by a whole interval: realign, never burst
                    self._next = now + self.interval_s
            if self._final and not self.paused and time.monotonic() - self._last > 1e-3:
                self._tick(time.monotonic())
            self._process()
        except Exception as e:  # never take the host process down
            print(f"locus: warning: monitor stopped: {e!r}", file=sys.stderr)

    def start(self) -> None:
        if self._thread is not None:
            return
        self.started_at = time.time()
        self._prime()
        self._thread = threading.Thread(target=self._run, name="locus-monitor", daemon=True)
        self._thread.start()

    def stop(self, final_sample: bool = False) -> None:
        """Stop sampling (after one last, shorter sample if `final_sample`), flush and
        close the file and the sensors."""
        t = self._thread
        if t is not None:
            self._final = final_sample
            self._stopping = True
            self._kick()
            t.join()
            self._thread = None
        self._drain()
        self._process()
        self.record_to(None)
        for s in self.active:
            s.close()
