"""`locus doctor`: what this machine lets each lens do, and how to enable the rest.

Every probe is cheap and harmless (read a sysfs/procfs file, open and close one perf event,
look a library up). Each probe gives a Check; the lens verdicts are derived from the checks
in one place (`lens_verdicts`), so adding a lens means adding one function there.
docs/doctor.md explains every check and every verdict.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from locus.perfevent import (  # noqa: F401 (doctor.X: the names its callers use)
    ATTR_DISABLED,
    ATTR_EXCLUDE_HV,
    ATTR_EXCLUDE_KERNEL,
    ATTR_PRECISE_IP_SHIFT,
    ATTR_REMOVE_ON_EXEC,
    ATTR_SIGTRAP,
    HW_BREAKPOINT_LEN_8,
    HW_BREAKPOINT_W,
    PERF_ATTR_SIZE,
    PERF_ATTR_SIZE_VER7,
    PERF_COUNT_HW_CPU_CYCLES,
    PERF_COUNT_SW_TASK_CLOCK,
    PERF_TYPE_BREAKPOINT,
    PERF_TYPE_HARDWARE,
    PERF_TYPE_RAW,
    PERF_TYPE_SOFTWARE,
    SYS_PERF_EVENT_OPEN,
    perf_attr,
    perf_open_fd,
)
from locus.sysfs import EVENT_SOURCES, node_cpus

# perf_event_open(2)
# PERF_SAMPLE_IP|TID|TIME|ADDR|CPU|WEIGHT|DATA_SRC: what the hw backend asks for
HW_SAMPLE_TYPE = 0x1 | 0x2 | 0x4 | 0x8 | 0x80 | 0x4000 | 0x8000
# Intel load-latency and store events when sysfs gives no encoding (SNB..HSW / SKL+)
INTEL_MEM_LOADS = 0x01CD
INTEL_MEM_STORES = 0x82D0
INTEL_LDLAT = 30
WATCHPOINT_SLOTS = 4
LINE_SIZE_FILE = "/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size"

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
    thp: str | None = None  # transparent huge pages: "always", "madvise", "never"
    numa_balancing: str | None = None  # kernel.numa_balancing, as read
    mpi_lib: str | None = None
    mpirun: str | None = None
    libunwind: str | None = None
    symbolizer: str | None = None
    runtime: str | None = None
    runtime_error: str = ""
    decoder: str | None = None
    # comm lens backends: None = works, else why not
    hw_sampling: str | None = None  # "mem-loads" or "ibs_op" when an event opened
    hw_sampling_error: str | None = None
    soft_error: str | None = None
    watchpoints: int = WATCHPOINT_SLOTS  # write watchpoints that opened at once (0-4)
    tsan_compiler: str | None = None  # C compiler accepting -fsanitize=thread
    tsan_error: str | None = None
    # gcc only: "after" (locus_late_tsan.so loads: hooks after the vectoriser) or "before"
    tsan_vectoriser: str | None = None
    line_size: int = 64
    cgroup_cpus: float | None = None
    online_cpus: int = 1
    seccomp: bool = False  # a seccomp filter is active (Seccomp: 2 in /proc/self/status)
    checks: list[Check] = field(default_factory=list)


# -- probes --------------------------------------------------------------------------------


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def thp_mode(text: str | None) -> str | None:
    """The selected mode of /sys/kernel/mm/transparent_hugepage/enabled ("[madvise]")."""
    if not text or "[" not in text:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] or None


def effective_caps() -> int:
    for line in (read_text("/proc/self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def perf_try(attr: ctypes.Array) -> str | None:
    """Open then close one perf event; None if it worked, else why not."""
    fd, err = perf_open_fd(attr)
    if fd >= 0:
        os.close(fd)
    return err


def perf_event_open(type_: int, config: int, bp_addr: int = 0, bp_len: int = 0) -> str | None:
    """Open (then close) one perf event on this thread; None if it worked, else why not."""
    if type_ == PERF_TYPE_BREAKPOINT:
        attr = perf_attr(
            type_, config, period=1, bp_type=HW_BREAKPOINT_W, config1=bp_addr, config2=bp_len
        )
    else:
        attr = perf_attr(type_, config)
    return perf_try(attr)


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


def sysfs_event_config(dev: str, event: str, default: int) -> tuple[int, int]:
    """(config, config1) of a named PMU event from its sysfs encoding, e.g. mem-loads is
    `event=0xcd,umask=0x1,ldlat=3` (event: config:0-7, umask: config:8-15, ldlat: config1)."""
    text = read_text(os.path.join(EVENT_SOURCES, dev, "events", event))
    if not text:
        return default, 0
    config = config1 = 0
    for term in text.split(","):
        key, _, val = term.partition("=")
        try:
            v = int(val, 0) if val else 1
        except ValueError:
            continue
        if key == "event":
            config |= v & 0xFF
        elif key == "umask":
            config |= (v & 0xFF) << 8
        elif key == "ldlat":
            config1 = v
    return config or default, config1


def probe_hw_sampling() -> tuple[str | None, str | None]:
    """(kind, error) of the comm lens's hw backend: PEBS mem-loads/mem-stores with
    precise_ip=2 (Intel) or an IBS op event (AMD), actually opened on this thread."""
    period = 10007
    for dev in ("cpu", "cpu_core"):
        if not os.path.exists(os.path.join(EVENT_SOURCES, dev, "events", "mem-loads")):
            continue
        type_text = read_text(os.path.join(EVENT_SOURCES, dev, "type")) or str(PERF_TYPE_RAW)
        type_ = int(type_text) if type_text.isdigit() else PERF_TYPE_RAW
        flags = ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV
        flags |= 2 << ATTR_PRECISE_IP_SHIFT
        cfg, _ = sysfs_event_config(dev, "mem-loads", INTEL_MEM_LOADS)
        err = perf_try(perf_attr(type_, cfg, flags, period, HW_SAMPLE_TYPE, INTEL_LDLAT))
        if err:
            return None, f"PEBS mem-loads: {err}"
        cfg, _ = sysfs_event_config(dev, "mem-stores", INTEL_MEM_STORES)
        err = perf_try(perf_attr(type_, cfg, flags, period, HW_SAMPLE_TYPE))
        return "mem-loads", (f"PEBS mem-stores: {err}" if err else None)
    ibs = os.path.join(EVENT_SOURCES, "ibs_op")
    if os.path.isdir(ibs):
        type_text = read_text(os.path.join(ibs, "type")) or ""
        if not type_text.isdigit():
            return None, "ibs_op PMU has no type in sysfs"
        flags = ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV
        err = perf_try(perf_attr(int(type_text), 0, flags, 0x10000, HW_SAMPLE_TYPE))
        return ("ibs_op", None) if err is None else (None, f"IBS op: {err}")
    return None, "no PEBS (cpu/events/mem-loads) or IBS (ibs_op) PMU in " + EVENT_SOURCES


def probe_soft_sampling() -> str | None:
    """The soft backend's signal source: a task-clock event with sigtrap (Linux 5.13)."""
    flags = ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV
    flags |= ATTR_REMOVE_ON_EXEC | ATTR_SIGTRAP
    attr = perf_attr(
        PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, flags, 1000000, size=PERF_ATTR_SIZE_VER7
    )
    return perf_try(attr)


def count_watchpoints() -> tuple[int, str | None]:
    """How many 8-byte write watchpoints this thread can hold at once (x86: 4)."""
    targets = (ctypes.c_long * WATCHPOINT_SLOTS)()
    fds: list[int] = []
    err = None
    try:
        for i in range(WATCHPOINT_SLOTS):
            attr = perf_attr(
                PERF_TYPE_BREAKPOINT,
                period=1,
                bp_type=HW_BREAKPOINT_W,
                config1=ctypes.addressof(targets) + 8 * i,
                config2=HW_BREAKPOINT_LEN_8,
            )
            fd, err = perf_open_fd(attr)
            if fd < 0:
                break
            fds.append(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return len(fds), err


def probe_late_tsan(compiler: str | None) -> str | None:
    """With gcc: "after" when `locus cc` instruments after its vectoriser (the plugin
    locus_late_tsan.so is built and this gcc loads it), else "before"; None for clang."""
    from locus import cc

    if compiler is None or cc.family([compiler]) != "gcc":
        return None
    return "after" if cc.late_tsan_plugin([compiler]) is not None else "before"


def probe_tsan_compiler() -> tuple[str | None, str | None]:
    """A C compiler that accepts -fsanitize=thread (what `locus cc` drives)."""
    import tempfile

    compilers = [c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c]
    found = [shutil.which(c.split()[0]) for c in compilers]
    found = [c for c in dict.fromkeys(found) if c]
    if not found:
        return None, "no C compiler on PATH"
    err = ""
    with tempfile.TemporaryDirectory(prefix="locus-doctor-") as tmp:
        src = os.path.join(tmp, "t.c")
        with open(src, "w") as fh:
            fh.write("int x; int f(void) { return x; }\n")
        for cc in found:
            try:
                p = subprocess.run(
                    [cc, "-fsanitize=thread", "-c", src, "-o", os.path.join(tmp, "t.o")],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
            except (OSError, subprocess.SubprocessError) as e:
                err = str(e)
                continue
            if p.returncode == 0:
                return cc, None
            err = (p.stderr.strip().splitlines() or ["failed"])[-1]
    return None, f"-fsanitize=thread refused: {err}"


def line_size() -> int:
    v = read_text(LINE_SIZE_FILE)
    return int(v) if v and v.isdigit() and int(v) > 0 else 64


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
    f.seccomp = seccomp_filtered()
    f.pmu = core_pmu()
    f.cycles_error = perf_event_open(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES)
    f.addr_sampling = address_sampling()
    target = ctypes.c_long(0)
    f.breakpoint_error = perf_event_open(
        PERF_TYPE_BREAKPOINT, 0, ctypes.addressof(target), HW_BREAKPOINT_LEN_8
    )
    f.numa_nodes = len(node_cpus()) or 1
    f.thp = thp_mode(read_text("/sys/kernel/mm/transparent_hugepage/enabled"))
    f.numa_balancing = read_text("/proc/sys/kernel/numa_balancing")
    f.mpi_lib = ctypes.util.find_library("mpi")
    f.mpirun = find_mpirun()
    f.libunwind = ctypes.util.find_library("unwind")
    f.symbolizer = shutil.which("llvm-symbolizer") or shutil.which("addr2line")
    f.decoder = ctypes.util.find_library("Zydis") or ctypes.util.find_library("capstone")
    f.hw_sampling, f.hw_sampling_error = probe_hw_sampling()
    f.soft_error = probe_soft_sampling()
    f.watchpoints, _ = count_watchpoints()
    f.tsan_compiler, f.tsan_error = probe_tsan_compiler()
    f.tsan_vectoriser = probe_late_tsan(f.tsan_compiler)
    f.line_size = line_size()
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


def seccomp_filtered() -> bool:
    """Whether this process runs under a seccomp filter (containers' default profiles, which
    block perf_event_open unless allowed)."""
    for line in (read_text("/proc/self/status") or "").splitlines():
        if line.startswith("Seccomp:"):
            return line.split(":", 1)[1].strip() == "2"
    return False


SECCOMP_FIX = (
    "a seccomp filter blocks perf_event_open (a container's default profile): "
    "docker run --cap-add PERFMON (Docker 23+ allows it then), or a --security-opt seccomp "
    "profile that permits perf_event_open"
)


def perf_denied(err: str | None) -> bool:
    return bool(err) and ("errno 1)" in err or "errno 13)" in err or "errno 38)" in err)


def perf_fix_for(f: Findings, err: str | None) -> str:
    """The fix for a perf event that did not open with `err`: the seccomp filter when one is
    active and the call was refused, else the paranoid setting when it forbids, else ""."""
    if f.seccomp and perf_denied(err):
        return SECCOMP_FIX
    return "" if perf_allowed(f) else PERF_FIX


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
            "" if f.breakpoint_error is None else (perf_fix_for(f, f.breakpoint_error) or perf_fix),
        ),
        Check(
            "NUMA nodes",
            str(f.numa_nodes),
            f.numa_nodes > 1,
            "" if f.numa_nodes > 1 else "single node: every access is local",
            ""
            if f.numa_nodes > 1
            else "use a multi-socket machine or the QEMU guest (docs/numavm.md, scripts/numavm)",
        ),
        Check(
            "huge pages (THP)",
            f.thp or "unknown",
            True,
            {
                "always": "numa first touch opens a whole 2 MiB huge page at once",
                "madvise": "numa first touch opens huge pages whole where the program asks "
                "(MADV_HUGEPAGE); elsewhere page by page",
                "never": "numa first touch opens base pages one by one",
            }.get(f.thp or "", "/sys/kernel/mm/transparent_hugepage/enabled unreadable"),
            "",
        ),
        Check(
            "NUMA balancing",
            {"0": "off", "1": "on", "2": "tiering"}.get(f.numa_balancing or "", "unknown"),
            True,
            "the kernel migrates pages towards their accessors: nodes change during a run "
            "(the numa lens sees a move within 100 ms)"
            if f.numa_balancing not in (None, "0")
            else "pages stay where they were placed unless the program moves them",
            "",
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
            "soft address sampling decodes the interrupted instruction",
            "" if f.decoder else "apt-get install libzydis-dev",
        ),
        *comm_checks(f),
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


PERF_FIX = "sysctl kernel.perf_event_paranoid=2, or give locus CAP_PERFMON"


def perf_allowed(f: Findings) -> bool:
    return f.root or f.cap_perfmon or (f.paranoid is not None and f.paranoid <= 2)


def comm_backend(f: Findings, backend: str) -> tuple[bool, str, str]:
    """(available, reason, fix) of one backend of the comm lens. The launcher refuses an
    unavailable backend with this reason and fix; doctor prints them."""
    if backend == "hw":
        if not perf_allowed(f):
            return (
                False,
                f"kernel.perf_event_paranoid is {f.paranoid}: perf events are forbidden "
                "to unprivileged users",
                PERF_FIX,
            )
        if f.hw_sampling_error is not None or (f.hw_sampling is None and not f.addr_sampling):
            why = f.hw_sampling_error or "no PEBS/IBS address sampling"
            return False, f"no hardware address sampling: {why}", "use --backend soft"
        return True, f"{f.hw_sampling or f.addr_sampling} address sampling", ""
    if backend == "soft":
        if f.machine != "x86_64":
            return False, f"the instruction decoder is x86-64 only (this is {f.machine})", ""
        if f.decoder is None:
            return False, "no instruction decoder (Zydis)", "apt-get install libzydis-dev"
        if f.soft_error is None and perf_allowed(f):
            return True, "task-clock sigtrap + decoded loads/stores", ""
        # The runtime falls back (runtime/comm/soft/soft.c, start_sampler): perf task-clock
        # with O_ASYNC signals where sigtrap is missing (Linux < 5.13), a POSIX CPU-time
        # timer where perf events are refused.
        err = f.soft_error or f"perf_event_paranoid is {f.paranoid}"
        if perf_denied(f.soft_error) or not perf_allowed(f):
            return (
                True,
                f"a POSIX CPU-time timer, at most HZ samples per second per thread "
                f"(perf task-clock refused: {err})",
                perf_fix_for(f, f.soft_error) or PERF_FIX,
            )
        return (
            True,
            f"perf task-clock with O_ASYNC signals (sigtrap: {err})",
            "Linux 5.13 or newer",
        )
    if backend == "exact":
        if f.tsan_compiler is None:
            return (
                False,
                f"no compiler for `locus cc`: {f.tsan_error or 'none found'}",
                "apt-get install gcc (or clang)",
            )
        how = (
            "a call per access (LOCUS_CC_INLINE=0)"
            if os.environ.get("LOCUS_CC_INLINE") == "0"
            else "the hit test inlined into its assembly"
        )
        if f.tsan_vectoriser == "after":
            how += ", after the vectoriser (locus_late_tsan.so)"
        elif f.tsan_vectoriser == "before":
            how += (
                ", before the vectoriser (vector loops run scalar: no gcc plugin, "
                "see gcc-12-plugin-dev, or LOCUS_CC_LATE_TSAN=0)"
            )
        return (
            True,
            f"`locus cc` instruments with {f.tsan_compiler} -fsanitize=thread, {how}",
            "",
        )
    raise ValueError(backend)


def comm_checks(f: Findings) -> list[Check]:
    out = []
    for backend in ("hw", "soft", "exact"):
        ok, why, fix = comm_backend(f, backend)
        out.append(Check(f"comm {backend} backend", "yes" if ok else "no", ok, why, fix))
    wp_ok = f.watchpoints > 0
    out.append(
        Check(
            "watchpoints",
            f"{f.watchpoints} of {WATCHPOINT_SLOTS}",
            wp_ok,
            "debug registers per thread: true vs false sharing",
            "" if wp_ok else (perf_fix_for(f, f.breakpoint_error) or "hardware breakpoints"),
        )
    )
    out.append(Check("cache line size", str(f.line_size), True, LINE_SIZE_FILE))
    return out


# -- verdicts ------------------------------------------------------------------------------


def lens_verdicts(f: Findings) -> list[Verdict]:
    priv = f.root or f.cap_perfmon
    perf_ok = priv or (f.paranoid is not None and f.paranoid <= 2)
    perf_fix = "sysctl kernel.perf_event_paranoid=2 (or CAP_PERFMON)"
    pmu = f.pmu is not None and f.cycles_error is None
    hw_addr = f.addr_sampling is not None and perf_ok
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

    out.append(comm_verdict(f))

    if not (hw_addr or x86):
        out.append(Verdict("numa", True, "unavailable", "no address sampling on this machine"))
    elif f.numa_nodes < 2:
        out.append(
            Verdict(
                "numa",
                True,
                "degraded",
                "one NUMA node: every access is local (--fake-numa N emulates nodes)",
                "a multi-socket machine, or scripts/numavm -- locus record --lens numa ...",
            )
        )
    else:
        backend = f.addr_sampling if hw_addr else "soft"
        out.append(Verdict("numa", True, "ok", f"{f.numa_nodes} nodes, {backend} sampling"))

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

    # monitor: its perf sensors count for the whole system, which needs more than perf_ok.
    system_wide = priv or (f.paranoid is not None and f.paranoid <= 0)
    missing = []
    if not system_wide:
        missing.append(f"no perf software events (perf_event_paranoid={f.paranoid})")
    if not pmu:
        missing.append("no PMU")
    if not missing:
        out.append(
            Verdict("monitor", True, "ok", "vmstat, NUMA, CPU, PSI, perf events, PMU counters")
        )
    else:
        fix = "" if system_wide else "sysctl kernel.perf_event_paranoid=0 (or CAP_PERFMON)"
        out.append(
            Verdict(
                "monitor",
                True,
                "degraded",
                "vmstat, NUMA, CPU, PSI; " + ", ".join(missing),
                fix,
            )
        )
    return out


def comm_verdict(f: Findings) -> Verdict:
    hw_ok, hw_why, hw_fix = comm_backend(f, "hw")
    soft_ok, soft_why, soft_fix = comm_backend(f, "soft")
    bp = f.breakpoint_error is None and f.watchpoints > 0
    perf_fix = perf_fix_for(f, f.breakpoint_error)
    if hw_ok and bp:
        return Verdict("comm", True, "ok", f"{hw_why} + {f.watchpoints} watchpoints")
    if hw_ok:
        why = f"no watchpoints ({f.breakpoint_error}): sharing detected from samples only"
        return Verdict("comm", True, "degraded", why, perf_fix)
    if soft_ok:
        why = "no hardware address sampling: soft sampling (decoded loads/stores)"
        if f.soft_error is not None or not perf_allowed(f):
            why += f" by {soft_why.split(' (')[0]}"
        if not bp:
            why += ", no watchpoints"
        return Verdict("comm", True, "degraded", why, perf_fix or soft_fix)
    if f.machine == "x86_64" and bp:
        # The soft backend is possible here but something it needs is missing.
        return Verdict("comm", True, "degraded", f"soft sampling: {soft_why}", soft_fix)
    why = f"no address sampling ({hw_why}) and no watchpoints ({f.breakpoint_error})"
    return Verdict("comm", True, "unavailable", why, perf_fix or hw_fix)


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
    for col in ("check", "value", "ok?", "detail", "fix"):
        # Folded, never cut with "…": in a pipe the console is 80 columns wide, and
        # "perf_event_para…" or "(recipes/numav…" said nothing.
        t.add_column(col, overflow="fold")
    for c in f.checks:
        t.add_row(c.name, c.value, "ok" if c.ok else "[yellow]no[/]", c.detail, c.fix)
    console.print(t)
    colors = {"ok": "green", "degraded": "yellow", "unavailable": "red"}
    t = Table(title="lenses", title_justify="left")
    for col in ("lens", "status", "reason", "fix"):
        t.add_column(col, overflow="fold")
    for v in verdicts:
        if v.implemented:
            t.add_row(v.lens, f"[{colors[v.status]}]{v.status}[/]", v.reason, v.fix)
        else:
            t.add_row(v.lens, "planned", _planned(v), v.fix)
    console.print(t)


def _planned(v: Verdict) -> str:
    """The reason of a lens locus does not have yet: what this machine would give it."""
    return f"not in locus yet; this machine: {v.status}, {v.reason}"


def print_plain(f: Findings, verdicts: list[Verdict], out) -> None:
    for c in f.checks:
        fix = f"  fix: {c.fix}" if c.fix else ""
        print(f"{c.name:22} {c.value:24} {'ok' if c.ok else 'no':3} {c.detail}{fix}", file=out)
    print(file=out)
    for v in verdicts:
        fix = f"  fix: {v.fix}" if v.fix else ""
        if v.implemented:
            print(f"{v.lens:20} {v.status:12} {v.reason}{fix}", file=out)
        else:
            print(f"{v.lens:20} {'planned':12} {_planned(v)}{fix}", file=out)


def print_check(rows: list[dict], out=None) -> None:
    """The self-check's rows (locus.selfcheck) as one line each."""
    out = out or sys.stdout
    print("\ncomm lens against the bundled workloads' truth (locus doctor --check)", file=out)
    for r in rows:
        got = "n/a" if r["measured"] is None else f"{r['measured']:.3f}"
        want = "" if r["expected"] is None else f" (expected {r['expected']:.2f})"
        verdict = "ok" if r["ok"] else "FAILED"
        print(f"  {r['backend']:5} {r['check']:22} {got}{want} {verdict}: {r['detail']}", file=out)


def check_backends(f: Findings) -> list[str]:
    """The comm backends to check: the sampling ones this machine has, hw first; exact when
    the bundled workloads were built with `locus cc` (workloads/build/exact)."""
    from locus import selfcheck

    out = [b for b in ("hw", "soft") if comm_backend(f, b)[0]]
    return out + (["exact"] if selfcheck.exe("exact", "comm_falseshare").exists() else [])


def cmd_doctor(ns) -> int:
    f = probe()
    verdicts = lens_verdicts(f)
    rows = None
    if getattr(ns, "check", False):
        from locus import selfcheck

        rows = selfcheck.run(check_backends(f))
    if getattr(ns, "format", "text") == "json":
        data = to_json(f, verdicts)
        if rows is not None:
            data["check"] = rows
        json.dump(data, sys.stdout, indent=2)
        print()
    else:
        print_text(f, verdicts)
        if rows is not None:
            print_check(rows)
    return 0 if rows is None or all(r["ok"] for r in rows) else 1
