"""`locus record`: start a program under liblocus.so and write the run directory around it.

The launcher lives outside the target. It checks the command, creates the run directory,
writes meta.json (complete: false) before the program starts, runs it with LD_PRELOAD and
the LOCUS_* configuration, samples service time (sampler.py) while it runs — and with the
monitor lens the system counters (locus.monitor) into monitor.jsonl, with a control FIFO
whose path the program gets in LOCUS_MONITOR_FIFO — forwards the signals a user sends to
it, and rewrites meta.json when the program has ended.
"""

from __future__ import annotations

import errno
import functools
import json
import mmap
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time

from locus import FORMAT_VERSION, __version__, perfwarm
from locus.errors import LocusError
from locus.sampler import (
    PROC_EXECED,
    PROC_FINISHED,
    PROC_SANDBOXED,
    Sampler,
    image_no,
    proc_flags,
    process_of_run,
)
from locus.sysfs import NODE_DIR, address_sampling_pmu, cpu_node_map, node_cpus

KNOWN_LENSES = ("locks", "comm", "numa", "monitor")
BACKENDS = {"locks": "interpose", "comm": "auto", "numa": "auto", "monitor": "sensors"}
MONITOR_INTERVAL_S = 0.1
SAMPLE_INTERVAL_MS = 10.0  # the service-time sampler with the locks lens
SAMPLE_INTERVAL_OTHER_MS = 50.0  # without it (record: why)
MONITOR_FILE = "monitor.jsonl"
COMM_BACKENDS = ("auto", "hw", "soft", "exact")
COMM_DEFAULTS = {
    "backend": "auto",
    "period_ns": 1_000_000,
    "period_n": 0,
    "watchpoints": 4,
    "bulletin": 4096,
    "keep": 65536,  # samples a thread writes at full rate (runtime/comm/comm.c, thinned_out)
    "bind": "none",
    "watch_loads": None,  # None: on with the soft backend (detect.c), off with hw
}
SOFT_FLOOR_NS = 100_000  # below this a soft sample's ~20 us cost dominates (sampling.md)
# Symbols a program built with `locus cc` references: the tsan hooks, or with the hooks
# inlined (clang LTO, runtime/cc/lto_hooks.c) the model's slow path.
# What a module built by `locus cc` references: the access hooks, the atomics' (a module
# whose shared data is all atomic calls only those), the constructor's __tsan_init, and
# the inlined hit test's slow path and per-thread state.
EXACT_SYMBOL_PREFIXES = (
    b"__tsan_read",
    b"__tsan_write",
    b"__tsan_unaligned",
    b"__tsan_volatile",
    b"__tsan_atomic",
    b"__tsan_init",
    b"locus_x_slow",
    b"locus_xt",
)
LINE_SIZE_FILE = "/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
ENV_PREFIXES = ("LD_", "OMP_", "GOMP_", "KMP_", "LOCUS_")
SI_KERNEL = 0x80  # siginfo.si_code of signals the kernel (the tty) sent

PT_INTERP = 3


# -- the command ---------------------------------------------------------------------------


def resolve_command(name: str) -> str:
    """Absolute path of the program, with the shell's exit codes for the failures."""
    if "/" in name:
        candidates = [name]
    else:
        candidates = [
            os.path.join(d or ".", name) for d in os.environ.get("PATH", os.defpath).split(":")
        ]
    not_executable = None
    for path in candidates:
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return os.path.abspath(path)
            not_executable = not_executable or path
        elif os.path.isdir(path) and "/" in name:
            raise LocusError(f"{name}: is a directory", 126)
    if not_executable:
        raise LocusError(f"{name}: permission denied", 126)
    raise LocusError(f"{name}: command not found", 127)


def _elf_class(head) -> tuple[bool, str] | None:
    """(64-bit, struct byte order) from an ELF file's first bytes; None if not ELF."""
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return None
    return head[4] == 2, "<" if head[5] == 1 else ">"


ELF_MACHINES = {3: "i386", 62: "x86_64", 183: "aarch64", 40: "arm", 243: "riscv64"}


def elf_machine(path: str) -> str | None:
    """The machine an ELF file is for, as os.uname().machine names it (a 32-bit x86 build:
    i386, or x32: "x86_64 (x32)"); None for a file that is not ELF or a machine not listed."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    cls = _elf_class(head)
    if cls is None:
        return None
    is64, end = cls
    (m,) = struct.unpack_from(end + "H", head, 18)
    name = ELF_MACHINES.get(m)
    if name == "x86_64" and not is64:
        return "x86_64 (x32)"
    return name


def elf_interp(path: str) -> str | None:
    """The PT_INTERP path of an ELF executable (its dynamic loader); "" for an ELF file
    without one (static, static-pie); None for a file that is not ELF (a script)."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            cls = _elf_class(ident)
            if cls is None:
                return None
            is64, end = cls
            if is64:
                (phoff,) = struct.unpack_from(end + "Q", ident, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 54)
            else:
                (phoff,) = struct.unpack_from(end + "I", ident, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", ident, 42)
            if phnum == 0 or phentsize < 4:
                return ""
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(min(phnum, len(table) // phentsize)):
                (p_type,) = struct.unpack_from(end + "I", table, i * phentsize)
                if p_type != PT_INTERP:
                    continue
                if is64:
                    off, size = struct.unpack_from(end + "Q16xQ", table, i * phentsize + 8)
                else:
                    off, size = struct.unpack_from(end + "I8xI", table, i * phentsize + 4)
                f.seek(off)
                return f.read(min(size, 4096)).split(b"\0")[0].decode(errors="replace") or "?"
    except (OSError, struct.error):
        return None
    return ""


def elf_is_static(path: str) -> bool:
    """True for an ELF executable the dynamic loader never sees (no PT_INTERP).

    Such a program (static, or static-pie) ignores LD_PRELOAD. Scripts and non-ELF files
    give False: their interpreter is what gets loaded.
    """
    return elf_interp(path) == ""


def linked_libraries(exe: str) -> list[str]:
    """The shared libraries the dynamic loader would load for `exe` (its own `--list`, in
    this environment: LD_LIBRARY_PATH, RUNPATH), or [] when that cannot be asked."""
    interp = elf_interp(exe)
    if not interp or not os.path.isfile(interp):
        return []
    try:
        p = subprocess.run(
            [interp, "--list", exe],
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    libs = []
    for ln in p.stdout.splitlines():
        path = ln.split(" => ", 1)[1] if " => " in ln else ln.strip()
        path = path.rsplit(" (0x", 1)[0].strip()
        if path.startswith("/") and path not in libs:
            libs.append(path)
    return libs


def find_runtime() -> str:
    """Absolute path of liblocus.so: $LOCUS_RUNTIME, the checkout's build/, or installed."""
    env = os.environ.get("LOCUS_RUNTIME")
    if env:
        if not os.path.isfile(env):
            raise LocusError(f"LOCUS_RUNTIME={env}: no such file (run `make build`)")
        return os.path.abspath(env)
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [
        os.path.join(here, "..", "..", "build", "liblocus.so"),
        os.path.join(sys.prefix, "lib", "locus", "liblocus.so"),
        "/usr/local/lib/locus/liblocus.so",
        "/usr/lib/locus/liblocus.so",
    ]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.realpath(c)
    raise LocusError(
        "liblocus.so not found: run `make build` in the locus checkout "
        "(or set LOCUS_RUNTIME to its path)"
    )


@functools.lru_cache(maxsize=64)
def elf_dynamic_symbols(path: str) -> frozenset[bytes] | None:
    """Names in the .dynsym of an ELF file (defined and undefined), or None if `path` is
    not an ELF file. Only the section headers, .dynsym and its string table are read (the
    file is mapped, not read whole: the exact backend's check may look at every library a
    program links). Read once per path: one `record` asks it of the program up to five
    times (locus cc build, sanitizers, runtime symbols, hooks, copies)."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # unreadable, or empty (nothing to map)
        return None
    with data:
        cls = _elf_class(data[:64])
        if cls is None:
            return None
        return frozenset(_dynamic_symbols(data, *cls))


def _dynamic_symbols(data, is64: bool, end: str) -> set[bytes]:
    try:
        if is64:
            (shoff,) = struct.unpack_from(end + "Q", data, 40)
            shentsize, shnum = struct.unpack_from(end + "HH", data, 58)
        else:
            (shoff,) = struct.unpack_from(end + "I", data, 32)
            shentsize, shnum = struct.unpack_from(end + "HH", data, 46)

        def section(i: int) -> tuple[int, int, int, int, int]:
            base = shoff + i * shentsize
            if is64:
                _, type_, _, _, off, size, link, _, _, entsize = struct.unpack_from(
                    end + "IIQQQQIIQQ", data, base
                )
            else:
                _, type_, _, _, off, size, link, _, _, entsize = struct.unpack_from(
                    end + "IIIIIIIIII", data, base
                )
            return type_, off, size, link, entsize

        names: set[bytes] = set()
        for i in range(shnum):
            type_, off, size, link, entsize = section(i)
            if type_ != 11 or not entsize:  # SHT_DYNSYM
                continue
            _, str_off, str_size, _, _ = section(link)
            strtab = data[str_off : str_off + str_size]
            for k in range(size // entsize):
                (name,) = struct.unpack_from(end + "I", data, off + k * entsize)
                if name:
                    names.add(strtab[name : strtab.find(b"\0", name)])
        return names
    except struct.error:
        return set()


def exact_hooks(path: str) -> str | None:
    """How a `locus cc` build calls the exact backend: "inlined" (the hit test in the program,
    only misses call liblocus.so: clang LTO references the model's slow path, gcc's rewritten
    assembly its per-thread state locus_xt), "calls" (a call per access), None unknown."""
    names = elf_dynamic_symbols(path)
    if not names:
        return None
    if b"locus_x_slow" in names or b"locus_xt" in names:
        return "inlined"
    return "calls" if any(n.startswith(EXACT_SYMBOL_PREFIXES) for n in names) else None


def check_runtime_abi(modules: list, runtime: str) -> None:
    """Refuses a program (or library) built by another locus's `locus cc` whose runtime
    symbols the liblocus.so about to be preloaded does not define: the loader would stop it
    with "undefined symbol". The exact model's layout is compiled into such a build (gcc's
    inlined hit test, clang LTO's fast path), so runtime/comm/exact/fast.h renames the
    per-thread state whenever that layout changes, and a stale build is caught here rather
    than read with the wrong offsets."""
    have = None
    for module in modules:
        names = elf_dynamic_symbols(module) if module else None
        wanted = sorted(n for n in names or () if n.startswith(b"locus_"))
        if not wanted:
            continue
        if have is None:
            have = elf_dynamic_symbols(runtime) or set()
        missing = [n.decode(errors="replace") for n in wanted if n not in have]
        if missing:
            raise LocusError(
                f"{module} was built by another version of `locus cc`: it needs "
                f"{', '.join(missing[:3])}, which this locus's runtime ({runtime}) does not "
                "define; rebuild it with this locus's `locus cc` / `locus c++`",
                2,
            )


def built_with_locus_cc(path: str) -> bool | None:
    """True when the executable references the instrumentation hooks `locus cc` inserts;
    None when it is not an ELF file (a script: its interpreter is not what we look at)."""
    names = elf_dynamic_symbols(path)
    if names is None:
        return None
    return any(n.startswith(EXACT_SYMBOL_PREFIXES) for n in names)


SYSTEM_LIBRARY_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")


# Sanitizer runtimes that must come first in the loader's list (ASan aborts otherwise) and
# whose hooks must win over liblocus.so's (a -fsanitize=thread build calls the same __tsan_*
# hooks as a `locus cc` one): `locus record` preloads them before liblocus.so.
SANITIZER_RUNTIMES = ("libasan.so", "libtsan.so", "liblsan.so", "libhwasan.so")
SANITIZER_PREFIXES = (b"__asan_", b"__tsan_", b"__lsan_", b"__hwasan_")


@functools.lru_cache(maxsize=8)
def sanitizer_runtimes(exe: str | None) -> list[str]:
    """The sanitizer runtimes `exe` links (gcc/clang -fsanitize=address|thread|leak with the
    shared runtime), in the loader's order; [] for anything else (a `locus cc` build
    references the __tsan_* hooks too, but links liblocus.so, not libtsan)."""
    names = elf_dynamic_symbols(exe) if exe else None
    if not names or not any(n.startswith(SANITIZER_PREFIXES) for n in names):
        return []
    return [
        lib for lib in linked_libraries(exe) if os.path.basename(lib).startswith(SANITIZER_RUNTIMES)
    ]


def exact_module(exe: str, skip_system: bool = False) -> str | bool | None:
    """The module `locus cc` instrumented: the executable, or else the first library it
    links that references the hooks (a solver library built with `locus cc` under a plain
    driver); False when none does; None when `exe` is not ELF (a script). skip_system: do
    not read the distribution's libraries (`--backend auto` asks this of every program:
    reading libc, libstdc++ and the rest took 50-110 ms)."""
    built = built_with_locus_cc(exe)
    if built and any(
        os.path.basename(lib).startswith("libtsan.so") for lib in sanitizer_runtimes(exe)
    ):
        return False  # a ThreadSanitizer build: its hooks are libtsan's (preloaded first)
    if built is not False:
        return exe if built else None
    for lib in linked_libraries(exe):
        if skip_system and lib.startswith(SYSTEM_LIBRARY_DIRS):
            continue
        # liblocus.so defines the hooks; the modules that call them link it.
        if not os.path.basename(lib).startswith("liblocus") and built_with_locus_cc(lib):
            return lib
    return False


def comm_line_size() -> int:
    try:
        with open(LINE_SIZE_FILE) as f:
            v = int(f.read())
        return v if v > 0 and v & (v - 1) == 0 else 64
    except (OSError, ValueError):
        return 64


def hw_backend_status() -> tuple[bool, str, str]:
    """(available, reason, fix) of the comm lens's hw backend, probed now."""
    from locus import doctor

    f = doctor.Findings(machine=os.uname().machine)
    p = doctor.read_text("/proc/sys/kernel/perf_event_paranoid")
    f.paranoid = int(p) if p and p.lstrip("-").isdigit() else None
    f.root = os.geteuid() == 0
    caps = doctor.effective_caps()
    f.cap_perfmon = bool(caps & (1 << doctor.CAP_PERFMON) or caps & (1 << doctor.CAP_SYS_ADMIN))
    f.hw_sampling, f.hw_sampling_error = doctor.probe_hw_sampling()
    return doctor.comm_backend(f, "hw")


def format_ns(ns: int) -> str:
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns % scale == 0:
            return f"{ns // scale}{unit}"
    return f"{ns}ns"


def cpu_list(text: str) -> list[int]:
    """ "0-3,8" -> [0, 1, 2, 3, 8]."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


CPU_LIST_MAX = 1 << 16  # a CPU number beyond any machine's (0-999999999 was a list of a billion)


def check_bind_list(bind: str) -> None:
    """A --bind CPU list names CPUs this process may run on (the runtime skipped the others
    silently: `--bind 7` on 2 CPUs left every thread unbound)."""
    if not bind[:1].isdigit():
        return
    if any(int(x) > CPU_LIST_MAX for x in re.findall(r"\d+", bind)):
        raise LocusError(f"--bind {bind}: CPU numbers go up to {CPU_LIST_MAX}", 2)
    allowed = sorted(os.sched_getaffinity(0))
    missing = [c for c in cpu_list(bind) if c not in allowed]
    if missing:
        from locus.analysis.common import ranges

        raise LocusError(
            f"--bind {bind}: CPU {missing[0]} is not available here (CPUs {ranges(allowed)})",
            2,
        )


def resolve_comm(options: dict | None, exe: str, command: list[str]) -> dict:
    """The comm lens settings, with `auto` resolved and every refusal a one-line error."""
    o = {**COMM_DEFAULTS, **{k: v for k, v in (options or {}).items() if v is not None}}
    asked = o["backend"]
    if asked not in COMM_BACKENDS:
        raise LocusError(f"unknown comm backend '{asked}' (known: {', '.join(COMM_BACKENDS)})", 2)
    if not 0 <= int(o["watchpoints"]) <= 4:
        raise LocusError("--watchpoints must be between 0 and 4", 2)
    bulletin = int(o["bulletin"])
    if bulletin < 2 or bulletin & (bulletin - 1):
        raise LocusError(f"--bulletin-size must be a power of two >= 2, not {bulletin}", 2)
    check_bind_list(str(o["bind"]))
    given = {k for k, v in (options or {}).items() if v is not None}
    # Options only a sampling backend uses: given, `auto` keeps to sampling.
    sampling_given = sorted(
        given & {"period_ns", "period_n", "watchpoints", "bulletin", "watch_loads", "keep"}
    )
    backend = asked
    module = None  # exact: the instrumented module
    # A `locus cc` build, looked for when sampling: its hooks run anyway (and slow it).
    built = exact_module(exe, skip_system=True) if asked != "exact" and exe else None
    instrumented = built if isinstance(built, str) else None
    if asked == "auto":
        # ... and count every transfer: `auto` takes the exact backend for it.
        if instrumented and not sampling_given:
            backend, module, instrumented = "exact", instrumented, None
        else:
            # No PEBS/IBS PMU: no need for doctor's probe (its imports alone take ~9 ms).
            hw_ok = address_sampling_pmu() and hw_backend_status()[0]
            backend = "hw" if hw_ok else "soft"
    elif asked == "hw":
        hw_ok, why, fix = hw_backend_status()
        if not hw_ok:
            raise LocusError(f"--backend hw: {why}" + (f"; fix: {fix}" if fix else ""), 2)
    elif asked == "soft" and os.uname().machine != "x86_64":
        raise LocusError(
            f"--backend soft decodes x86-64 instructions; this machine is {os.uname().machine}",
            2,
        )
    elif asked == "exact":
        module = exact_module(exe)  # may ask the loader: once, kept for exact_hooks below
        if module is False and any("libtsan" in lib for lib in sanitizer_runtimes(exe)):
            raise LocusError(
                f"--backend exact: {command[0]} is a ThreadSanitizer build (linked with "
                "libtsan, which takes its hooks); build it with `locus cc` / `locus c++` "
                "instead of -fsanitize=thread",
                2,
            )
        if module is False and os.environ.get("LOCUS_EXACT_UNCHECKED") != "1":
            raise LocusError(
                f"--backend exact: {command[0]} is not instrumented, nor is any library it "
                "links (no __tsan_read*/locus_x_slow symbols); rebuild it with `locus cc` / "
                "`locus c++` (code it loads with dlopen is not looked at: "
                "LOCUS_EXACT_UNCHECKED=1 records anyway)",
                2,
            )
        if sampling_given:
            flag = {"period_ns": "--period", "period_n": "--period", "watchpoints": "--watchpoints"}
            flag["bulletin"] = "--bulletin-size"
            flag["watch_loads"] = "--watch-loads"
            flag["keep"] = "--keep-samples"
            raise LocusError(
                f"{flag[sampling_given[0]]} does not apply to --backend exact (it sees every "
                "access, with no sampling, bulletin board or watchpoints)",
                2,
            )
    if o["period_n"]:
        if backend != "hw":
            raise LocusError(
                f"--period {o['period_n']} (events per sample) needs the hw backend, which "
                f"is not used here ({backend}); give a time instead, e.g. --period 1ms",
                2,
            )
        o["period_ns"] = 0
    elif backend == "soft" and o["period_ns"] < SOFT_FLOOR_NS:
        raise LocusError(
            f"--period {format_ns(o['period_ns'])} is below the soft backend's floor of "
            "100us (each sample costs ~20 us): use --period 100us or more",
            2,
        )
    hooks = copies = None
    if backend == "exact":
        o["period_ns"] = o["period_n"] = 0
        o["watchpoints"] = 0
        hooks = exact_hooks(module) if module else None
        # `locus cc` routes the program's memcpy/memmove/memset through liblocus.so's
        # __wrap_* (counted as ranges), except in LTO builds: a module that calls libc's own
        # copies them unseen (None: it calls none).
        names = elf_dynamic_symbols(module) if module else None
        if names and names & {b"memcpy", b"memmove", b"memset"}:
            copies = False
        elif names and any(n.startswith(b"__wrap_mem") for n in names):
            copies = True
    return {
        "exact_hooks": hooks,
        "exact_copies": copies,
        "instrumented": instrumented,
        "module": module or instrumented,  # read by check_runtime_abi, not written to meta
        "backend": backend,
        "requested": asked,
        "period_ns": int(o["period_ns"]),
        "period_n": int(o["period_n"]),
        "watchpoints": int(o["watchpoints"]),
        "watch_loads": bool(o["watch_loads"])
        if o["watch_loads"] is not None
        else backend == "soft",
        "bulletin": bulletin,
        "keep": int(o["keep"]),
        "line_size": comm_line_size(),
        "bind": str(o["bind"]),
    }


def comm_env(comm: dict) -> dict[str, str]:
    return {
        "LOCUS_COMM_BACKEND": comm["backend"],
        "LOCUS_COMM_PERIOD_NS": str(comm["period_ns"]),
        "LOCUS_COMM_PERIOD_N": str(comm["period_n"]),
        "LOCUS_COMM_WATCHPOINTS": str(comm["watchpoints"]),
        "LOCUS_COMM_BULLETIN": str(comm["bulletin"]),
        "LOCUS_COMM_KEEP": str(comm.get("keep", COMM_DEFAULTS["keep"])),
        "LOCUS_COMM_WATCH_LOADS": "1" if comm.get("watch_loads") else "0",
        "LOCUS_LINE_SIZE": str(comm["line_size"]),
        "LOCUS_BIND": comm["bind"],
    }


# -- the numa lens -------------------------------------------------------------------------


def numa_topology(root: str = NODE_DIR) -> list[dict]:
    """The machine's nodes from sysfs: id, cpus, mem_kb, distances, memory_only."""
    nodes = []
    for nid, cpus in node_cpus(root).items():
        path = os.path.join(root, f"node{nid}")
        mem_kb = 0
        try:
            with open(os.path.join(path, "meminfo")) as f:
                for line in f:
                    if "MemTotal:" in line:
                        mem_kb = int(line.split()[-2])
        except (OSError, ValueError, IndexError):
            pass
        try:
            with open(os.path.join(path, "distance")) as f:
                distances = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            distances = []
        nodes.append(
            {
                "id": nid,
                "cpus": cpus,
                "mem_kb": mem_kb,
                "distances": distances,
                "memory_only": not cpus,
            }
        )
    nodes.sort(key=lambda n: n["id"])
    if not nodes:
        ncpu = os.cpu_count() or 1
        nodes = [
            {
                "id": 0,
                "cpus": list(range(ncpu)),
                "mem_kb": 0,
                "distances": [10],
                "memory_only": False,
            }
        ]
    return nodes


def fake_topology(n: int, ncpus: int) -> list[dict]:
    """--fake-numa N: CPUs split into N equal contiguous blocks, node distances 10/20."""
    if n < 1:
        raise LocusError("--fake-numa needs at least 1 node", 2)
    if n > ncpus:
        raise LocusError(f"--fake-numa {n}: this machine has only {ncpus} CPUs (one per node)", 2)
    return [
        {
            "id": k,
            "cpus": [c for c in range(ncpus) if c * n // ncpus == k],
            "mem_kb": 0,
            "distances": [10 if j == k else 20 for j in range(n)],
            "memory_only": False,
        }
        for k in range(n)
    ]


def topology_file(path: str, ncpus: int) -> list[dict]:
    """--fake-numa FILE: {"nodes": [{"id", "cpus", "distances", "mem_kb"?}, ...]}; a node
    without CPUs is memory-only; every CPU of this machine belongs to exactly one node."""
    what = f"--fake-numa {path}"
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise LocusError(f"{what}: {e.strerror}", 2) from None
    except ValueError as e:
        raise LocusError(f"{what}: not JSON ({e})", 2) from None
    raw = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(raw, list) or not raw:
        raise LocusError(f'{what}: expected {{"nodes": [{{"id": 0, "cpus": [0]}}, ...]}}', 2)
    nodes, owner = [], {}
    for i, n in enumerate(raw):
        if not isinstance(n, dict):
            raise LocusError(f"{what}: node {i} is not an object", 2)
        nid, cpus = n.get("id", i), n.get("cpus", [])
        if not isinstance(nid, int) or not 0 <= nid < 64:
            raise LocusError(f"{what}: node id {nid!r} is not an integer in 0-63", 2)
        if not isinstance(cpus, list) or not all(isinstance(c, int) for c in cpus):
            raise LocusError(f"{what}: node {nid}: cpus must be a list of CPU numbers", 2)
        for c in cpus:
            if not 0 <= c < ncpus:
                raise LocusError(f"{what}: node {nid}: CPU {c} does not exist (0-{ncpus - 1})", 2)
            if c in owner:
                raise LocusError(f"{what}: CPU {c} is in nodes {owner[c]} and {nid}", 2)
            owner[c] = nid
        nodes.append({"id": nid, "cpus": sorted(cpus), "mem_kb": int(n.get("mem_kb", 0))})
    ids = [n["id"] for n in nodes]
    if len(set(ids)) != len(ids):
        raise LocusError(f"{what}: node ids repeat", 2)
    missing = [c for c in range(ncpus) if c not in owner]
    if missing:
        raise LocusError(f"{what}: CPUs {missing} belong to no node", 2)
    for n, r in zip(nodes, raw):
        d = r.get("distances")
        if d is None:
            d = [10 if m == n["id"] else 20 for m in sorted(ids)]
        if not isinstance(d, list) or len(d) != len(ids):
            raise LocusError(f"{what}: node {n['id']}: distances need {len(ids)} numbers", 2)
        n["distances"] = d
        n["memory_only"] = not n["cpus"]
    return sorted(nodes, key=lambda n: n["id"])


def resolve_numa(options: dict | None, comm_settings: dict) -> dict:
    """The numa lens settings: the sampling backend it shares with comm, and the topology."""
    o = options or {}
    fake = o.get("fake")
    ncpus = os.cpu_count() or 1
    fake_file = None
    if fake is not None and not str(fake).lstrip("-").isdigit():
        fake_file = os.path.abspath(str(fake))
        nodes = topology_file(str(fake), ncpus)
        fake = len(nodes)
    elif fake is not None:
        nodes = fake_topology(int(fake), ncpus)
    else:
        nodes = numa_topology()
    cpu_node = [0] * (max((c for n in nodes for c in n["cpus"]), default=ncpus - 1) + 1)
    for n in nodes:
        for c in n["cpus"]:
            cpu_node[c] = n["id"]
    return {
        "backend": comm_settings["backend"],
        "period_ns": comm_settings["period_ns"],
        "period_n": comm_settings["period_n"],
        # exact: the first instrumented access to a page is its first touch (no protection).
        "first_touch": bool(o.get("first_touch", True)) and comm_settings["backend"] != "exact",
        "emulated": fake is not None,
        "fake": int(fake) if fake is not None else None,
        "fake_file": fake_file,
        "page_size": os.sysconf("SC_PAGE_SIZE"),
        "nodes": nodes,
        "cpu_node": cpu_node,
    }


def numa_env(numa: dict) -> dict[str, str]:
    return {
        "LOCUS_NUMA_CPUNODE": ",".join(str(x) for x in numa["cpu_node"]),
        "LOCUS_NUMA_FAKE": "1" if numa["emulated"] else "0",
        "LOCUS_NUMA_FIRST_TOUCH": "1" if numa["first_touch"] else "0",
    }


# -- the run directory ---------------------------------------------------------------------


def is_run_dir(path: str) -> bool:
    """A directory locus wrote: it has a meta.json carrying locus's own keys."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "format_version" in meta and "locus_version" in meta


def local_iso(t: time.struct_time) -> str:
    """ISO 8601 local time with its UTC offset, to the second ("2026-11-29T03:15:02+01:00"),
    as datetime's isoformat gives it (datetime is not imported for this: 2-3 ms of every
    `locus record`'s start)."""
    off = t.tm_gmtoff or 0
    sign, off = ("-", -off) if off < 0 else ("+", off)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f"{sign}{off // 3600:02d}:{off % 3600 // 60:02d}"


def create_run_dir(out: str | None, command: list[str], now: time.struct_time) -> str:
    """Create the run directory and procs/ inside; return its absolute path.

    Without -o: `locus-<cmd>-<YYYYmmdd-HHMMSS>` in the current directory, with a -N suffix
    if that exists. With -o: an absent or empty directory is used; an earlier locus run is
    replaced; anything else is refused, so a typo never deletes a user's files.
    """
    if out is None:
        base = f"locus-{os.path.basename(command[0])}-{time.strftime('%Y%m%d-%H%M%S', now)}"
        path, n = base, 1
        while True:
            try:
                os.mkdir(path)
                break
            except FileExistsError:
                n += 1
                path = f"{base}-{n}"
            except OSError as e:
                raise LocusError(
                    f"cannot create the run directory {path} in {os.getcwd()}: {e.strerror}; "
                    "choose one with -o",
                    2,
                ) from None
    else:
        path = out
        if os.path.lexists(path):
            if not os.path.isdir(path) or os.path.islink(path):
                raise LocusError(f"{out}: exists and is not a directory", 2)
            if os.listdir(path):
                if not is_run_dir(path):
                    raise LocusError(
                        f"{out}: directory is not empty and is not a locus run; choose another -o",
                        2,
                    )
                import shutil  # (imported here: its imports cost every run's start)

                try:
                    shutil.rmtree(path)
                    os.mkdir(path)
                except OSError as e:
                    raise LocusError(
                        f"{out}: cannot replace the earlier run there: {e.strerror}; "
                        "choose another -o",
                        2,
                    ) from None
        else:
            try:
                os.makedirs(path)
            except OSError as e:
                raise LocusError(f"{out}: cannot create: {e.strerror}") from None
    os.mkdir(os.path.join(path, "procs"))
    return os.path.abspath(path)


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


# -- the host ------------------------------------------------------------------------------


def cache_line_size() -> int | None:
    try:
        v = os.sysconf("SC_LEVEL1_DCACHE_LINESIZE")
        if v and v > 0:
            return v
    except (ValueError, OSError):
        pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def numa_node_count() -> int:
    return len(node_cpus()) or 1


def host_info() -> dict:
    uname = os.uname()
    try:
        online = len(os.sched_getaffinity(0))
    except OSError:
        online = os.cpu_count()
    return {
        "hostname": os.uname().nodename,
        "cpus": os.cpu_count(),
        "online_cpus": online,
        "numa_nodes": numa_node_count(),
        "cpu_node": cpu_node_map(),  # the report's core-to-node matrix: this machine's
        "cache_line": cache_line_size(),
        "kernel": uname.release,
        "machine": uname.machine,
    }


def selected_env(env: dict) -> dict:
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


# -- the end of the run --------------------------------------------------------------------


def proc_entries(run_dir: str) -> list[str]:
    procs = os.path.join(run_dir, "procs")
    try:
        return sorted(os.path.join(procs, n) for n in os.listdir(procs))
    except OSError:
        return []


# Shells pass the signals they ignore on to what they run (`trap '' PIPE`); Python ignores
# SIGPIPE and SIGXFSZ itself, so only a shell parent says what locus inherited for those.
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "busybox", "make", "nohup"}


def inherited_ignored(sigs: tuple[int, ...]) -> set[int]:
    """Of `sigs` (which Python's start-up sets to SIG_IGN), those the shell that started
    locus ignores, and so passed on ignored: read from its SigIgn in /proc."""
    ppid = os.getppid()
    try:
        # The executable, not the name: a shell script's process is named after the script.
        if os.path.basename(os.readlink(f"/proc/{ppid}/exe")) not in SHELLS:
            return set()
        with open(f"/proc/{ppid}/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigIgn:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return set()
    return {s for s in sigs if mask >> (s - 1) & 1}


def _starts_with(path: str, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def spawn(exe: str, command: list[str], env: dict) -> subprocess.Popen:
    """The program as its shell would start it: argv exactly as given (argv[0] too: the
    resolved path only to exec), every descriptor locus inherited (a make jobserver, `7<file`,
    socket activation), the signal dispositions locus inherited; a file without `#!` run by
    /bin/sh, as execvp does. SIGPIPE and SIGXFSZ, which Python ignores, are set for the
    fork as they were given to locus (default, or ignored by the shell that started it)."""
    py = (signal.SIGPIPE, signal.SIGXFSZ)
    keep = inherited_ignored(py)
    saved = {s: signal.getsignal(s) for s in py}
    # A umask (the current one: no change) keeps Python off posix_spawn, whose child
    # started with glibc's signals 32-33 ignored.
    umask = os.umask(0o022)
    os.umask(umask)
    kw = {"env": env, "close_fds": False, "restore_signals": False, "umask": umask}
    try:
        for s in py:
            signal.signal(s, signal.SIG_IGN if s in keep else signal.SIG_DFL)
        try:
            return subprocess.Popen(command, executable=exe, **kw)
        except OSError as e:
            # execvp's rule: a file the kernel does not take is a shell script. An ELF file
            # (another architecture) is not: "exec failed", not sh's syntax errors.
            if e.errno != errno.ENOEXEC or _starts_with(exe, b"\x7fELF"):
                raise
            return subprocess.Popen(["/bin/sh", exe, *command[1:]], **kw)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def ended(flags: int | None) -> bool:
    """Whether a proc.bin's flags say its process finished its records."""
    return flags is not None and bool(flags & PROC_FINISHED)


def entry_pid(entry: str) -> str:
    """The pid of run entry procs/PID[.K]."""
    return os.path.basename(entry).split(".")[0]


def still_running(entry: str, run_dir: str) -> bool:
    """Whether the process of run entry procs/PID[.K] still runs under this run's runtime."""
    pid = entry_pid(entry)
    return pid.isdigit() and process_of_run(int(pid), run_dir)


def unrecorded_execs(entries: list[str], flags: list[int | None]) -> list[str]:
    """Pids whose last recorded image ended in exec: the image after it went unrecorded
    (the images of one pid are procs/PID, procs/PID.1, ...)."""
    last: dict[str, tuple[int, int | None]] = {}
    for e, f in zip(entries, flags):
        pid, n = entry_pid(e), image_no(os.path.basename(e))
        if pid not in last or n >= last[pid][0]:
            last[pid] = (n, f)
    return [pid for pid, (_n, f) in last.items() if f is not None and f & PROC_EXECED]


# The bulletin board the run's processes share (runtime/comm/detect.c, XB_BYTES: a page of
# header and 4096 entries of 128 bytes), for memory they map shared. Sparse: a process maps
# it, and touches its pages, only when it samples such memory.
COMM_BOARD = "comm.board"
COMM_BOARD_BYTES = 4096 + 4096 * 128


def make_comm_board(run_dir: str) -> None:
    with open(os.path.join(run_dir, COMM_BOARD), "wb") as f:
        f.truncate(COMM_BOARD_BYTES)


PERF_MAP = "/tmp/perf-{pid}.map"


def copy_perf_maps(entries: list[str], since: float) -> int:
    """Copy each recorded process's JIT symbol map, /tmp/perf-PID.map (the file perf reads:
    the JVM writes it with -XX:+DumpPerfMapAtExit, node with --perf-basic-prof, Python 3.12+
    with -X perf), into its run entry as perf.map, so that code compiled at run time is named
    in reports read later or elsewhere. Only maps written since the run started (a pid may
    be reused). Returns the number copied."""
    n = 0
    for e in entries:
        src = PERF_MAP.format(pid=entry_pid(e))
        try:
            if os.stat(src).st_mtime < since:
                continue
            import shutil  # (only where a JIT wrote perf maps)

            shutil.copyfile(src, os.path.join(e, "perf.map"))
            n += 1
        except OSError:
            continue
    return n


def count_threads(entry: str) -> int:
    """Threads of one process: the slots of threads.bin that a thread took (a tid; a slot
    pthread_create reserved for a thread that never ran has none), else the proc.bin
    counter (which counts those slots too). At least 1: a process whose main thread never
    reached the runtime still had one."""
    n = 0
    try:
        with open(os.path.join(entry, "threads.bin"), "rb") as f:
            data = f.read()
        for off in range(0, len(data) - 63, 64):
            tid, serial = struct.unpack_from("<II", data, off)
            n += bool(tid and serial)
    except OSError:
        pass
    if n:
        return n
    try:
        with open(os.path.join(entry, "proc.bin"), "rb") as f:
            f.seek(104)
            data = f.read(8)
        if len(data) == 8:
            n = struct.unpack("<Q", data)[0]
    except OSError:
        pass
    return max(n, 1)


def exit_status(returncode: int) -> tuple[int, str | None]:
    """Shell convention: 128+N for a signal N."""
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"SIG{sig}"
        return 128 + sig, name
    return returncode, None


# -- signals -------------------------------------------------------------------------------


class SignalForwarder:
    """Forwards SIGINT/TERM/HUP/QUIT sent to the launcher to the child.

    The signals are blocked in every launcher thread and taken by sigtimedwait in one thread,
    which sees who sent them: a signal from the terminal (si_code SI_KERNEL) already reached
    the child, which is in the same process group, so it is not sent a second time.
    Python-level handlers cover the short windows before blocking and after unblocking.
    """

    def __init__(self, child: subprocess.Popen):
        self.child = child
        self.received: list[int] = []  # every signal the launcher got
        self.forwarded: list[int] = []  # those it sent on to the child
        self._stop = threading.Event()
        self._old = {s: signal.signal(s, self._handler) for s in FORWARDED_SIGNALS}
        self._thread: threading.Thread | None = None

    def _forward(self, sig: int) -> None:
        self.received.append(sig)
        if self.child.returncode is None:
            self.forwarded.append(sig)
            try:
                self.child.send_signal(sig)
            except ProcessLookupError:
                pass

    def _handler(self, sig, frame) -> None:
        self._forward(sig)

    def block(self) -> None:
        """Call before starting other threads: they inherit the blocked mask."""
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        self._thread = threading.Thread(target=self._loop, name="locus-signals", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            info = signal.sigtimedwait(FORWARDED_SIGNALS, 1.0)
            if info is None:
                continue
            if self._stop.is_set():  # the wake-up sent by restore()
                break
            if info.si_code == SI_KERNEL:
                self.received.append(info.si_signo)
            else:
                self._forward(info.si_signo)

    def restore(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # Wake the thread at once with a signal aimed at it alone (not the process).
            try:
                signal.pthread_kill(self._thread.ident, signal.SIGHUP)
            except (ProcessLookupError, OSError):
                pass
            self._thread.join()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        for s, h in self._old.items():
            signal.signal(s, h)


# -- record --------------------------------------------------------------------------------


def mapped_paths(pid: int) -> set[str]:
    """The paths in process `pid`'s maps (spaces and all: the sixth field to the line's
    end), or none when it cannot be read (ended)."""
    try:
        with open(f"/proc/{pid}/maps", errors="surrogateescape") as f:
            fields = [ln.rstrip("\n").split(None, 5) for ln in f]
    except OSError:
        return set()
    return {x[5] for x in fields if len(x) == 6}


def runtime_mapped(pid: int, runtime: str) -> bool:
    """Whether process `pid` has the runtime mapped: its image is recorded."""
    return runtime in mapped_paths(pid)


def run_pids(run_dir: str) -> list[str]:
    """The processes running now under the runtime recording into run_dir (once per run:
    an environment read per process of the machine)."""
    me = os.getpid()
    return [
        p
        for p in os.listdir("/proc")
        if p.isdigit() and int(p) != me and process_of_run(int(p), run_dir)
    ]


def image_loading(paths: set[str], runtime: str) -> bool:
    """Whether a process that maps `paths` (mapped_paths) is still loading its new image:
    its dynamic loader is mapped and neither the runtime nor libc is yet (a preload is
    mapped before libc). On a loaded machine the loader of a shell's background job was
    still at work when the grace ended, and the job was said to run unrecorded."""
    base = {os.path.basename(n) for n in paths}
    return (
        runtime not in paths
        and any(b.startswith("ld-linux") or b.startswith("ld64.so") for b in base)
        and not any(b.startswith("libc.so") for b in base)
    )


def settle(run_dir: str, runtime: str) -> tuple[list[str], list[int | None], list[str], list[str]]:
    """The run's entries and their proc.bin flags once the program has exited, with the
    entries of processes still running (a daemon: it outlived the program) and the pids of
    processes that exec'd and still run an image whose entry is not there yet.

    A process not finished yet that still runs is told apart from one that ended without
    finishing; flags are read again after that check (a process that finished meanwhile is
    finished). Both are given DAEMON_GRACE_S: a daemon that finishes its work at once
    (daemon(3), a double fork that writes a file and exits) ends with whole records, and the
    image a background child of a shell exec's (`sh -c 'prog &'`, its runtime starting as
    the shell exits) gets its entry. One that runs on is left running, and the run says so.
    An exec'd image still running without the runtime mapped when the grace ends (the
    preload dropped, static, setuid) is not recorded; one whose loader is still at work is
    waited for up to LOADING_S more, and so is a process of the run with no entry yet but
    the runtime mapped (a fork child not yet run), which is said to be still running if its
    entry does not come.
    """
    runtime = os.path.realpath(runtime)
    flags: dict[str, int | None] = {}

    def listed() -> list[str]:
        entries = proc_entries(run_dir)
        for e in entries:
            if e not in flags or not ended(flags[e]):
                flags[e] = proc_flags(os.path.join(e, "proc.bin"))
        return entries

    def in_exec(entries: list[str]) -> list[str]:
        pids = unrecorded_execs(entries, [flags[e] for e in entries])
        return [p for p in pids if process_of_run(int(p), run_dir)]

    def coming(pid: str) -> bool:  # its entry is on its way: the runtime is there, or loading
        paths = mapped_paths(int(pid))
        return runtime in paths or image_loading(paths, runtime)

    def relisted(entries: list[str], alive: list[str]) -> tuple[list[str], list[str]]:
        """The entries again, and the running ones with those that came meanwhile (a process
        that started or exec'd)."""
        known = set(entries)
        entries = listed()
        alive = alive + [e for e in entries if e not in known and not ended(flags[e])]
        return entries, [e for e in alive if still_running(e, run_dir)]

    entries = listed()
    alive = [e for e in entries if not ended(flags[e]) and still_running(e, run_dir)]
    # Processes of the run with no entry: a fork child that has not run yet on a loaded
    # machine (a shell's background job), which the run then left out without a word.
    unlisted = [p for p in run_pids(run_dir) if p not in {entry_pid(e) for e in entries}]
    entries, alive = relisted(entries, alive)
    deadline = time.monotonic() + DAEMON_GRACE_S
    while True:
        alive = [e for e in alive if not ended(flags[e])]
        execing = in_exec(entries)
        have = {entry_pid(e) for e in entries}
        starting = [p for p in unlisted if p not in have and process_of_run(int(p), run_dir)]
        now = time.monotonic()
        if (not alive and not execing and not starting) or now >= deadline + LOADING_S:
            break
        if (
            now >= deadline
            and not any(image_loading(mapped_paths(int(p)), runtime) for p in execing)
            and not any(coming(p) for p in starting)
        ):
            break
        time.sleep(0.005)
        entries, alive = relisted(entries, alive)
    running = [e for e in alive if not ended(flags[e])]
    # Still in exec after the grace: running the runtime (its entry comes), or not recorded.
    execing = [p for p in execing if runtime_mapped(int(p), runtime)]
    execing += [p for p in starting if coming(p)]  # no entry yet: still running
    return entries, [flags[e] for e in entries], running, execing


# How long the launcher waits, after the program exits, for processes it left running (a
# daemon) to finish their records before it reports them as still running.
DAEMON_GRACE_S = 0.2
# How much longer it waits for an exec'd image whose loader is still at work, and for a
# process of the run that has no records yet but the runtime mapped (a fork child not yet run).
LOADING_S = 2.0


def record(
    command: list[str],
    out: str | None = None,
    lenses: list[str] | None = None,
    call_stack: bool = False,
    sample_interval_ms: float | None = None,
    time_all: bool = False,
    comm: dict | None = None,
    numa: dict | None = None,
    monitor: dict | None = None,
) -> int:
    """Run `command` under locus; return the exit code the launcher should exit with.

    `comm`: the address-sampling options shared by the comm and numa lenses (keys of
    COMM_DEFAULTS; None or missing = default). `numa`: {"fake": N or None}. `monitor`:
    {"interval_s": seconds or None, "events": [ids or globs] or None}."""
    if not command:
        raise LocusError("no command given (locus record -- CMD ARGS...)", 2)
    lenses = list(lenses or ["locks"])
    unknown = [x for x in lenses if x not in KNOWN_LENSES]
    if unknown:
        raise LocusError(f"unknown lens {','.join(unknown)} (known: {', '.join(KNOWN_LENSES)})", 2)
    if sample_interval_ms is None:
        # The locks lens's service times (its critical path, the speed-up lost to waits)
        # want the finer period; the others read the samples only for notes (tasks the
        # runtime never saw, more runnable tasks than CPUs). Each tick wakes the launcher,
        # whose sampler then takes a CPU from the program when the program keeps them all
        # busy: comm_writevol's 2 threads on 2 CPUs had 156 involuntary switches a run at 10
        # ms against 71 at 50, and ran x1.088 against x1.071 of its plain time (12 rounds).
        sample_interval_ms = SAMPLE_INTERVAL_MS if "locks" in lenses else SAMPLE_INTERVAL_OTHER_MS
    if sample_interval_ms <= 0:
        raise LocusError("--sample-interval must be positive", 2)

    exe = resolve_command(command[0])
    machine = elf_machine(exe)
    if machine is not None and machine != os.uname().machine:
        # ld.so's own error in the program's stderr ("wrong ELF class"), and then "may be
        # setuid", said neither what nor why.
        raise LocusError(
            f"{command[0]} is built for {machine} and locus's runtime for "
            f"{os.uname().machine}: the loader cannot preload it there; record a native build",
            2,
        )
    if elf_is_static(exe):
        raise LocusError(
            f"{command[0]} is statically linked: LD_PRELOAD interposition cannot see its "
            "calls; relink it dynamically",
            2,
        )
    sampling = "comm" in lenses or "numa" in lenses
    comm_settings = resolve_comm(comm, exe, command) if sampling else None
    if comm_settings and comm_settings["backend"] in ("soft", "hw"):
        perfwarm.start()  # (already under way when cli.main saw the lens)
    else:
        perfwarm.stop()
    if comm_settings and comm_settings["instrumented"]:
        print(
            f"locus: note: {os.path.basename(comm_settings['instrumented'])} is built with "
            f"`locus cc`: its hooks slow it under the {comm_settings['backend']} backend too; "
            "--backend exact counts every transfer",
            file=sys.stderr,
        )
    numa_settings = resolve_numa(numa, comm_settings) if "numa" in lenses else None
    runtime = find_runtime()
    check_runtime_abi([exe, (comm_settings or {}).get("module")], runtime)
    sanitizers = sanitizer_runtimes(exe)
    if sampling and any("libtsan" in lib for lib in sanitizers):
        raise LocusError(
            f"{command[0]} is a ThreadSanitizer build (libtsan): its runtime defers the "
            "signals the comm and numa lenses sample with, and the program died of SIGSEGV "
            "under them; record its plain build, or build it with `locus cc` for "
            "--backend exact (--lens locks works on it)",
            2,
        )
    if sanitizers:
        names = ", ".join(os.path.basename(lib) for lib in sanitizers)
        print(
            f"locus: note: {command[0]} is a sanitizer build ({names}, preloaded before "
            "locus's runtime): what is measured is the instrumented program, and its heap "
            "blocks come from the sanitizer's allocator, which locus does not see (heap "
            "objects are not named)",
            file=sys.stderr,
        )
    engine = fifo = None
    if "monitor" in lenses:
        # Built before the run directory: unknown events or a FIFO that cannot be created
        # fail without leaving one behind.
        from locus.monitor.engine import Monitor
        from locus.monitor.fifo import ControlFifo

        mo = monitor or {}
        engine = Monitor(mo.get("interval_s") or MONITOR_INTERVAL_S, mo.get("events"))
        fifo = ControlFifo(engine)

    now = time.localtime()
    try:
        run_dir = create_run_dir(out, command, now)
    except BaseException:
        stop_monitor(engine, fifo, {})
        raise
    meta_path = os.path.join(run_dir, "meta.json")
    start_wall = time.time() - 1.0  # mtimes have a coarse clock on some filesystems

    env = dict(os.environ)
    preload = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = ":".join([*sanitizers, runtime] + ([preload] if preload else []))
    env["LOCUS_DIR"] = run_dir
    # The numa lens takes its samples from the comm lens's samplers: the runtime runs comm
    # too, without the communication detector when comm was not asked for.
    runtime_lenses = lenses + (["comm"] if "numa" in lenses and "comm" not in lenses else [])
    env["LOCUS_LENSES"] = ",".join(runtime_lenses)
    env["LOCUS_CALL_STACK"] = "1" if call_stack else "0"
    env["LOCUS_TIME_ALL"] = "1" if time_all else "0"
    if comm_settings is not None:
        env.update(comm_env(comm_settings))
        env["LOCUS_COMM_DETECT"] = "1" if "comm" in lenses else "0"
    if numa_settings is not None:
        env.update(numa_env(numa_settings))

    meta = {
        "format_version": FORMAT_VERSION,
        "locus_version": __version__,
        "command": list(command),
        "executable": exe,
        "cwd": os.getcwd(),
        "env": selected_env(env),
        "runtime": runtime,
        "start_time": local_iso(now),
        "start_unix": time.time(),
        "start_ns": time.monotonic_ns(),
        "end_ns": None,
        "duration_s": None,
        "exit_status": None,
        "signal": None,
        "complete": False,
        "host": host_info(),
        "lenses": lenses,
        "backends": {
            lens: comm_settings["backend"]
            if lens in ("comm", "numa") and comm_settings
            else BACKENDS[lens]
            for lens in lenses
        },
        "options": {
            "call_stack": call_stack,
            "sample_interval_ms": sample_interval_ms,
            "time_all": time_all,
        },
        "sampler": {"interval_ms": sample_interval_ms},
    }
    if comm_settings is not None and "comm" in lenses:
        meta["comm"] = {k: v for k, v in comm_settings.items() if k != "module"}
        if comm_settings["backend"] in ("soft", "hw"):
            make_comm_board(run_dir)
            meta["comm"]["between_processes"] = "runtime"
    if numa_settings is not None:
        meta["numa"] = numa_settings
    if engine is not None:
        start_monitor(engine, fifo, run_dir, env, meta)
    write_json_atomic(meta_path, meta)

    meta["start_ns"] = time.monotonic_ns()
    meta["start_unix"] = time.time()
    if engine is not None:
        engine.start()
    try:
        child = spawn(exe, command, env)
    except OSError as e:
        # Raced with a file change, or exec failed (bad interpreter, wrong architecture).
        stop_monitor(engine, fifo, meta)
        meta["error"] = f"exec failed: {e.strerror}"
        write_json_atomic(meta_path, meta)
        raise LocusError(f"{command[0]}: {e.strerror}", 126) from None
    forwarder = SignalForwarder(child)
    sampler = None
    try:
        forwarder.block()
        # Closed once the program runs: the kernel keeps its hooks on for a second after
        # the last event closes, long enough for the runtime's first one; held for the whole
        # run, it would keep them on for a program whose threads all left the task clock.
        perfwarm.stop()
        sampler = Sampler(run_dir, child.pid, sample_interval_ms)
        sampler.start()
        child.wait()
    finally:
        end_ns = time.monotonic_ns()
        if child.returncode is None:  # the launcher itself failed: do not leave an orphan
            child.kill()
            child.wait()
        if sampler is not None:
            sampler.stop()
        perfwarm.stop()
        stop_monitor(engine, fifo, meta)
        status, signame = exit_status(child.returncode)
        entries, finished, running, execing = settle(run_dir, runtime)
        copy_perf_maps(entries, start_wall)
        # Every process finished its records: at exit, at exec, or in the runtime's handler
        # of a fatal signal (a crash or SIGTERM: the records are whole up to it). SIGKILL
        # leaves them unfinished.
        all_ended = bool(entries) and all(ended(f) for f in finished) and not execing
        threads = sum(count_threads(e) for e in entries)
        meta.update(
            end_ns=end_ns,
            duration_s=round((end_ns - meta["start_ns"]) / 1e9, 6),
            exit_status=status,
            signal=signame,
            complete=all_ended,
            processes=len(entries),
            threads=threads,
            signals_received=[signal.Signals(s).name for s in forwarder.received],
            signals_forwarded=[signal.Signals(s).name for s in forwarder.forwarded],
        )
        if sampler is not None:
            meta["sampler"] = sampler.stats()
        try:
            write_json_atomic(meta_path, meta)
        except OSError as e:
            # The program ran: its exit status stands; the run directory says it was not
            # finished (meta.json keeps what was written at the start).
            try:
                os.unlink(meta_path + ".tmp")
            except OSError:
                pass
            print(
                f"locus: warning: cannot finish {meta_path}: {e.strerror}; the run is "
                "incomplete (its end, exit status and counts are missing)",
                file=sys.stderr,
            )
        forwarder.restore()

    if not entries:
        print(
            f"locus: warning: the runtime recorded no process: {command[0]} may be setuid, "
            "may clear LD_PRELOAD, or stopped before the runtime started (see its own "
            "messages above)",
            file=sys.stderr,
        )
    for pid in unrecorded_execs(entries, finished):
        if pid in execing:  # said below, with the processes still running
            continue
        print(
            f"locus: warning: process {pid} exec'd a program the runtime did not record (it "
            "dropped LD_PRELOAD, as `env -u LD_PRELOAD` does, or is setuid or static)",
            file=sys.stderr,
        )
    boxed = [e for e, f in zip(entries, finished) if f is not None and f & PROC_SANDBOXED]
    if boxed:
        pids = ", ".join(os.path.basename(e) for e in boxed[:4]) + (
            ", ..." if len(boxed) > 4 else ""
        )
        print(
            f"locus: note: {len(boxed)} process{'es' if len(boxed) != 1 else ''} ({pids}) "
            "installed a seccomp filter: each is recorded up to the filter, not after (the "
            "filter could refuse the runtime's system calls)",
            file=sys.stderr,
        )
    # A process still running after the program exited (daemon(), a double fork) has not
    # finished its records yet: the report reads them as whole once it has.
    for pid in [entry_pid(e) for e in running] + execing:
        print(
            f"locus: warning: a process (pid {pid}) was still "
            "running when the program exited (daemon?): its records may be incomplete if you "
            "report before it ends",
            file=sys.stderr,
        )
    if entries and not meta["complete"] and len(running) < sum(not ended(f) for f in finished):
        print(
            "locus: warning: the run is incomplete: a process ended without finishing its "
            "records (killed, or exited without running its exit handlers: a raw exit_group, "
            "as Go programs do); its last records may be missing",
            file=sys.stderr,
        )
    print(
        f"locus: run written to {display_path(run_dir)} "
        f"({len(entries)} process{'es' if len(entries) != 1 else ''}, "
        f"{threads} thread{'s' if threads != 1 else ''})",
        file=sys.stderr,
    )
    return status


def start_monitor(engine, fifo, run_dir: str, env: dict, meta: dict) -> None:
    """The monitor lens: the recording in the run directory, the control FIFO's path for
    the program (LOCUS_MONITOR_FIFO, for `locus_label()`), and meta.json's monitor key."""
    from locus.monitor.engine import interval_ms

    try:
        engine.record_to(os.path.join(run_dir, MONITOR_FILE))
    except OSError as e:
        stop_monitor(engine, fifo, {})
        raise LocusError(f"{MONITOR_FILE}: {e.strerror}") from None
    env["LOCUS_MONITOR_FIFO"] = fifo.path
    meta["env"]["LOCUS_MONITOR_FIFO"] = fifo.path
    meta["monitor"] = {
        "interval_ms": interval_ms(engine.interval_s),
        "events": [e.id for e in engine.events],
        "file": MONITOR_FILE,
        "fifo": fifo.path,
        "absent": dict(engine.absent),
    }
    print(f"locus: control FIFO: {fifo.path}", file=sys.stderr)
    for line in engine.absent_lines():
        print(line, file=sys.stderr)


def stop_monitor(engine, fifo, meta: dict) -> None:
    """Stop the monitor after one last sample (the program's final moments), close the
    FIFO, count the samples in meta.json. Safe to call twice."""
    if engine is None:
        return
    engine.stop(final_sample=True)
    if fifo is not None:
        fifo.close()
    if "monitor" in meta:
        meta["monitor"]["samples"] = engine.samples


def display_path(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel
