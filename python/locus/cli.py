"""The `locus` command line (perf-like): record, report, compare, monitor, doctor.

Each subcommand parses its options here and hands an argparse namespace (or plain arguments)
to the module that does the work. Modules with heavy imports (numpy) are imported inside
their handler, so `locus record` starts fast and works even where the analysis cannot.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys

from locus import __version__, perfwarm
from locus.errors import LocusError

LENSES = ("locks", "comm", "numa", "monitor")
PLANNED_LENSES = ("memtrace", "mpi", "scale")
COMM_BACKENDS = ("auto", "hw", "soft", "exact")
BIND_POLICIES = ("compact", "scatter", "none")
TIME_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
REPORT_FORMATS = ("text", "json", "csv", "md")


def parse_lenses(value: str) -> list[str]:
    """`--lens a,b` (repeatable): known lenses, in order, without duplicates."""
    out: list[str] = []
    for name in value.split(","):
        name = name.strip()
        if not name:
            continue
        if name not in LENSES:
            planned = " (planned, not implemented yet)" if name in PLANNED_LENSES else ""
            raise argparse.ArgumentTypeError(
                f"unknown lens '{name}'{planned}; known lenses: {', '.join(LENSES)}"
            )
        if name not in out:
            out.append(name)
    return out


def positive_float(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{value}'") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive: '{value}'")
    return v


def non_negative_float(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{value}'") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: '{value}'")
    return v


def top_rows(value: str) -> int:
    """`--top N`: N >= 1 rows, or 0 for every row (what the cut tables' titles say)."""
    if value.strip() == "0":
        return 0
    return positive_int(value)


def positive_int(value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: '{value}'") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: '{value}'")
    return v


WRITE_ERRORS = {errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT, errno.EFBIG}
PERIOD_MAX_NS = 60 * 10**9  # a sample a minute: beyond, a run would have none
PERIOD_MAX_N = 1 << 40  # events per sample


def parse_period(value: str) -> tuple[int, int]:
    """`--period`: a time with a unit (`1ms`, `500us`, `100000ns`) -> (ns, 0), or a bare
    count of events per sample (hw backend) -> (0, N)."""
    v = value.strip()
    if re.fullmatch(r"-\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s)?", v):
        # `-5ms`, `-3`: a negative period (the parsers pass it here, see Parser).
        raise argparse.ArgumentTypeError(f"must be positive: '{value}'")
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s)", v)
    if m:
        ns = float(m.group(1)) * TIME_UNITS_NS[m.group(2)]
        if not ns > 0:
            raise argparse.ArgumentTypeError(f"must be positive: '{value}'")
        if ns > PERIOD_MAX_NS:
            raise argparse.ArgumentTypeError(f"at most 60s: '{value}'")
        return max(round(ns), 1), 0
    if v.isdigit():
        if int(v) <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: '{value}'")
        if int(v) > PERIOD_MAX_N:
            raise argparse.ArgumentTypeError(f"at most {PERIOD_MAX_N} events per sample: '{value}'")
        return 0, int(v)
    raise argparse.ArgumentTypeError(
        f"'{value}' is neither a time (1ms, 500us, 100000ns) nor a count of events"
    )


def parse_watchpoints(value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: '{value}'") from None
    if not 0 <= v <= 4:
        raise argparse.ArgumentTypeError(f"must be 0 to 4 (debug registers): '{value}'")
    return v


BULLETIN_MAX = 1 << 22  # entries: 4 Mi (the board is allocated whole at start)


def parse_bulletin(value: str) -> int:
    v = positive_int(value)
    if v < 2 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two: '{value}'")
    if v > BULLETIN_MAX:
        raise argparse.ArgumentTypeError(f"at most {BULLETIN_MAX} entries: '{value}'")
    return v


KEEP_MAX = 1 << 40  # the most --keep-samples takes (a thread never takes that many)


def parse_keep(value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: '{value}'") from None
    if not 0 <= v <= KEEP_MAX:
        raise argparse.ArgumentTypeError(f"must be 0 (keep all) to {KEEP_MAX}: '{value}'")
    return v


def parse_bind(value: str) -> str:
    if value in BIND_POLICIES:
        return value
    if re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", value):
        for a, b in re.findall(r"(\d+)-(\d+)", value):
            if int(a) > int(b):
                raise argparse.ArgumentTypeError(f"'{a}-{b}' is an empty range of CPUs")
        from locus.launcher import CPU_LIST_MAX

        if any(int(x) > CPU_LIST_MAX for x in re.findall(r"\d+", value)):
            raise argparse.ArgumentTypeError(f"'{value}': CPU numbers go up to {CPU_LIST_MAX}")
        return value
    raise argparse.ArgumentTypeError(
        f"'{value}': use compact, scatter, none or a CPU list such as 0-3,8"
    )


def parse_interval(value: str) -> float:
    """`--interval`: 100ms, 1s, 500us, or a plain number of milliseconds -> seconds."""
    from locus.monitor.engine import parse_interval as parse

    try:
        return parse(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_events(value: str) -> list[str]:
    """`--events a,b`: event ids, globs or sensor names (checked when the monitor starts)."""
    out = [x.strip() for x in value.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("empty event list")
    return out


# A value such as `-5ms` (or `-1`): argparse takes a word starting with '-' for an option
# unless it is a plain negative number, so `--period -5ms` was "expected one argument". The
# parsers take any '-' followed by a digit as a value (none of locus's options starts so),
# which the option's type then refuses with its own message ("must be positive").
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


def _columns() -> int:
    """The terminal's width as shutil.get_terminal_size gives it: $COLUMNS, else the
    terminal of the interpreter's stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class Formatter(argparse.HelpFormatter):
    """argparse's help formatter, sized without importing shutil: argparse makes one at every
    add_argument, and shutil's own imports (bz2, lzma) were ~1.6 ms of every `locus
    record`'s start."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        super().__init__(
            prog, indent_increment, max_help_position, _columns() - 2 if width is None else width
        )


class Parser(argparse.ArgumentParser):
    """locus's parsers: negative-looking values reach their option, and an unknown option is
    reported by the (sub)command it was given to, with that command's usage: `usage: locus
    record ...` and `locus record: error: unrecognized arguments: --bogus`, rather than the
    top-level `usage: locus [-h] ...` (argparse hands a subcommand's unknown words up)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_VALUE

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        # A subcommand's parser returns first (the innermost one): it is the one whose
        # usage fits the unknown words. The attribute reaches the caller's namespace.
        if extras and getattr(ns, "_usage_parser", None) is None:
            ns._usage_parser = self
        return ns, extras

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        parser = getattr(ns, "_usage_parser", None) or self
        if hasattr(ns, "_usage_parser"):
            del ns._usage_parser
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns


class OneLineParser(Parser):
    """`locus monitor ...`: a usage error is one `locus: error: ...` line, exit 2."""

    def error(self, message: str):
        self.exit(2, f"locus: error: {self.prog}: {message}\n")


def add_monitor_parser(sub) -> None:
    mon = sub.add_parser(
        "monitor",
        help="system counters over time: stat, record, live",
        description="Sample system counters (vmstat, per-node NUMA, CPU, PSI, perf software "
        "events, PMU where present) over time. See docs/monitor.md.",
    )
    mon.__class__ = OneLineParser  # created by the top-level parser's subparsers action
    msub = mon.add_subparsers(
        dest="monitor_command", metavar="stat|record|live", parser_class=OneLineParser
    )
    msub.required = True

    def common(p, default_interval: str) -> None:
        p.add_argument(
            "--interval",
            type=parse_interval,
            default={"1s": 1.0, "100ms": 0.1}[default_interval],
            metavar="TIME",
            help=f"sampling interval: 100ms, 1s, 500us, or a number of ms (default "
            f"{default_interval})",
        )
        p.add_argument(
            "--events",
            type=parse_events,
            metavar="LIST",
            help="comma-separated event ids or globs (vmstat::numa_*, numastat:*:numa_miss) "
            "or sensor names (their default events); `locus monitor stat --list` lists them",
        )

    st = msub.add_parser(
        "stat",
        help="print rates as columns, one line per interval",
        description="vmstat-like columns of per-second rates, one line per interval.",
    )
    common(st, "1s")
    st.add_argument("--count", type=positive_int, metavar="N", help="stop after N lines")
    st.add_argument(
        "--discrete",
        action="store_true",
        help="print each counter's change over the interval instead of its rate per second",
    )
    st.add_argument(
        "--list",
        action="store_true",
        help="list every event (and every absent sensor with the reason) and exit",
    )
    st.set_defaults(handler=cmd_monitor_stat)

    rec = msub.add_parser(
        "record",
        help="record the counters to a file",
        description="Record the counters to a JSON-lines file until interrupted, or while "
        "CMD runs (then exit with its status).",
        usage="locus monitor record -o FILE [--interval TIME] [--events LIST] [-- CMD ARGS...]",
    )
    rec.add_argument("-o", "--output", required=True, metavar="FILE", help="the recording")
    common(rec, "100ms")
    rec.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]")
    rec.set_defaults(handler=cmd_monitor_record)

    live = msub.add_parser(
        "live",
        help="serve a live plot of the counters in the browser",
        description="Serve the web UI with the counters streamed live.",
    )
    live.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on (default 127.0.0.1; any other needs the printed token)",
    )
    live.add_argument(
        "--port", type=int, default=0, metavar="N", help="TCP port (default 0: any free one)"
    )
    common(live, "100ms")
    live.set_defaults(handler=cmd_monitor_live)


def add_record_parser(sub) -> None:
    r = sub.add_parser(
        "record",
        help="run a program and record it",
        description="Run CMD with liblocus.so preloaded and write a run directory.",
        usage="locus record [options] -- CMD [ARGS...]",
    )
    r.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="run directory (default: locus-CMD-YYYYmmdd-HHMMSS in the current directory)",
    )
    r.add_argument(
        "--lens",
        dest="lenses",
        action="append",
        type=parse_lenses,
        metavar="LENS[,LENS...]",
        help=f"what to record (default: locks; known: {', '.join(LENSES)})",
    )
    r.add_argument(
        "--call-stack",
        action="store_true",
        help="record call stacks: of lock events (locks), and of allocations, which then name "
        "heap objects by their caller's line beyond allocator wrappers (comm, numa)",
    )
    r.add_argument(
        "--sample-interval",
        type=positive_float,
        default=None,
        metavar="MS",
        help="service-time sampling period in milliseconds (default: 10 with the locks lens, "
        "else 50)",
    )
    r.add_argument(
        "--time-all",
        action="store_true",
        help="time every lock operation instead of sampling the uncontended ones",
    )
    c = r.add_argument_group("comm and numa lenses (address sampling)")
    c.add_argument(
        "--backend",
        choices=COMM_BACKENDS,
        help="address sampling: auto (hw if PEBS/IBS, else soft), hw, soft, or exact "
        "(a program built with `locus cc`); default auto",
    )
    c.add_argument(
        "--period",
        type=parse_period,
        metavar="TIME|N",
        help="sampling period: a time (1ms, 500us; default 1ms, at least 100us for soft) "
        "or N events per sample (hw)",
    )
    c.add_argument(
        "--watchpoints",
        type=parse_watchpoints,
        metavar="0-4",
        help="debug-register watchpoints per thread (default 4)",
    )
    c.add_argument(
        "--watch-loads",
        choices=("on", "off"),
        help="also arm write watchpoints on lines another thread was sampled loading, which "
        "finds hand-offs spun on with loads (default on with soft, off with hw)",
    )
    c.add_argument(
        "--bulletin-size",
        dest="bulletin",
        type=parse_bulletin,
        metavar="N",
        help="most bulletin-board entries, a power of two (default 4096; 64 per thread are used)",
    )
    c.add_argument(
        "--keep-samples",
        dest="keep",
        type=parse_keep,
        metavar="N",
        help="samples each thread writes at full rate; of its next 2N it writes 1 in 2, of the "
        "next 4N 1 in 4, ..., its detections alike, each counting for those left out: the "
        "files grow with the log of a long run's length (default 65536; 0: write all)",
    )
    c.add_argument(
        "--bind",
        type=parse_bind,
        metavar="POLICY",
        help="pin threads in creation order: compact, scatter, none (default) or a CPU list",
    )
    mo = r.add_argument_group("monitor lens (with --lens monitor)")
    mo.add_argument(
        "--monitor-interval",
        type=parse_interval,
        metavar="TIME",
        help="sampling interval of the system counters (default 100ms)",
    )
    mo.add_argument(
        "--monitor-events",
        type=parse_events,
        metavar="LIST",
        help="events to record (default: every sensor's defaults; see locus monitor stat --list)",
    )
    nm = r.add_argument_group("numa lens (with --lens numa)")
    nm.add_argument(
        "--fake-numa",
        metavar="N|FILE",
        help="emulate N NUMA nodes (CPUs split into N equal blocks), or the topology of a JSON "
        'file ({"nodes": [{"id": 0, "cpus": [0, 1], "distances": [10, 20]}, ...]}; '
        "a node without CPUs is memory-only); pages are placed on the node of the CPU that "
        "first touched them; reports say 'emulated'",
    )
    nm.add_argument(
        "--no-first-touch",
        action="store_true",
        help="do not keep fresh memory inaccessible to catch first touches (for programs "
        "that install their own SIGSEGV handler with a raw system call); placement is still "
        "counted at free and exit",
    )
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]")
    r.set_defaults(handler=cmd_record, parser=r)


def add_report_parser(sub) -> None:
    rep = sub.add_parser("report", help="analyse a run", description="Analyse a run directory.")
    rep.add_argument("run", metavar="DIR", help="run directory written by locus record")
    rep.add_argument(
        "--lens", default=None, choices=LENSES, help="lens to report (default: every recorded lens)"
    )
    rep.add_argument("--format", default="text", choices=REPORT_FORMATS)
    rep.add_argument(
        "--top", type=top_rows, metavar="N", help="show the N first rows (0: all of them)"
    )
    rep.add_argument(
        "--min-wait",
        type=non_negative_float,
        metavar="SEC",
        help="hide locks with less total wait time",
    )
    rep.add_argument(
        "--min-hold",
        type=non_negative_float,
        metavar="SEC",
        help="hide locks with less total hold time",
    )
    rep.add_argument("--lock", metavar="ID|ADDR|NAME", help="details of one lock")
    rep.add_argument("--site", metavar="FUNC|FILE:LINE", help="only this call site")
    rep.add_argument(
        "--by",
        default=None,
        choices=("thread", "core", "node", "process", "site", "alloc"),
        help="comm: communication matrix by thread (default), core (CPU), NUMA node or "
        "process; "
        "numa: rows by code site (default), allocation site or thread",
    )
    rep.add_argument(
        "--kind",
        default="all",
        choices=("all", "true", "false"),
        help="comm: all sharing, true sharing only or false sharing only",
    )
    rep.add_argument(
        "--plot", metavar="DIR", help="comm: write PNG and SVG heat maps (all/true/false) to DIR"
    )
    rep.set_defaults(handler=cmd_report)


def add_compare_parser(sub) -> None:
    cmp_ = sub.add_parser(
        "compare", help="compare runs", description="Compare two or more run directories."
    )
    cmp_.add_argument("runs", nargs="+", metavar="RUN", help="run directories (2 or more)")
    cmp_.add_argument("--format", default="text", choices=REPORT_FORMATS)
    cmp_.add_argument(
        "--fail-if",
        dest="fail_if",
        action="append",
        default=[],
        metavar="EXPR",
        help="exit non-zero when EXPR holds (repeatable)",
    )
    cmp_.set_defaults(handler=cmd_compare, parser=cmp_)


def add_doctor_parser(sub) -> None:
    doc = sub.add_parser(
        "doctor",
        help="what this machine supports",
        description="Report which lenses this machine supports, and how to enable the rest.",
    )
    doc.add_argument("--format", default="text", choices=("text", "json"))
    doc.add_argument(
        "--check",
        action="store_true",
        help="also record the bundled comm workloads with every sampling backend this "
        "machine has and compare with their known truth (~15 s; exit 1 if one is off)",
    )
    doc.set_defaults(handler=cmd_doctor)


def add_cc_parsers(sub) -> None:
    # `locus cc ARGS` / `locus c++ ARGS` never reach argparse (main() hands every word to the
    # compiler wrapper); these entries only list them in `locus -h`.
    for name in ("cc", "c++"):
        sub.add_parser(
            name,
            add_help=False,
            help=f"compile with {name}, instrumenting loads/stores for --backend exact",
        ).set_defaults(handler=lambda ns: cmd_cc([], ns.command == "c++"))


# The commands' parsers, in `locus -h`'s order.
COMMANDS = {
    "record": add_record_parser,
    "report": add_report_parser,
    "compare": add_compare_parser,
    "monitor": add_monitor_parser,
    "doctor": add_doctor_parser,
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the command `only` alone: a command line that
    starts with a command's name is parsed by it alone, and building the others cost ~5 ms of
    every `locus record`'s start (argparse looks up translations of its own texts)."""
    p = Parser(
        prog="locus",
        description="Why a multithreaded or MPI program does not scale.",
        epilog="See docs/cli.md. `locus COMMAND -h` for the options of one command.",
    )
    p.add_argument("--version", action="version", version=f"locus {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, add in COMMANDS.items():
        if only in (None, name):
            add(sub)
    if only is None:
        add_cc_parsers(sub)
    return p


def lazy_import(module: str, what: str):
    """Import an analysis module, turning a missing dependency into a clean error."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise LocusError(f"`locus {what}` is not available in this build") from None
        raise LocusError(
            f"`locus {what}` needs the Python module '{e.name}': run `make deps`"
        ) from None


def cmd_record(ns: argparse.Namespace) -> int:
    from locus import launcher

    cmd = list(ns.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        ns.parser.error("no command to record (locus record [options] -- CMD [ARGS...])")
    if cmd[0].startswith("-") and cmd[0] != "-":
        ns.parser.error(f"unrecognized arguments: {cmd[0]} (options go before --)")
    lenses: list[str] = []
    for group in ns.lenses or [["locks"]]:
        lenses += [x for x in group if x not in lenses]
    if ns.watch_loads is not None and "comm" not in lenses:
        # The numa lens samples the same way but detects nothing: nothing to watch for.
        ns.parser.error("--watch-loads applies to the comm lens: add --lens comm")
    comm = None
    comm_given = [
        opt
        for opt, v in (
            ("--backend", ns.backend),
            ("--period", ns.period),
            ("--watchpoints", ns.watchpoints),
            ("--bulletin-size", ns.bulletin),
            ("--keep-samples", ns.keep),
            ("--bind", ns.bind),
        )
        if v is not None
    ]
    if "comm" in lenses or "numa" in lenses:
        period_ns, period_n = ns.period if ns.period else (None, None)
        comm = {
            "backend": ns.backend,
            "period_ns": period_ns,
            "period_n": period_n,
            "watchpoints": ns.watchpoints,
            "bulletin": ns.bulletin,
            "keep": ns.keep,
            "watch_loads": None if ns.watch_loads is None else ns.watch_loads == "on",
            "bind": ns.bind,
        }
    elif comm_given:
        ns.parser.error(f"{comm_given[0]} applies to the comm and numa lenses: add --lens comm")
    if ns.fake_numa is not None and "numa" not in lenses:
        ns.parser.error("--fake-numa applies to the numa lens: add --lens numa")
    if ns.no_first_touch and "numa" not in lenses:
        ns.parser.error("--no-first-touch applies to the numa lens: add --lens numa")
    monitor = None
    if "monitor" in lenses:
        monitor = {"interval_s": ns.monitor_interval, "events": ns.monitor_events}
    elif ns.monitor_interval is not None or ns.monitor_events is not None:
        opt = "--monitor-interval" if ns.monitor_interval is not None else "--monitor-events"
        ns.parser.error(f"{opt} applies to the monitor lens: add --lens monitor")
    return launcher.record(
        cmd,
        out=ns.output,
        lenses=lenses or ["locks"],
        call_stack=ns.call_stack,
        sample_interval_ms=ns.sample_interval,
        time_all=ns.time_all,
        **({"comm": comm} if comm is not None else {}),
        **(
            {"numa": {"fake": ns.fake_numa, "first_touch": not ns.no_first_touch}}
            if "numa" in lenses
            else {}
        ),
        **({"monitor": monitor} if monitor is not None else {}),
    )


def cmd_cc(argv: list[str], cxx: bool) -> int:
    """`locus cc` / `locus c++`: the compiler wrapper of the exact backend (locus/cc.py)."""
    name = "c++" if cxx else "cc"
    try:
        from locus import cc
    except ModuleNotFoundError as e:
        if e.name not in (None, "locus.cc"):
            raise LocusError(f"`locus {name}` needs the Python module '{e.name}'") from None
        raise LocusError(
            f"`locus {name}` is not available in this build (no locus/cc.py)"
        ) from None
    except ImportError:
        raise LocusError(
            f"`locus {name}` is not available in this build (no locus/cc.py)"
        ) from None
    return cc.main(list(argv), cxx=cxx)


def check_run(path: str) -> None:
    if not os.path.isdir(path):
        raise LocusError(f"{path}: no such run directory", 2)


def cmd_report(ns: argparse.Namespace) -> int:
    check_run(ns.run)
    report = lazy_import("locus.report", "report")
    return report.cmd_report(ns)


def cmd_compare(ns: argparse.Namespace) -> int:
    if len(ns.runs) < 2:
        ns.parser.error("compare needs at least two runs")
    for r in ns.runs:
        check_run(r)
    compare = lazy_import("locus.compare", "compare")
    return compare.cmd_compare(ns)


def cmd_monitor_stat(ns: argparse.Namespace) -> int:
    from locus.monitor import stat

    return stat.cmd_stat(ns)


def cmd_monitor_record(ns: argparse.Namespace) -> int:
    from locus.monitor import record

    return record.cmd_record(ns)


def cmd_monitor_live(ns: argparse.Namespace) -> int:
    live = lazy_import("locus.monitor.live", "monitor live")
    return live.main(ns)


def cmd_doctor(ns: argparse.Namespace) -> int:
    from locus import doctor

    return doctor.cmd_doctor(ns)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not perfwarm.wanted(args):
        rc = _main(args)
    else:
        perfwarm.start()  # overlaps the parsers' construction and the launcher's work
        try:
            rc = _main(args)
        finally:
            perfwarm.stop()  # (the launcher stops it once the program runs; here on any error)
    if argv is None and args[:1] == ["record"]:
        _exit_now(rc)
    return rc


def _exit_now(rc: int) -> None:
    """End `locus record` without the interpreter's teardown (freeing ~100 modules: ~5 ms
    of every recording's wall time, which the overhead figures of a 1 s program count): its
    output is flushed and the exit handlers run first; the launcher has closed its files and
    joined its threads when `record` returns."""
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # (closed, or a reader that left: nothing more can be said there)
    atexit._run_exitfuncs()
    os._exit(rc)


def _main(args: list[str]) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`): what it prints goes nowhere
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
    try:
        if args and args[0] in ("cc", "c++"):  # (no parser: a compile's time is the build's)
            rc = cmd_cc(args[1:], cxx=args[0] == "c++")
            sys.stdout.flush()
            return int(rc or 0)
        ns = build_parser(args[0] if args and args[0] in COMMANDS else None).parse_args(args)
        rc = ns.handler(ns)
        sys.stdout.flush()
        return int(rc or 0)
    except LocusError as e:
        sys.stdout.flush()
        print(f"locus: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `locus report DIR | head`: the reader left; that is not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        # Writing the output failed (`> /dev/full`, a closed descriptor, a full disk).
        if e.filename is not None or e.errno not in WRITE_ERRORS:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"locus: error: cannot write the output: {e.strerror}", file=sys.stderr)
        return 1


def main_cc() -> int:
    """The `locus-cc` command: `locus cc` as one word."""
    return main(["cc", *sys.argv[1:]])


def main_cxx() -> int:
    """The `locus-c++` command: `locus c++` as one word."""
    return main(["c++", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
