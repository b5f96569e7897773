"""Switching the kernel's perf hooks on before the recorded program starts.

The first task-bound perf event on a machine that has none open switches on the kernel's
perf scheduling hooks (a static key: code patched on every CPU, then an RCU grace period),
which took 13-20 ms on this project's 2-vCPU VM. Opened by the runtime at the program's
start, that delay was the program's (`locus record -- PROG` started PROG 12-21 ms later
than with a perf event already open somewhere). The launcher therefore opens a disabled
dummy event on itself, in a thread, as soon as it knows the run will sample (`locus
record` with the comm or numa lens), and closes it once the program is started: the kernel
switches the hooks off only a second after the last event closes (a delayed work), so the
runtime's first event, opened at the program's start, finds them on. (Held for the whole
run, the dummy would keep them on, and every context switch of the machine paying for
them, in a program whose threads all left the task clock for the tick.) Nothing happens
where perf_event_open is refused (perf_event_paranoid, seccomp) or on an architecture
without a known syscall number. Imports only what the launcher imports anyway: cli.main
starts it before building its parsers.
"""

from __future__ import annotations

import os
import threading

from locus import perfevent

SAMPLING_LENSES = ("comm", "numa")

_lock = threading.Lock()
_thread: threading.Thread | None = None
_fd = -1


def _open() -> None:
    global _fd
    attr = perfevent.perf_attr(
        perfevent.PERF_TYPE_SOFTWARE,
        perfevent.PERF_COUNT_SW_DUMMY,
        size=perfevent.PERF_ATTR_SIZE_VER7,
    )  # disabled, user space only
    # CLOEXEC: the program never inherits it.
    fd, _why = perfevent.perf_open_fd(attr, perfevent.PERF_FLAG_FD_CLOEXEC)
    _fd = fd


def start() -> None:
    """Open the dummy event in a thread (once; later calls do nothing)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_open, name="locus-perf-warmup", daemon=True)
            _thread.start()


def stop() -> None:
    """Close it (once the program is started); the next start() opens another."""
    global _thread, _fd
    with _lock:
        if _thread is not None:
            _thread.join()
            _thread = None
        if _fd >= 0:
            os.close(_fd)
            _fd = -1


def wanted(args: list[str]) -> bool:
    """Whether a command line (`record ...`, before argparse) records a sampling lens with a
    sampling backend: `--lens`/`--lens=` values naming comm or numa, and no `--backend
    exact`. Words after `--` are the program's."""
    if not args or args[0] != "record":
        return False
    words = args[1 : args.index("--")] if "--" in args else args[1:]
    lenses: list[str] = []
    backend = None
    for i, w in enumerate(words):
        for opt in ("--lens", "--backend"):
            value = None
            if w == opt and i + 1 < len(words):
                value = words[i + 1]
            elif w.startswith(opt + "="):
                value = w[len(opt) + 1 :]
            if value is None:
                continue
            if opt == "--lens":
                lenses += value.split(",")
            else:
                backend = value
    return any(x in SAMPLING_LENSES for x in lenses) and backend != "exact"
