"""Service-time sampler: the launcher's view of how much CPU every recorded task received.

Runs as a thread of the launcher (outside the target, so it costs the target nothing but the
CPU time it takes, which is measured). Every tick it appends one `struct locus_sched_sample`
(runtime/include/locus_format.h) per task of every recorded process, plus one system row
(tid 0) whose `service_ns` holds the number of runnable tasks on the machine.

Why it is shaped this way:
- The per-task counters are re-read with pread() on file descriptors kept open: procfs
  regenerates a seq_file at offset 0, so one syscall per task per tick is the whole cost.
- Processes are found from the runtime's `procs/<pid>` directories (cheap, and catches
  daemonised children) and, at a lower rate, by walking `/proc/PID/task/TID/children` from
  the launched child (catches descendants the runtime cannot see, e.g. static binaries).
- With many tasks, each task is read (and the task lists re-listed) only every `stride`-th
  tick. The stride adapts once per window (10 ticks, or one stride if longer) so that the
  per-task work stays under `cpu_budget` of one CPU (2 %), and so that one tick never
  reads more than `max_reads_per_tick` files; the largest stride used goes into meta.
"""

from __future__ import annotations

import os
import select
import struct
import threading
import time

SAMPLE = struct.Struct("<QQIIII")  # struct locus_sched_sample, 32 bytes
assert SAMPLE.size == 32

PROC_FLAGS_OFFSET = 76  # struct locus_proc.flags
PROC_EXITED = 1
PROC_SIGNALED = 2  # records finished by the runtime's fatal-signal handler
PROC_EXECED = 4
PROC_FORKED = 8
PROC_SANDBOXED = 16  # installed a seccomp filter: its records end there (sandbox_ns)
# The process's records are finished: it exited, exec'd, died of a signal the runtime saw,
# or installed a seccomp filter (it may go on, unrecorded).
PROC_FINISHED = PROC_EXITED | PROC_EXECED | PROC_SIGNALED | PROC_SANDBOXED


def image_no(key: str) -> int:
    """The image of a run entry (its directory's name): 0 for procs/PID, K for procs/PID.K
    (after K execs)."""
    k = key.partition(".")[2]
    return int(k) if k.isdigit() else 0


DESCENDANTS_EVERY_NS = 200_000_000  # the /proc children walk (20 ticks of 10 ms)
RECORDED_EVERY_NS = 50_000_000  # the procs/ listing (5 ticks of 10 ms)

# Keep at most this many descriptors open; beyond it, files are opened per read.
MAX_CACHED_FDS = 512


def proc_flags(path: str) -> int | None:
    """The flags word of a proc.bin, or None if it is missing or too short."""
    try:
        with open(path, "rb") as f:
            f.seek(PROC_FLAGS_OFFSET)
            data = f.read(4)
    except OSError:
        return None
    if len(data) != 4:
        return None
    return struct.unpack("<I", data)[0]


def process_of_run(pid: int, run_dir: str) -> bool:
    """Whether process `pid` runs now under the runtime recording into `run_dir` (the
    LOCUS_DIR of its environment, an absolute path): a process still writing its records,
    such as a daemon that outlived the program. A zombie's environment reads empty."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False
    for item in env.split(b"\0"):
        if item.startswith(b"LOCUS_DIR="):
            return os.path.realpath(os.fsdecode(item[10:])) == os.path.realpath(run_dir)
    return False


def parse_schedstat(data: bytes) -> int:
    """First field of /proc/.../schedstat: nanoseconds spent running on a CPU."""
    return int(data.split(None, 1)[0])


def parse_schedstat_switches(data: bytes) -> int:
    """Third field of /proc/.../schedstat: the times the task was switched in (its
    timeslices), 0 when absent."""
    f = data.split()
    return int(f[2]) if len(f) > 2 else 0


def parse_stat_service(data: bytes, clk_tck: int) -> int:
    """utime+stime of a /proc/.../stat line, in nanoseconds (fallback without schedstat)."""
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    ticks = int(fields[11]) + int(fields[12])
    return ticks * 1_000_000_000 // clk_tck


def parse_running(data: bytes) -> int:
    """Runnable tasks from /proc/loadavg ("0.1 0.2 0.3 RUNNING/TOTAL LASTPID")."""
    return int(data.split()[3].split(b"/")[0])


class Sampler(threading.Thread):
    """Samples until stop() is called; stats() gives what goes into meta.json."""

    def __init__(
        self,
        run_dir: str,
        root_pid: int,
        interval_ms: float = 10.0,
        max_reads_per_tick: int = 128,
        cpu_budget: float = 0.02,
        proc_root: str = "/proc",
    ):
        super().__init__(name="locus-sampler", daemon=True)
        self.run_dir = run_dir
        self.root_pid = root_pid
        self.interval_ns = max(1, int(interval_ms * 1e6))
        # Discovery keeps its pace in time whatever the interval: descendants (a raw clone, a
        # static child) every ~200 ms, the runtime's new process entries every ~50 ms.
        self.find_every = max(1, round(DESCENDANTS_EVERY_NS / self.interval_ns))
        self.recorded_every = max(1, round(RECORDED_EVERY_NS / self.interval_ns))
        self.max_reads = max(1, max_reads_per_tick)
        self.cpu_budget = cpu_budget
        self.stride = 1  # adapted by _adapt_stride
        self._task_work_ns = 0  # CPU time of the work that grows with the number of tasks
        self.proc = proc_root
        self._stopping = False
        # stop() writes a byte here, which ends the sampler's wait at once (_nap).
        self._wake_r, self._wake_w = os.pipe()
        self._tasks: dict[int, tuple[int, int | None]] = {}  # tid -> (pid, fd or None)
        self._pids: set[int] = {root_pid}
        self._finished_entries: set[str] = set()
        self.use_schedstat = os.path.exists(f"{proc_root}/self/schedstat")
        self._switches = 0  # the last _read_task's switch count
        self.clk_tck = os.sysconf("SC_CLK_TCK")
        self.ticks = 0
        self.late_ticks = 0
        self.rows = 0
        self.max_tasks = 0
        self.max_stride = 1
        self.cpu_s = 0.0
        self.error: str | None = None
        self._loadavg_fd: int | None = None

    # -- discovery -------------------------------------------------------------------------

    def _recorded_pids(self) -> set[int]:
        """Pids of procs/<pid>[.k] entries whose process has not finished."""
        pids = set()
        procs = os.path.join(self.run_dir, "procs")
        try:
            names = os.listdir(procs)
        except OSError:
            return pids
        for name in names:
            if name in self._finished_entries:
                continue
            flags = proc_flags(os.path.join(procs, name, "proc.bin"))
            if flags is not None and flags & (PROC_EXITED | PROC_EXECED):
                self._finished_entries.add(name)
                continue
            try:
                pids.add(int(name.split(".", 1)[0]))
            except ValueError:
                pass
        return pids

    def _descendants(self) -> set[int]:
        """The launched child and its descendants, via the `children` files of each task."""
        found = {self.root_pid}
        todo = [self.root_pid]
        while todo:
            pid = todo.pop()
            try:
                tids = os.listdir(f"{self.proc}/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"{self.proc}/{pid}/task/{tid}/children", "rb") as f:
                        kids = f.read().split()
                except OSError:
                    continue
                for k in kids:
                    c = int(k)
                    if c not in found:
                        found.add(c)
                        todo.append(c)
        return found

    def _open_task(self, pid: int, tid: int) -> int | None:
        if len(self._tasks) >= MAX_CACHED_FDS:
            return None
        name = "schedstat" if self.use_schedstat else "stat"
        try:
            return os.open(f"{self.proc}/{pid}/task/{tid}/{name}", os.O_RDONLY)
        except OSError:
            return None

    def _refresh_tasks(self) -> None:
        alive: set[int] = set()
        for pid in self._pids:
            try:
                tids = os.listdir(f"{self.proc}/{pid}/task")
            except OSError:
                continue
            for t in tids:
                tid = int(t)
                alive.add(tid)
                if tid not in self._tasks:
                    self._tasks[tid] = (pid, self._open_task(pid, tid))
        for tid in [t for t in self._tasks if t not in alive]:
            self._drop(tid)
        self.max_tasks = max(self.max_tasks, len(self._tasks))

    def _drop(self, tid: int) -> None:
        _, fd = self._tasks.pop(tid)
        if fd is not None:
            os.close(fd)

    # -- reading ---------------------------------------------------------------------------

    def _read_task(self, pid: int, tid: int, fd: int | None) -> int | None:
        """The task's service time (ns); its switch count in self._switches."""
        try:
            if fd is not None:
                data = os.pread(fd, 256, 0)
            else:
                name = "schedstat" if self.use_schedstat else "stat"
                fd = os.open(f"{self.proc}/{pid}/task/{tid}/{name}", os.O_RDONLY)
                try:
                    data = os.read(fd, 512)
                finally:
                    os.close(fd)
            if not data:
                return None
            if self.use_schedstat:
                self._switches = parse_schedstat_switches(data)
                return parse_schedstat(data)
            self._switches = 0
            return parse_stat_service(data, self.clk_tck)
        except (OSError, ValueError, IndexError):
            return None

    def _read_running(self) -> int:
        try:
            if self._loadavg_fd is None:
                self._loadavg_fd = os.open(f"{self.proc}/loadavg", os.O_RDONLY)
            return parse_running(os.pread(self._loadavg_fd, 128, 0))
        except (OSError, ValueError, IndexError):
            return 0

    def sample_once(self, out, buf: bytearray) -> None:
        """One tick: system row, then every task due this tick."""
        t = time.monotonic_ns()
        del buf[:]
        buf += SAMPLE.pack(t, self._read_running(), 0, 0, 0, 0)
        n = len(self._tasks)
        stride = max(self.stride, -(-n // self.max_reads) if n else 1)
        self.max_stride = max(self.max_stride, stride)
        dead = []
        cpu0 = time.thread_time_ns()
        for tid, (pid, fd) in self._tasks.items():
            if stride > 1 and (self.ticks + tid) % stride:
                continue
            self._switches = 0
            service = self._read_task(pid, tid, fd)
            if service is None:
                dead.append(tid)
                continue
            # reserved[0]: the task's context switches (schedstat timeslices), mod 2^32.
            buf += SAMPLE.pack(t, service, pid, tid, self._switches & 0xFFFFFFFF, 0)
        for tid in dead:
            self._drop(tid)
        self._task_work_ns += time.thread_time_ns() - cpu0
        out.write(buf)
        self.rows += len(buf) // SAMPLE.size
        self.ticks += 1

    # -- thread ----------------------------------------------------------------------------

    def run(self) -> None:
        cpu0 = time.thread_time()
        try:
            self._loop()
        except Exception as e:  # never take the launcher down; say it in meta
            self.error = f"{type(e).__name__}: {e}"
        finally:
            for tid in list(self._tasks):
                self._drop(tid)
            if self._loadavg_fd is not None:
                os.close(self._loadavg_fd)
            self.cpu_s = time.thread_time() - cpu0

    def _loop(self) -> None:
        buf = bytearray()
        path = os.path.join(self.run_dir, "sched.bin")
        with open(path, "ab", buffering=1 << 16) as out:
            next_t = time.monotonic_ns()
            window = 0
            while not self._stopping:
                cpu0 = time.thread_time_ns()
                if self.ticks % (self.find_every * self.stride) == 0:
                    self._pids = self._descendants() | self._recorded_pids()
                elif self.ticks % (self.recorded_every * self.stride) == 0:
                    self._pids |= self._recorded_pids()
                if self.ticks % self.stride == 0:
                    self._refresh_tasks()
                self._task_work_ns += time.thread_time_ns() - cpu0
                self.sample_once(out, buf)
                window += 1
                if window >= max(10, self.stride):
                    # A window covers at least one full cycle of the stride, so periodic
                    # costs (listing, discovery) are counted once per cycle. The first
                    # window holds one-off costs (first listings, the target's start-up):
                    # it would back off for nothing.
                    if self.ticks > window:
                        self._adapt_stride(self._task_work_ns * self.stride / window)
                    self._task_work_ns = 0
                    window = 0
                next_t += self.interval_ns
                now = time.monotonic_ns()
                if now >= next_t:
                    # Behind schedule: skip the missed ticks rather than bursting.
                    missed = (now - next_t) // self.interval_ns + 1
                    self.late_ticks += missed
                    next_t += missed * self.interval_ns
                # Long intervals wait in slices (a stop() between two is seen at the next).
                self._nap(min(next_t - now, 50_000_000) / 1e9)
                while not self._stopping and time.monotonic_ns() < next_t - 1_000_000:
                    self._nap(min(next_t - time.monotonic_ns(), 50_000_000) / 1e9)

    def _nap(self, seconds: float) -> None:
        """Wait `seconds`, or until stop(). One system call, as time.sleep was (an
        Event.wait, a condition variable per tick, costs more than the tick's own reads),
        but stop() ends it: the launcher waited for the sampler's current sleep, up to a
        whole interval (10 ms), at the end of every run."""
        if self._wake_r >= 0:
            select.select([self._wake_r], [], [], max(0.0, seconds))
        else:
            time.sleep(max(0.0, seconds))

    def _adapt_stride(self, full: float) -> None:
        """Choose the stride whose per-task work fits the CPU budget.

        `full` is the CPU time (ns) of one full cycle of discovery, listing and reading
        every task once. Spread over `stride` ticks it must cost at most
        `cpu_budget * interval` per tick. The fixed cost of a tick (system row, sleeping)
        does not shrink with the stride, so it is left out.
        """
        budget_ns = self.cpu_budget * self.interval_ns
        self.stride = int(min(1000, max(1, -(-full // budget_ns))))
        self.max_stride = max(self.max_stride, self.stride)

    def _wake(self) -> None:
        """End the wait under way, and every later one."""
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        if self.is_alive():
            self.join()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def stats(self) -> dict:
        return {
            "interval_ms": self.interval_ns / 1e6,
            "source": "schedstat" if self.use_schedstat else "stat",
            "system_source": "loadavg",
            "ticks": self.ticks,
            "late_ticks": self.late_ticks,
            "rows": self.rows,
            "max_tasks": self.max_tasks,
            "max_reads_per_tick": self.max_reads,
            "cpu_budget": self.cpu_budget,
            "max_stride": self.max_stride,
            "final_stride": self.stride,
            "backed_off": self.max_stride > 1,
            "cpu_s": round(self.cpu_s, 6),
            "error": self.error,
        }
