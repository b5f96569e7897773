"""`locus doctor`: what this machine lets each lens do, and how to enable the rest.

Every probe is cheap and harmless (read a sysfs/procfs file, open and close one perf event,
look a library up). Each probe gives a Check; the lens verdicts are derived from the checks
in one place (`lens_verdicts`), so adding a lens means adding one function there.
docs/doctor.md explains every check and every verdict.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field

EVENT_SOURCES = "/sys/bus/event_source/devices"

# perf_event_open(2)
PERF_TYPE_HARDWARE = 0
PERF_TYPE_BREAKPOINT = 5
PERF_COUNT_HW_CPU_CYCLES = 0
HW_BREAKPOINT_W = 2
HW_BREAKPOINT_LEN_8 = 8
PERF_ATTR_SIZE = 112  # PERF_ATTR_SIZE_VER5: accepted by every kernel since 4.1
ATTR_DISABLED = 1 << 0
ATTR_EXCLUDE_KERNEL = 1 << 5
ATTR_EXCLUDE_HV = 1 << 6
SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "i686": 336, "ppc64le": 319, "riscv64": 241}

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38


@dataclass
class Check:
    name: str
    value: str
    ok: bool
    detail: str = ""
    fix: str = ""


@dataclass
class Verdict:
    lens: str
    implemented: bool
    status: str  # ok | degraded | unavailable
    reason: str
    fix: str = ""


@dataclass
class Findings:
    kernel: str = ""
    machine: str = ""
    paranoid: int | None = None
    root: bool = False
    cap_perfmon: bool = False
    pmu: str | None = None  # name of the core PMU device in sysfs
    cycles_error: str | None = None  # None: a cycles counter opened
    addr_sampling: str | None = None  # "mem-loads", "ibs_op" or None
    breakpoint_error: str | None = None  # None: a hardware watchpoint armed
    numa_nodes: int = 1
    mpi_lib: str | None = None
    mpirun: str | None = None
    libunwind: str | None = None
    symbolizer: str | None = None
    runtime: str | None = None
    runtime_error: str = ""
    decoder: str | None = None
    cgroup_cpus: float | None = None
    online_cpus: int = 1
    checks: list[Check] = field(default_factory=list)


# -- probes --------------------------------------------------------------------------------


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def effective_caps() -> int:
    for line in (read_text("/proc/self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def perf_event_open(type_: int, config: int, bp_addr: int = 0, bp_len: int = 0) -> str | None:
    """Open (then close) one perf event on this thread; None if it worked, else why not."""
    nr = SYS_PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        return f"perf_event_open syscall number unknown on {platform.machine()}"
    attr = ctypes.create_string_buffer(PERF_ATTR_SIZE)
    ctypes.c_uint32.from_buffer(attr, 0).value = type_
    ctypes.c_uint32.from_buffer(attr, 4).value = PERF_ATTR_SIZE
    ctypes.c_uint64.from_buffer(attr, 8).value = config
    flags = ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV
    if type_ == PERF_TYPE_BREAKPOINT:
        ctypes.c_uint64.from_buffer(attr, 16).value = 1  # sample_period
        ctypes.c_uint32.from_buffer(attr, 52).value = HW_BREAKPOINT_W
        ctypes.c_uint64.from_buffer(attr, 56).value = bp_addr
        ctypes.c_uint64.from_buffer(attr, 64).value = bp_len
    ctypes.c_uint64.from_buffer(attr, 40).value = flags
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(
        ctypes.c_long(nr),
        attr,
        ctypes.c_int(0),
        ctypes.c_int(-1),
        ctypes.c_int(-1),
        ctypes.c_ulong(0),
    )
    if fd < 0:
        err = ctypes.get_errno()
        return f"{os.strerror(err)} (errno {err})"
    os.close(fd)
    return None


def core_pmu() -> str | None:
    for name in ("cpu", "cpu_core", "armv8_pmuv3", "armv8_pmuv3_0"):
        if os.path.isdir(os.path.join(EVENT_SOURCES, name)):
            return name
    return None


def address_sampling() -> str | None:
    for dev in ("cpu", "cpu_core"):
        if os.path.exists(os.path.join(EVENT_SOURCES, dev, "events", "mem-loads")):
            return "mem-loads"
    if os.path.isdir(os.path.join(EVENT_SOURCES, "ibs_op")):
        return "ibs_op"
    if os.path.isdir(os.path.join(EVENT_SOURCES, "arm_spe_0")):
        return "arm_spe"
    return None


def cgroup_cpu_limit() -> float | None:
    """CPUs allowed by the cgroup's CPU quota, or None when there is no quota."""
    for line in (read_text("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0":
            v = read_text(f"/sys/fs/cgroup{path}/cpu.max") or read_text("/sys/fs/cgroup/cpu.max")
            if v:
                quota, _, period = v.partition(" ")
                if quota != "max" and period:
                    return int(quota) / int(period)
        elif "cpu" in ctrls.split(","):
            for base in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
                q = read_text(f"{base}{path}/cpu.cfs_quota_us")
                p = read_text(f"{base}{path}/cpu.cfs_period_us")
                if q and p and int(q) > 0:
                    return int(q) / int(p)
    return None


def find_mpirun() -> str | None:
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=5, check=False
        )
        first = (out.stdout or out.stderr).strip().splitlines()
        return first[0] if first else exe
    except (OSError, subprocess.SubprocessError):
        return exe


def probe() -> Findings:
    f = Findings()
    f.kernel = os.uname().release
    f.machine = platform.machine()
    p = read_text("/proc/sys/kernel/perf_event_paranoid")
    f.paranoid = int(p) if p and p.lstrip("-").isdigit() else None
    f.root = os.geteuid() == 0
    caps = effective_caps()
    f.cap_perfmon = bool(caps & (1 << CAP_PERFMON) or caps & (1 << CAP_SYS_ADMIN))
    f.pmu = core_pmu()
    f.cycles_error = perf_event_open(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES)
    f.addr_sampling = address_sampling()
    target = ctypes.c_long(0)
    f.breakpoint_error = perf_event_open(
        PERF_TYPE_BREAKPOINT, 0, ctypes.addressof(target), HW_BREAKPOINT_LEN_8
    )
    f.numa_nodes = len(glob.glob("/sys/devices/system/node/node[0-9]*")) or 1
    f.mpi_lib = ctypes.util.find_library("mpi")
    f.mpirun = find_mpirun()
    f.libunwind = ctypes.util.find_library("unwind")
    f.symbolizer = shutil.which("llvm-symbolizer") or shutil.which("addr2line")
    f.decoder = ctypes.util.find_library("Zydis") or ctypes.util.find_library("capstone")
    try:
        from locus.launcher import find_runtime

        f.runtime = find_runtime()
    except Exception as e:  # LocusError: not built
        f.runtime_error = str(e)
    f.cgroup_cpus = cgroup_cpu_limit()
    try:
        f.online_cpus = len(os.sched_getaffinity(0))
    except OSError:
        f.online_cpus = os.cpu_count() or 1
    f.checks = make_checks(f)
    return f


def paranoid_meaning(v: int | None) -> str:
    if v is None:
        return "no perf_event_paranoid (no perf events in this kernel)"
    if v <= -1:
        return "everything allowed"
    if v == 0:
        return "user and kernel profiling, no raw tracepoints"
    if v == 1:
        return "user and kernel profiling of own processes"
    if v == 2:
        return "user-space profiling of own processes"
    return "perf events forbidden to unprivileged users (Debian level 3)"


def make_checks(f: Findings) -> list[Check]:
    priv = f.root or f.cap_perfmon
    perf_fix = "sysctl kernel.perf_event_paranoid=2, or give locus CAP_PERFMON"
    paranoid_ok = priv or (f.paranoid is not None and f.paranoid <= 2)
    return [
        Check("kernel", f.kernel, True, f.machine),
        Check(
            "perf_event_paranoid",
            str(f.paranoid),
            paranoid_ok,
            paranoid_meaning(f.paranoid) + (" (bypassed: privileged)" if priv else ""),
            "" if paranoid_ok else perf_fix,
        ),
        Check(
            "privileges",
            "root" if f.root else ("CAP_PERFMON" if f.cap_perfmon else "unprivileged"),
            True,
        ),
        Check(
            "hardware PMU",
            f.pmu or "none",
            f.pmu is not None and f.cycles_error is None,
            "cycles counter opened"
            if f.cycles_error is None
            else f"cycles counter: {f.cycles_error}",
            "" if f.pmu else "no PMU exposed (VM without vPMU?): enable it in the hypervisor",
        ),
        Check(
            "address sampling",
            f.addr_sampling or "none",
            f.addr_sampling is not None,
            "PEBS mem-loads / AMD IBS / ARM SPE",
            "" if f.addr_sampling else "needs Intel PEBS, AMD IBS or ARM SPE exposed to Linux",
        ),
        Check(
            "hardware breakpoints",
            "yes" if f.breakpoint_error is None else "no",
            f.breakpoint_error is None,
            "write watchpoint armed and closed"
            if f.breakpoint_error is None
            else f.breakpoint_error,
            "" if f.breakpoint_error is None else perf_fix,
        ),
        Check(
            "NUMA nodes",
            str(f.numa_nodes),
            f.numa_nodes > 1,
            "" if f.numa_nodes > 1 else "single node: every access is local",
            ""
            if f.numa_nodes > 1
            else "use a multi-socket machine or the QEMU guest (recipes/numavm.md)",
        ),
        Check(
            "MPI",
            f.mpi_lib or "none",
            f.mpi_lib is not None,
            f.mpirun or "no mpirun",
            "" if f.mpi_lib else "apt-get install libopenmpi-dev openmpi-bin",
        ),
        Check(
            "liblocus.so",
            f.runtime or "not built",
            f.runtime is not None,
            "",
            "" if f.runtime else "make build",
        ),
        Check(
            "libunwind",
            f.libunwind or "missing",
            f.libunwind is not None,
            "call stacks (--call-stack)",
            "" if f.libunwind else "apt-get install libunwind-dev",
        ),
        Check(
            "symbolizer",
            f.symbolizer or "missing",
            f.symbolizer is not None,
            "file:line of call sites",
            "" if f.symbolizer else "apt-get install llvm (or binutils)",
        ),
        Check(
            "instruction decoder",
            f.decoder or "missing",
            f.decoder is not None,
            "soft address sampling (planned)",
            "" if f.decoder else "apt-get install libcapstone-dev",
        ),
        Check(
            "cgroup CPU quota",
            "none" if f.cgroup_cpus is None else f"{f.cgroup_cpus:g} CPUs",
            f.cgroup_cpus is None or f.cgroup_cpus >= f.online_cpus,
            f"{f.online_cpus} CPUs in the affinity mask",
            ""
            if f.cgroup_cpus is None or f.cgroup_cpus >= f.online_cpus
            else "scaling beyond the quota is throttling, not contention",
        ),
    ]


# -- verdicts ------------------------------------------------------------------------------


def lens_verdicts(f: Findings) -> list[Verdict]:
    priv = f.root or f.cap_perfmon
    perf_ok = priv or (f.paranoid is not None and f.paranoid <= 2)
    perf_fix = "sysctl kernel.perf_event_paranoid=2 (or CAP_PERFMON)"
    pmu = f.pmu is not None and f.cycles_error is None
    hw_addr = f.addr_sampling is not None and perf_ok
    bp = f.breakpoint_error is None
    x86 = f.machine == "x86_64"
    out: list[Verdict] = []

    if f.runtime is None:
        out.append(Verdict("locks", True, "unavailable", "liblocus.so is not built", "make build"))
    elif f.libunwind is None or f.symbolizer is None:
        missing = [
            n for n, v in (("libunwind", f.libunwind), ("symbolizer", f.symbolizer)) if not v
        ]
        out.append(
            Verdict(
                "locks",
                True,
                "degraded",
                f"no {', '.join(missing)}: no call stacks / no file:line",
                "apt-get install libunwind-dev llvm",
            )
        )
    else:
        out.append(Verdict("locks", True, "ok", "pthread/OpenMP interposition"))

    if hw_addr and bp:
        out.append(Verdict("comm", False, "ok", f"{f.addr_sampling} sampling + watchpoints"))
    elif bp and x86:
        why = "no hardware address sampling: soft sampling (decoded loads/stores)"
        fix = "apt-get install libcapstone-dev" if f.decoder is None else ""
        out.append(Verdict("comm", False, "degraded", why, fix))
    elif hw_addr:
        why = f"no watchpoints ({f.breakpoint_error}): sharing detected from samples only"
        out.append(Verdict("comm", False, "degraded", why, perf_fix if not perf_ok else ""))
    else:
        why = f"no address sampling and no watchpoints ({f.breakpoint_error})"
        out.append(Verdict("comm", False, "unavailable", why, perf_fix if not perf_ok else ""))

    if not (hw_addr or x86):
        out.append(Verdict("numa", False, "unavailable", "no address sampling on this machine"))
    elif f.numa_nodes < 2:
        out.append(
            Verdict(
                "numa",
                False,
                "degraded",
                "one NUMA node: every access is local",
                "multi-socket machine or the QEMU guest (recipes/numavm.md)",
            )
        )
    else:
        backend = f.addr_sampling if hw_addr else "soft"
        out.append(Verdict("numa", False, "ok", f"{f.numa_nodes} nodes, {backend} sampling"))

    out.append(Verdict("memtrace", False, "ok", "page protection and faults need no privilege"))

    if f.mpi_lib:
        out.append(Verdict("mpi", False, "ok", f"{f.mpi_lib}; {f.mpirun or 'no mpirun'}"))
    else:
        out.append(
            Verdict(
                "mpi",
                False,
                "unavailable",
                "no MPI library found",
                "apt-get install libopenmpi-dev openmpi-bin",
            )
        )

    if pmu and perf_ok:
        out.append(Verdict("scale", False, "ok", "service time + PMU stall counters"))
    else:
        why = "no PMU counters: memory contention is inferred from service time only"
        out.append(
            Verdict(
                "scale",
                False,
                "degraded",
                why,
                perf_fix if f.pmu and not perf_ok else "a machine with a PMU",
            )
        )

    if pmu and perf_ok:
        out.append(Verdict("monitor", False, "ok", "vmstat, NUMA, scheduler and PMU counters"))
    else:
        out.append(
            Verdict(
                "monitor",
                False,
                "degraded",
                "vmstat, NUMA, scheduler; no PMU",
                perf_fix if f.pmu and not perf_ok else "",
            )
        )
    return out


# -- output --------------------------------------------------------------------------------


def to_json(f: Findings, verdicts: list[Verdict]) -> dict:
    return {
        "kernel": f.kernel,
        "machine": f.machine,
        "checks": [asdict(c) for c in f.checks],
        "lenses": [asdict(v) for v in verdicts],
    }


def print_text(f: Findings, verdicts: list[Verdict], out=None) -> None:
    out = out or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print_plain(f, verdicts, out)
        return
    console = Console(file=out, highlight=False)
    t = Table(title="machine", title_justify="left")
    for col in ("check", "value", "", "detail", "fix"):
        t.add_column(col)
    for c in f.checks:
        t.add_row(c.name, c.value, "ok" if c.ok else "[yellow]no[/]", c.detail, c.fix)
    console.print(t)
    colors = {"ok": "green", "degraded": "yellow", "unavailable": "red"}
    t = Table(title="lenses", title_justify="left")
    for col in ("lens", "status", "reason", "fix"):
        t.add_column(col)
    for v in verdicts:
        name = v.lens if v.implemented else f"{v.lens} (planned)"
        t.add_row(name, f"[{colors[v.status]}]{v.status}[/]", v.reason, v.fix)
    console.print(t)


def print_plain(f: Findings, verdicts: list[Verdict], out) -> None:
    for c in f.checks:
        fix = f"  fix: {c.fix}" if c.fix else ""
        print(f"{c.name:22} {c.value:24} {'ok' if c.ok else 'no':3} {c.detail}{fix}", file=out)
    print(file=out)
    for v in verdicts:
        name = v.lens if v.implemented else f"{v.lens} (planned)"
        fix = f"  fix: {v.fix}" if v.fix else ""
        print(f"{name:20} {v.status:12} {v.reason}{fix}", file=out)


def cmd_doctor(ns) -> int:
    f = probe()
    verdicts = lens_verdicts(f)
    if getattr(ns, "format", "text") == "json":
        json.dump(to_json(f, verdicts), sys.stdout, indent=2)
        print()
    else:
        print_text(f, verdicts)
    return 0
