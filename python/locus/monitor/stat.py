"""`locus monitor stat`: vmstat-like columns of the monitor's events, one line per sample.

Columns are grouped by sensor and source (the first heading line), each headed by the
sensor's compact name for the event (the second line); the headings repeat every
HEADER_EVERY lines. Counters are per-second rates, or with --discrete the change over the
interval; gauges and percentages are shown as they are.
"""

from __future__ import annotations

import signal
import sys
import threading

from locus.monitor.engine import Monitor, interval_ms, sensor_classes
from locus.monitor.fifo import ControlFifo

HEADER_EVERY = 20
MIN_WIDTH = 5
# When --events is not given: system-wide totals first, per node only with several nodes.
STAT_DEFAULTS = (
    "vmstat::numa_hit",
    "vmstat::numa_miss",
    "vmstat::numa_foreign",
    "vmstat::numa_other",
    "vmstat::pgfault",
    "vmstat::pgmajfault",
    "vmstat::pgmigrate_success",
    "cpu::user",
    "cpu::system",
    "cpu::idle",
    "cpu::iowait",
    "cpu::steal",
    "cpu::ctxt",
    "cpu::intr",
    "cpu::procs_running",
    "cpu::procs_blocked",
    "psi::cpu_some_avg10",
    "psi::memory_some_avg10",
    "psi::io_some_avg10",
)
PER_NODE_DEFAULTS = ("numa_miss", "other_node")


def stat_defaults(sensors) -> list[str]:
    have = {e.id for s in sensors if s.present() for e in s.events()}
    out = [i for i in STAT_DEFAULTS if i in have]
    nodes = sorted({i.split(":")[1] for i in have if i.startswith("numastat:")})
    if len(nodes) > 1:
        out += [f"numastat:{n}:{e}" for n in nodes for e in PER_NODE_DEFAULTS]
        out = [i for i in out if i in have]
    return out


def fmt_value(v: float, width: int) -> str:
    """A number in at most `width` characters: integers as they are, small fractions with
    decimals, large numbers with k/M/G/T suffixes (x1e3, ...)."""
    a = abs(v)
    if a == 0:
        s = "0"
    elif a < 10 and v != int(v):
        s = f"{v:.2f}"
    elif a < 100 and v != int(v):
        s = f"{v:.1f}"
    else:
        s = f"{v:.0f}"
    if len(s) <= width:
        return s
    for suffix, scale in (("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12), ("P", 1e15)):
        x = v / scale
        if abs(x) >= 999.5:
            continue
        s = f"{x:.1f}{suffix}" if abs(x) < 9.95 else f"{x:.0f}{suffix}"
        if len(s) <= width:
            return s
    return f"{v:.1e}"


class StatPrinter:
    """Turns the monitor's records into lines on `out` (called from the sampling thread)."""

    def __init__(self, monitor: Monitor, out=None, discrete: bool = False, count: int = 0):
        self.mon = monitor
        self.out = out or sys.stdout
        self.discrete = discrete
        self.count = count
        self.lines = 0
        self.done = threading.Event()
        sensors = {s.name: s for s in monitor.active}
        self.ids = [e.id for e in monitor.events]
        self.sensor_of = [sensors[e.sensor] for e in monitor.events]
        self.counter = [e.kind == "counter" for e in monitor.events]
        heads = [sensors[e.sensor].heading(e) for e in monitor.events]
        self.widths = [max(MIN_WIDTH, len(h)) for h in heads]
        groups: list[tuple[str, int]] = []  # (label, columns)
        for e in monitor.events:
            label = e.sensor if not e.source else f"{e.sensor}:{e.source}"
            if groups and groups[-1][0] == label:
                groups[-1] = (label, groups[-1][1] + 1)
            else:
                groups.append((label, 1))
        # Widen a group's last column when its label needs more room than its columns.
        col = 0
        for label, n in groups:
            room = sum(self.widths[col : col + n]) + n - 1
            if len(label) + 2 > room:
                self.widths[col + n - 1] += len(label) + 2 - room
            col += n
        parts, col = [], 0
        for label, n in groups:
            room = sum(self.widths[col : col + n]) + n - 1
            parts.append(f" {label} ".center(room, "-"))
            col += n
        self.head1 = " ".join(parts)
        self.head2 = " ".join(h.rjust(w) for h, w in zip(heads, self.widths))

    def write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, ValueError):
            self.done.set()

    def on_record(self, rec: dict) -> None:
        if self.done.is_set():
            return
        if "v" not in rec:
            if "label" in rec:
                self.write(f"# label {rec['label']}\n")
            elif "interval_ms" in rec:
                self.write(f"# interval {rec['interval_ms']} ms\n")
            elif "paused" in rec:
                self.write("# paused\n" if rec["paused"] else "# resumed\n")
            return
        if self.lines % HEADER_EVERY == 0:
            self.write(f"{self.head1}\n{self.head2}\n")
        v = rec["v"]
        cells = []
        for i, w, is_counter, s in zip(self.ids, self.widths, self.counter, self.sensor_of):
            x = v.get(i)
            if x is None:
                cells.append("-".rjust(w))
                continue
            if self.discrete and is_counter:
                x = round(x * s.last_dt, 6)  # the count back from rate x interval
            cells.append(fmt_value(x, w).rjust(w))
        self.write(" ".join(cells) + "\n")
        self.lines += 1
        if self.count and self.lines >= self.count:
            self.done.set()


def list_events(sensors=None, out=None) -> None:
    """--list: every sensor (absent ones with the reason) and every event it offers."""
    out = out or sys.stdout
    for cls in sensors if sensors is not None else sensor_classes():
        s = cls() if isinstance(cls, type) else cls
        if not s.present():
            out.write(f"{s.name}: absent: {s.reason}\n\n")
            continue
        defaults = set(s.defaults())
        out.write(f"{s.name}: {s.description}\n")
        out.write(f"  read at most {s.rate:g} times a second ({s.rate_reason})\n")
        evs = s.events()
        w = max(len(e.id) for e in evs) if evs else 0
        u = max(len(e.unit) for e in evs) if evs else 0
        for e in evs:
            mark = "*" if e.id in defaults else " "
            out.write(f" {mark}{e.id:<{w}}  {e.unit:<{u}}  {e.kind:<7}  {e.description}\n")
        out.write("\n")
    out.write("* = enabled by default (without --events)\n")


def count_events(mon: Monitor) -> str:
    n = len(mon.events)
    return f"{n} event{'s' if n != 1 else ''}"


def wait_for_signal(done: threading.Event) -> int | None:
    """Block until `done` or SIGINT/SIGTERM/SIGHUP; return the signal number, if any."""
    got: list[int] = []

    def handler(sig, frame):
        got.append(sig)
        done.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while not done.wait(0.5):
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return got[0] if got else None


def cmd_stat(ns) -> int:
    if ns.list:
        list_events()
        return 0
    events = ns.events
    if events is None:
        events = stat_defaults([c() for c in sensor_classes()])
    mon = Monitor(ns.interval, events)
    printer = StatPrinter(mon, discrete=ns.discrete, count=ns.count or 0)
    fifo = ControlFifo(mon)
    try:
        print(f"locus: control FIFO: {fifo.path}", file=sys.stderr)
        for line in mon.absent_lines():
            print(line, file=sys.stderr)
        unit = "" if ns.discrete else " (per second)"
        print(
            f"locus: {count_events(mon)} every {interval_ms(mon.interval_s)} ms{unit}; "
            "Ctrl-C stops",
            file=sys.stderr,
        )
        mon.subscribe(printer.on_record)
        mon.start()
        wait_for_signal(printer.done)
    finally:
        mon.stop()
        fifo.close()
    return 0
