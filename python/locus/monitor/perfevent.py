"""perf_event_open(2) through ctypes, for the system-wide counting sensors (perf, pmu).

Only counting is used (no sampling, no ring buffer): one event group per CPU, read with
PERF_FORMAT_GROUP so a CPU's events come back in one read(2).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

SYSCALL_NR = {
    "x86_64": 298,
    "i386": 336,
    "i686": 336,
    "aarch64": 241,
    "arm64": 241,
    "riscv64": 241,
    "armv7l": 364,
    "ppc64le": 319,
    "ppc64": 319,
    "s390x": 331,
    "loongarch64": 241,
}

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_GROUP = 1 << 3
PERF_FLAG_FD_CLOEXEC = 1 << 3
PARANOID = "/proc/sys/kernel/perf_event_paranoid"

# struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1, 72 bytes): type, size,
# config, sample_period, sample_type, read_format, flag bits, wakeup_events, bp_type,
# config1, config2. Every flag is 0: enabled at once, no inherit, user and kernel counted.
ATTR = struct.Struct("<IIQQQQQIIQQ")

_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def open_counter(
    type_: int,
    config: int,
    cpu: int,
    group_fd: int = -1,
    read_format: int = PERF_FORMAT_GROUP,
    config1: int = 0,
    config2: int = 0,
) -> int:
    """A counting event on one CPU for every task (pid -1); OSError on failure."""
    nr = SYSCALL_NR.get(platform.machine())
    if nr is None:
        raise OSError(
            errno.ENOSYS, f"perf_event_open: unknown syscall number on {platform.machine()}"
        )
    buf = ctypes.create_string_buffer(
        ATTR.pack(type_, ATTR.size, config, 0, 0, read_format, 0, 0, 0, config1, config2)
    )
    fd = _syscall()(
        ctypes.c_long(nr),
        buf,
        ctypes.c_int(-1),
        ctypes.c_int(cpu),
        ctypes.c_int(group_fd),
        ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC),
    )
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)


def paranoid(root: str = "/") -> int | None:
    try:
        with open(os.path.join(root, PARANOID.lstrip("/"))) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def refusal(err: OSError, root: str = "/") -> str:
    """Why perf_event_open refused a system-wide event, and the fix, in one line."""
    if err.errno in (errno.EACCES, errno.EPERM):
        p = paranoid(root)
        level = f"perf_event_paranoid={p}" if p is not None else "perf_event_paranoid"
        return (
            f"{level} forbids system-wide perf events to this user: "
            "sysctl kernel.perf_event_paranoid=0 (or give CAP_PERFMON)"
        )
    if err.errno == errno.ENOSYS:
        return "perf_event_open is not available (kernel without CONFIG_PERF_EVENTS, or seccomp)"
    if err.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
        return f"the event is not supported here ({err.strerror})"
    return f"perf_event_open failed: {err.strerror}"


def online_cpus(root: str = "/") -> list[int]:
    from locus.monitor.sensors.base import parse_cpulist, read_text

    text = read_text(os.path.join(root, "sys/devices/system/cpu/online"))
    if text:
        try:
            return parse_cpulist(text)
        except ValueError:
            pass
    return list(range(os.cpu_count() or 1))


class Group:
    """One CPU's event group: a leader and members, read in one read(2)."""

    def __init__(self, fds: list[int], timed: bool = False):
        self.fds = fds
        self.timed = timed
        n = len(fds) + (3 if timed else 1)
        self.size = 8 * n
        self.unpack = struct.Struct(f"<{n}Q").unpack

    def fetch(self) -> bytes:
        return os.read(self.fds[0], self.size)

    def parse(self, data: bytes) -> tuple:
        """(values...) or, timed, (enabled, running, values...)."""
        return self.unpack(data)[1:]

    def read(self) -> tuple:
        return self.parse(self.fetch())

    def close(self) -> None:
        for fd in reversed(self.fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def open_group(events: list[tuple[int, int, int, int]], cpu: int, timed: bool = False) -> Group:
    """Open (type, config, config1, config2) events as one group on `cpu`."""
    fmt = PERF_FORMAT_GROUP
    if timed:
        fmt |= PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
    fds: list[int] = []
    try:
        for type_, config, c1, c2 in events:
            leader = fds[0] if fds else -1
            fds.append(open_counter(type_, config, cpu, leader, fmt, c1, c2))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return Group(fds, timed)
