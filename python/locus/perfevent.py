"""struct perf_event_attr and the perf_event_open system call, from Python (ctypes).

Used by `locus doctor`'s probes and by the launcher's perf warm-up (perfwarm.py), which
runs at every sampling `locus record`: so this module imports only `os` until a function is
called (ctypes then).
"""

from __future__ import annotations

import os

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_RAW = 4
PERF_TYPE_BREAKPOINT = 5
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_COUNT_SW_DUMMY = 9
HW_BREAKPOINT_W = 2
HW_BREAKPOINT_LEN_8 = 8
PERF_ATTR_SIZE = 112  # PERF_ATTR_SIZE_VER5: accepted by every kernel since 4.1
PERF_ATTR_SIZE_VER7 = 128  # with sigtrap (Linux 5.13)
ATTR_DISABLED = 1 << 0
ATTR_EXCLUDE_KERNEL = 1 << 5
ATTR_EXCLUDE_HV = 1 << 6
ATTR_PRECISE_IP_SHIFT = 15
ATTR_REMOVE_ON_EXEC = 1 << 36
ATTR_SIGTRAP = 1 << 37
PERF_FLAG_FD_CLOEXEC = 8
SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "i686": 336, "ppc64le": 319, "riscv64": 241}


def perf_attr(
    type_: int,
    config: int = 0,
    flags: int = ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
    period: int = 0,
    sample_type: int = 0,
    config1: int = 0,
    config2: int = 0,
    bp_type: int = 0,
    size: int = PERF_ATTR_SIZE,
) -> object:  # a ctypes character array
    """A struct perf_event_attr (the offsets are the kernel ABI's)."""
    import ctypes

    attr = ctypes.create_string_buffer(size)
    ctypes.c_uint32.from_buffer(attr, 0).value = type_
    ctypes.c_uint32.from_buffer(attr, 4).value = size
    ctypes.c_uint64.from_buffer(attr, 8).value = config
    ctypes.c_uint64.from_buffer(attr, 16).value = period
    ctypes.c_uint64.from_buffer(attr, 24).value = sample_type
    ctypes.c_uint64.from_buffer(attr, 40).value = flags
    ctypes.c_uint32.from_buffer(attr, 52).value = bp_type
    ctypes.c_uint64.from_buffer(attr, 56).value = config1  # bp_addr for breakpoints
    ctypes.c_uint64.from_buffer(attr, 64).value = config2  # bp_len for breakpoints
    return attr


def perf_open_fd(attr: object, flags: int = 0) -> tuple[int, str | None]:
    """perf_event_open(attr, this thread, any CPU, no group, flags): (fd, None) or (-1, why
    not)."""
    import ctypes

    machine = os.uname().machine
    nr = SYS_PERF_EVENT_OPEN.get(machine)
    if nr is None:
        return -1, f"perf_event_open syscall number unknown on {machine}"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(
        ctypes.c_long(nr),
        attr,
        ctypes.c_int(0),
        ctypes.c_int(-1),
        ctypes.c_int(-1),
        ctypes.c_ulong(flags),
    )
    if fd < 0:
        err = ctypes.get_errno()
        return -1, f"{os.strerror(err)} (errno {err})"
    return fd, None
