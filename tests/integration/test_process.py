"""The launcher as a process: kills, forwarded signals, pass-through of stdio and exit status,
and clean errors (one line, no traceback) on bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

READY = b"ready"


def start_killme(locus, *options: str):
    run = locus.new_dir("kill")
    proc = locus.popen(
        "record",
        "-o",
        str(run),
        *options,
        "--",
        locus.workload("killme"),
        "500",
        "2",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a signal for the launcher never reaches pytest
    )
    try:
        line = locus.wait_for_line(proc.stderr, READY, timeout=30)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    target = int(line.split()[2])
    time.sleep(0.5)  # ~250 acquisitions per thread
    return proc, run, target


def finish(proc) -> tuple[int, bytes]:
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, err


def test_sigkill_of_target_leaves_incomplete_run(locus):
    proc, run, target = start_killme(locus)
    os.kill(target, signal.SIGKILL)
    rc, err = finish(proc)
    assert rc == 128 + signal.SIGKILL, err
    assert b"Traceback" not in err
    rep = locus.report(run)
    assert rep["run"]["complete"] is False
    assert locus.lock_acquisitions(rep, "killme_lock") > 100


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_is_forwarded(locus, sig):
    proc, run, target = start_killme(locus)
    os.kill(proc.pid, sig)
    rc, err = finish(proc)
    assert rc == 128 + sig, (rc, err)
    assert b"Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(target, 0)
    rep = locus.report(run)
    assert locus.lock_acquisitions(rep, "killme_lock") > 100
    assert rep["run"]["exit_status"] == 128 + sig


# Processes ended by a signal nobody handles, other than by the launcher: SIGPIPE is how
# `yes | head` ends yes, SIGALRM an alarm() with no handler, SIGXCPU a soft CPU-time limit.
ENDED_BY = {
    "SIGPIPE": "yes | head -n 1000 > /dev/null",
    "SIGALRM": "perl -e 'alarm 1; sleep 10'; true",
    "SIGXCPU": "ulimit -S -t 1; perl -e '1 while 1'; true",
}


@pytest.mark.parametrize("name", sorted(ENDED_BY))
def test_a_process_ended_by_a_signal_finishes_its_records(locus, name):
    """Their runtime only caught the signals of a crash and of kill's usual ones: `yes |
    head` left its run incomplete ("a process ended without finishing its records (killed,
    or ... a raw exit_group)"), for a pipeline as plain as any shell's."""
    sig = getattr(signal, name)
    run = locus.new_dir()
    proc = locus.run("record", "--lens", "comm", "-o", str(run), "--", "sh", "-c", ENDED_BY[name])
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err
    assert "incomplete" not in err, err
    meta = json.loads((run / "meta.json").read_text())
    assert meta["complete"] is True, err
    ended = []
    for e in (run / "procs").iterdir():
        b = (e / "proc.bin").read_bytes()
        flags = int.from_bytes(b[76:80], "little")
        status = int.from_bytes(b[72:76], "little", signed=True)
        if flags & 2:  # PROC_SIGNALED
            ended.append(status)
    assert ended == [-sig], ended
    assert locus.report(run)["run"]["complete"] is True


def test_stdio_and_exit_status_pass_through(locus):
    run = locus.new_dir()
    script = "cat; echo to-stderr >&2; exit 3"
    proc = locus.run("record", "-o", str(run), "--", "sh", "-c", script, input=b"line 1\nline 2\n")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == b"line 1\nline 2\n"
    assert b"to-stderr\n" in proc.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert meta["exit_status"] == 3


def test_target_stdout_is_byte_exact_binary(locus):
    data = bytes(range(256)) * 4096
    src = locus.tmp / "blob"
    src.write_bytes(data)
    proc = locus.run("record", "-o", str(locus.new_dir()), "--", "cat", str(src))
    assert proc.returncode == 0
    assert proc.stdout == data


def one_clean_error(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines, "no error message"
    return err


def test_unknown_option_exits_2(locus):
    proc = locus.run("record", "--no-such-option", "--", "true")
    assert proc.returncode == 2
    one_clean_error(proc)


def test_missing_command_exits_127(locus):
    proc = locus.run("record", "-o", str(locus.new_dir()), "--", "/nonexistent/program")
    assert proc.returncode == 127
    err = one_clean_error(proc)
    assert "/nonexistent/program" in err
    assert len(err.strip().splitlines()) == 1, err


def test_no_command_is_a_usage_error(locus):
    proc = locus.run("record", "-o", str(locus.new_dir()))
    assert proc.returncode == 2
    one_clean_error(proc)


def test_report_of_a_directory_that_is_not_a_run(locus):
    empty = locus.tmp / "not-a-run"
    empty.mkdir()
    (empty / "some.txt").write_text("hello\n")
    proc = locus.report_raw(empty)
    err = one_clean_error(proc)
    assert len(err.strip().splitlines()) == 1, err
    # Another tool's directory with a meta.json of its own.
    (empty / "meta.json").write_text('{"tool": "other", "a": 1}')
    err = one_clean_error(locus.report_raw(empty, "--lens", "comm"))
    assert "is not a locus run directory (its meta.json is not locus's)" in err, err


def test_report_of_a_missing_directory(locus):
    proc = locus.report_raw(locus.tmp / "nowhere")
    err = one_clean_error(proc)
    assert len(err.strip().splitlines()) == 1, err


@pytest.fixture
def small_run(locus):
    _, run = locus.record([locus.workload("schedule"), "200"])
    return run


def test_report_of_a_truncated_events_file(locus, small_run):
    events = next(small_run.glob("procs/*/locks.events.bin"))
    size = events.stat().st_size
    assert size > 64
    with open(events, "r+b") as f:
        f.truncate(size - 64 - 17)  # cut inside a record
    proc = locus.report_raw(small_run)
    locus.no_traceback(proc)
    if proc.returncode == 0:
        json.loads(proc.stdout)  # a partial record is skipped, the rest is reported
    else:
        assert len(proc.stderr.decode().strip().splitlines()) == 1, proc.stderr


def test_report_of_a_newer_format(locus, small_run):
    meta_path = small_run / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = meta["format_version"] + 1
    meta_path.write_text(json.dumps(meta))
    proc = locus.report_raw(small_run)
    err = one_clean_error(proc)
    assert "version" in err.lower(), err
    assert len(err.strip().splitlines()) == 1, err


def test_report_of_a_lens_not_recorded(locus, small_run):
    meta_path = small_run / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["lenses"] = []
    meta_path.write_text(json.dumps(meta))
    for f in small_run.glob("procs/*/locks.*"):
        f.unlink()
    proc = locus.report_raw(small_run, "--lens", "locks")
    err = one_clean_error(proc)
    assert "locks" in err, err
    assert len(err.strip().splitlines()) == 1, err


CLOSER = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
static volatile long shared[2];
static void *w(void *a) {
  long k = (long)a;
  for (long i = 0; i < 100000000; i++) shared[k] += i;
  return 0;
}
int main(int argc, char **argv) {
  /* As daemons do: close every descriptor they did not open themselves. */
  if (!strcmp(argv[1], "raw")) syscall(SYS_close_range, 3, ~0U, 0);
  if (!strcmp(argv[1], "wrapper")) close_range(3, ~0U, 0);
  if (!strcmp(argv[1], "closefrom")) closefrom(3);
  if (!strcmp(argv[1], "loop")) for (int fd = 3; fd < 4096; fd++) close(fd);
  /* Worse: the raw syscall, then its own file on every number the runtime had open. */
  int theirs[256], n = 0;
  if (!strcmp(argv[1], "reuse")) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 256)
      if (atoi(e->d_name) > 2 && atoi(e->d_name) != dirfd(d)) theirs[n++] = atoi(e->d_name);
    closedir(d);
    syscall(SYS_close_range, 3, ~0U, 0);
  }
  int fds[8];
  char name[4200];
  for (int i = 0; i < 8; i++) {
    snprintf(name, sizeof name, "%s.%d", argv[2], i);
    fds[i] = open(name, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (write(fds[i], "hello\n", 6) != 6) return 1;
  }
  for (int i = 0; i < n; i++) syscall(SYS_dup3, fds[0], theirs[i], 0); /* past any interposer */
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, w, (void *)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
  for (int i = 0; i < 8; i++) close(fds[i]);
  return 0;
}
"""


@pytest.mark.parametrize("how", ["raw", "wrapper", "closefrom", "loop", "reuse"])
def test_program_closing_every_descriptor(locus, tmp_path, how):
    """A program that closes every descriptor it did not open (close_range, closefrom, a
    close() loop, or the raw syscall) and then opens files of its own. The runtime's record
    files must not become the program's: its files were filled with 1 MiB of locus records
    before (the reused descriptor numbers). They stay 6 bytes, and the run keeps its
    samples (the runtime's descriptors survive, or are reopened by path after a raw
    close_range). `reuse`: the program also puts its own file on every number the runtime
    had, with the raw dup3 syscall (a Go program, or any that bypasses libc); an open
    descriptor was taken for ours, and the records went into its file, until the runtime
    checked what the number names."""
    src, exe = tmp_path / "closer.c", tmp_path / "closer"
    src.write_text(CLOSER)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    out = tmp_path / "out"
    proc, run = locus.record([str(exe), how, str(out)], ("--lens", "comm,locks"))
    assert proc.returncode == 0
    sizes = [os.path.getsize(f"{out}.{i}") for i in range(8)]
    assert sizes == [6] * 8, sizes
    rep = locus.report(run, "--lens", "comm")
    assert rep["run"]["complete"] is True
    assert rep["lenses"]["comm"]["samples"] > 20


TERMCHILD = r"""
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
  for (int k = 0; k < 6; k++) {
    int p[2];
    if (pipe(p) != 0) return 1;
    pid_t c = fork();
    if (c == 0) {
      if (write(p[1], "r", 1) != 1) _exit(1); /* fork returned: its records are set up */
      for (;;) pause();
    }
    char b;
    if (k % 3 == 2) {
      if (read(p[0], &b, 1) != 1) return 1; /* surely recorded */
    } else {
      usleep(k * 300); /* while the child sets its records up, or before it even ran */
    }
    kill(c, SIGTERM);
    int st;
    waitpid(c, &st, 0);
    close(p[0]);
    close(p[1]);
  }
  return 0;
}
"""


def test_children_terminated_right_after_fork(locus, tmp_path):
    """A pool terminating workers it has just forked (Python's multiprocessing did, now and
    then): each child is recorded whole, its end at the signal. A SIGTERM that came while
    the child was still setting up its records left it half-recorded, or unrecorded."""
    src, exe = tmp_path / "termchild.c", tmp_path / "termchild"
    src.write_text(TERMCHILD)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    proc, run = locus.record([str(exe)], ("--lens", "comm"))
    rep = locus.report(run, "--lens", "comm")
    # Every child that got to set up records finished them (one killed before it ran a
    # single instruction has none: that is not a partial record). Two children are killed
    # only once they said fork returned (set up for sure); the others at 0-1.5 ms, which on a
    # busy machine can all come before they ran (a fixed 0.9 ms once left 1 pid of 5).
    assert rep["run"]["complete"] is True
    assert len(rep["run"]["pids"]) >= 3, rep["run"]["pids"]


FORK_FROM_THREAD = r"""
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
static void *w(void *a) {
  (void)a;
  int local = 0;
  pid_t c = fork();
  if (c == 0) {
    printf("%lx\n", (unsigned long)&local); /* the child's stack: the thread's */
    fflush(stdout);
    _exit(0);
  }
  waitpid(c, 0, 0);
  return 0;
}
int main(void) {
  pthread_t t;
  pthread_create(&t, 0, w, 0);
  pthread_join(t, 0);
  return 0;
}
"""


def test_stack_of_a_child_forked_from_a_thread(locus, tmp_path):
    """The child of a fork made by a non-main thread runs on that thread's pthread stack,
    although its tid is its pid: its stack object must hold the child's own locals (the
    process's [stack] mapping does not)."""
    from locus.rundir import AL_STACK, RunDir

    src, exe = tmp_path / "ft.c", tmp_path / "ft"
    src.write_text(FORK_FROM_THREAD)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    proc, run = locus.record([str(exe)], ("--lens", "comm"))
    local = int(proc.stdout.strip(), 16)
    rd = RunDir.open(str(run))
    child = [p for p in rd.procs if p.ppid != 0 and p.pid != rd.procs[0].pid]
    assert child, [p.pid for p in rd.procs]
    al = child[0].allocs()
    st = al[(al["kind"] == AL_STACK) & (al["tid"] == child[0].pid)]
    assert len(st) == 1
    lo, size = int(st["addr"][0]), int(st["size"][0])
    assert lo <= local < lo + size, (hex(lo), size, hex(local))


def test_disk_used_by_many_short_processes(locus):
    """A shell loop, a build: thousands of short processes, each with its own record files.
    File space was reserved a MiB at a time per stream, so each `ls` took 3 MiB of disk
    under comm and locks (314 MiB for 100); now a file holds its claimed chunks and a
    thread's unused tail is given back when it ends."""
    proc, run = locus.record(
        ["sh", "-c", "for i in $(seq 40); do ls / >/dev/null; done"], ("--lens", "comm,locks")
    )
    rep = locus.report(run, "--lens", "comm")
    procs = [p for p in (run / "procs").iterdir() if p.is_dir()]
    assert rep["run"]["complete"] is True and len(procs) >= 41
    used = sum(f.stat().st_blocks * 512 for p in procs for f in p.iterdir())
    assert used / len(procs) < 256 << 10, f"{used / len(procs) / 1024:.0f} KiB per process"


def test_runtime_thread_local_storage_is_small():
    """Every thread the program creates carries the runtime's static TLS, zeroed at its
    creation at the top of its stack mapping, whether or not a lens uses it: 5.7 KiB of it
    (the numa page cache, the call-stack cache, the hw bounce buffer) made 4-8 KiB of each
    thread's stack resident. Those are now mapped by the threads that use them."""
    lib = os.path.join(os.path.dirname(__file__), "..", "..", "build", "liblocus.so")
    out = subprocess.run(["readelf", "-lW", lib], capture_output=True, text=True, check=True)
    tls = [ln.split() for ln in out.stdout.splitlines() if ln.strip().startswith("TLS")]
    assert tls, out.stdout
    memsz = int(tls[0][5], 16)
    assert memsz <= 3 << 10, f"{memsz} bytes of static TLS per thread"


def _resident_text_kib(smaps: str, name: str) -> tuple[int, int]:
    """(resident KiB, size KiB) of the executable mappings of `name` in a smaps text."""
    rss = size = 0
    cur = None
    for line in smaps.splitlines():
        f = line.split()
        if f and "-" in f[0] and len(f) >= 5 and ":" in f[3]:
            cur = f if len(f) >= 6 and f[5].endswith(name) and "x" in f[1] else None
        elif cur is not None and f[0] == "Rss:":
            rss += int(f[1])
        elif cur is not None and f[0] == "Size:":
            size += int(f[1])
    return rss, size


def test_runtime_code_resident_only_where_it_runs(locus, tmp_path):
    """The runtime's code and Zydis's: the first faults that ran them mapped 16 neighbouring
    pages each (the kernel's fault-around), before each page had its own mapping, so all of
    liblocus.so's text (120 KiB) stayed resident. Pages still the file's are now dropped
    once split; those the runtime runs come back one by one (84 KiB in a sysbench run)."""
    snap = tmp_path / "smaps"
    script = f"i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; cat /proc/$$/smaps > {snap}"
    proc, run = locus.record(["bash", "-c", script], ("--lens", "comm"))
    assert proc.returncode == 0, proc.stderr
    rss, size = _resident_text_kib(snap.read_text(), "liblocus.so")
    assert size > 0 and rss < 0.8 * size, f"liblocus.so text: {rss} of {size} KiB resident"


THREAD_CHURN = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static long n;

static void *worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&m);
  n++;
  pthread_mutex_unlock(&m);
  return NULL;
}

int main(int argc, char **argv) {
  long threads = argc > 1 ? atol(argv[1]) : 64;
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 64 * 1024); /* glibc's stack cache then reuses them all */
  for (long done = 0; done < threads; done += 64) {
    pthread_t t[64];
    for (int i = 0; i < 64; i++) pthread_create(&t[i], &at, worker, NULL);
    for (int i = 0; i < 64; i++) pthread_join(t[i], NULL);
  }
  char line[256];
  FILE *f = fopen("/proc/self/status", "r");
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmData:", 7)) printf("%ld %s", n, line);
  return 0;
}
"""


def test_ended_threads_leave_no_memory_behind(locus, tmp_path):
    """Per-thread memory the runtime maps (the --call-stack cache at a thread's first stack,
    the signal stack, the lenses' buffers) is given back when the thread ends: 3008 threads,
    each taking a call stack at its lock, end with the data size of 64 (a page kept per
    ended thread would be 11.5 MiB more)."""
    src, exe = tmp_path / "churn.c", tmp_path / "churn"
    src.write_text(THREAD_CHURN)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    data = {}
    for threads in (64, 3008):
        proc, run = locus.record([str(exe), str(threads)], ("--lens", "locks", "--call-stack"))
        count, _name, kib, _unit = proc.stdout.decode().split()
        assert int(count) == threads
        data[threads] = int(kib)
        assert (run / "procs").exists()
    stacks = list((run / "procs").glob("*/stacks.bin"))
    assert stacks and stacks[0].stat().st_size > 0, "no call stack was taken"
    assert data[3008] - data[64] < 2048, data


IDLE_THREADS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static pthread_barrier_t b;
static void *idle(void *a) { pthread_barrier_wait(&b); return a; }
int main(int argc, char **argv) {
  int n = atoi(argv[1]);
  pthread_t *t = malloc(n * sizeof *t);
  pthread_barrier_init(&b, 0, n + 1);
  for (int i = 0; i < n; i++) pthread_create(&t[i], 0, idle, 0);
  pthread_barrier_wait(&b);
  for (int i = 0; i < n; i++) pthread_join(t[i], 0);
  printf("%d\n", n);
  return 0;
}
"""


def test_threads_that_never_allocate_share_the_pages_of_their_stack_records(locus, tmp_path):
    """Each thread writes one record at its start (its stack, LOCUS_AL_STACK). On the
    thread's own cursor it claimed a page of allocs.bin, resident in the program for its 64
    bytes: 1000 threads that never allocate held 4 MB. The records now share a cursor: 200
    idle threads' stack records fill 4 pages, not 200."""
    from locus.rundir import AL_STACK, ALLOC_DTYPE

    src, exe = tmp_path / "idle.c", tmp_path / "idle"
    src.write_text(IDLE_THREADS)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    proc, run = locus.record([str(exe), "200"], ("--lens", "comm"))
    assert proc.stdout.decode().split() == ["200"]
    (path,) = (run / "procs").glob("*/allocs.bin")
    raw = path.read_bytes()
    rec = np.frombuffer(raw[: len(raw) // ALLOC_DTYPE.itemsize * ALLOC_DTYPE.itemsize], ALLOC_DTYPE)
    at = np.flatnonzero(rec["kind"] == AL_STACK)
    assert len(at) == 201, len(at)  # (and main's)
    pages = np.unique(at * ALLOC_DTYPE.itemsize // 4096)
    assert len(pages) <= 8, len(pages)


LATE_STARTER = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
static volatile int second_ran;
static void *first(void *a) { (void)a; printf("first %ld\n", syscall(SYS_gettid)); return 0; }
static void *second(void *a) {
  (void)a;
  printf("second %ld\n", syscall(SYS_gettid));
  fflush(stdout);
  second_ran = 1;
  return 0;
}
int main(void) {
  /* The first thread is created on the main thread's CPU at idle priority: it cannot run
   * before main blocks, while the second, on the other CPU, runs at once. Main spins at a
   * real-time priority where it may (root): on a loaded host the second thread can wait
   * for its CPU, and an idle thread beside a normal one still gets a slice meanwhile. */
  cpu_set_t c0, c1;
  CPU_ZERO(&c0);
  CPU_ZERO(&c1);
  CPU_SET(0, &c0);
  CPU_SET(1, &c1);
  sched_setaffinity(0, sizeof c0, &c0);
  struct sched_param rt = {.sched_priority = 1};
  int was = sched_getscheduler(0);
  struct sched_param old;
  sched_getparam(0, &old);
  int raised = sched_setscheduler(0, SCHED_FIFO, &rt) == 0;
  pthread_attr_t a1, a2;
  pthread_attr_init(&a1), pthread_attr_init(&a2);
  pthread_attr_setaffinity_np(&a1, sizeof c0, &c0);
  pthread_attr_setinheritsched(&a1, PTHREAD_EXPLICIT_SCHED);
  pthread_attr_setschedpolicy(&a1, SCHED_IDLE);
  pthread_attr_setaffinity_np(&a2, sizeof c1, &c1);
  pthread_t t1, t2;
  if (pthread_create(&t1, &a1, first, 0) || pthread_create(&t2, &a2, second, 0)) return 1;
  while (!second_ran) {
  }
  if (raised) sched_setscheduler(0, was, &old);
  pthread_join(t1, 0), pthread_join(t2, 0);
  return 0;
}
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs")
def test_thread_indices_follow_creation_order(locus, tmp_path):
    """The contract numbers threads in creation order. A thread registered itself when it
    first ran, so a thread created first but started second took the second index (and a
    checker's pairs 0-1, 2-3 pointed at the wrong threads)."""
    src, exe = tmp_path / "late.c", tmp_path / "late"
    src.write_text(LATE_STARTER)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    for _attempt in range(5):
        proc, run = locus.record([str(exe)], ("--lens", "comm"))
        tids = dict(line.split() for line in proc.stdout.decode().splitlines())
        if list(tids) == ["second", "first"]:
            break  # the setup did what it means to: the second thread ran first
    assert list(tids) == ["second", "first"], f"the first thread ran first 5 times: {tids}"
    rep = locus.report(run, "--lens", "comm")
    threads = rep["lenses"]["comm"]["threads"]
    assert [t["tid"] for t in threads[1:]] == [int(tids["first"]), int(tids["second"])]


def test_program_gets_its_argv_descriptors_and_ignored_signals(locus, tmp_path):
    """The program is started as its shell would start it. Popen's defaults closed the
    descriptors locus inherited (`cat <&7` failed: a make jobserver, socket activation),
    reset an inherited ignored SIGPIPE (a program that expects EPIPE was killed), and argv[0]
    was the resolved path (`sort: ...` became `/usr/bin/sort: ...`)."""
    run = str(tmp_path / "r")
    rec = " ".join([*locus.argv, "record", "-o", run, "--"])
    show = "cat <&7; tr '\\0' ' ' </proc/$$/cmdline; echo; grep SigIgn /proc/$$/status"
    # `; true`: bash stays the launcher's parent (it would exec the last command).
    script = f"trap '' PIPE; {rec} sh -c \"$0\" 7</etc/hostname; true"
    alone = "trap '' PIPE; sh -c \"$0\" 7</etc/hostname; true"
    got = subprocess.run(
        ["bash", "-c", script, show], capture_output=True, text=True, env=locus.env, timeout=60
    )
    want = subprocess.run(["bash", "-c", alone, show], capture_output=True, text=True, timeout=60)
    assert want.returncode == 0 and want.stdout.count("\n") == 3, want

    # The whole mask: Python's posix_spawn path started the program with glibc's signals
    # 32-33 ignored.
    assert got.stdout == want.stdout, (got.stdout, want.stdout, got.stderr)
    assert got.stdout.splitlines()[1].startswith("sh -c "), got.stdout


SMALL_STACKS = r"""
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
volatile long sink[2];
static long depth;
__attribute__((noinline)) static long deep(long n) {
  volatile char b[1024];
  b[0] = (char)n;
  if (n > 0) return deep(n - 1) + b[0];
  for (long i = 0; i < 30000000; i++) sink[i & 1] += b[i & 1023];
  return b[0];
}
static void *tiny(void *a) { /* PTHREAD_STACK_MIN, used to its depth */
  (void)a;
  return (void *)deep(depth);
}
static void *small_alt(void *a) { /* its own 2 KiB signal stack */
  stack_t s = {.ss_sp = malloc(2048), .ss_size = 2048, .ss_flags = 0};
  if (sigaltstack(&s, NULL) != 0) return (void *)1;
  for (long i = 0; i < 60000000; i++) sink[(long)a & 1] += i;
  stack_t back;
  sigaltstack(NULL, &back);
  return (void *)(long)(back.ss_sp != s.ss_sp || back.ss_size != 2048); /* reads its own */
}
int main(int argc, char **argv) {
  depth = atol(argv[1]);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, PTHREAD_STACK_MIN);
  pthread_t t[4];
  void *r[4];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], &at, tiny, NULL);
  for (long i = 2; i < 4; i++) pthread_create(&t[i], NULL, small_alt, (void *)i);
  for (int i = 0; i < 4; i++) pthread_join(t[i], &r[i]);
  printf("%ld\n", (long)r[2] + (long)r[3]);
  return 0;
}
"""


def test_small_thread_and_signal_stacks(locus, tmp_path):
    """Threads on PTHREAD_STACK_MIN stacks used to the depth that runs alone (liblocus's TLS
    and frames took 3-4 KiB of them: SIGSEGV), and threads with their own 2 KiB signal stack
    (the sampler's handler ran on it: SIGSEGV) run under the comm lens at 100 us."""
    src, exe = tmp_path / "stacks.c", tmp_path / "stacks"
    src.write_text(SMALL_STACKS)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    depth = 0
    for d in range(4, 16):  # the deepest recursion that runs without locus
        if subprocess.run([str(exe), str(d)], capture_output=True, timeout=60).returncode != 0:
            break
        depth = d
    assert depth >= 4
    proc, run = locus.record(
        [str(exe), str(depth)], ("--lens", "comm", "--period", "100us"), check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == b"0", (proc.returncode, proc.stdout)
    assert locus.report(run, "--lens", "comm")["lenses"]["comm"]["samples"] > 100


@pytest.mark.parametrize("lens", ["locks", "comm"])
def test_forked_child_keeps_its_stdin(locus, lens):
    """Every forked child lost its stdin: a record stream never opened (--call-stack off)
    has descriptor 0, and the child's reset after fork closed it (`cat` in a subshell: Bad
    file descriptor; openssl speed -multi's workers then dup()ed their pipe onto 0)."""
    proc, _run = locus.record(
        ["bash", "-c", "cat; true"], ("--lens", lens), input=b"through the fork\n"
    )
    assert proc.stdout == b"through the fork\n", proc.stderr


FIRST_TOUCH_STACKS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define N (32L << 20)
static char *buf;
static void *init(void *p) { memset(buf, 1, N); return p; } /* 8192 first touches */
int main(void) {
  buf = malloc(N);
  pthread_t t;
  pthread_create(&t, 0, init, 0);
  pthread_join(t, 0);
  long s = 0;
  for (long i = 0; i < N; i += 4096) s += buf[i];
  printf("%ld\n", s);
  free(buf);
  return 0;
}
"""


def test_first_touches_with_call_stacks_do_not_crash(locus, tmp_path):
    """numa + --call-stack killed the program with SIGSEGV in half the runs: a record chunk
    released inside the first-touch SIGSEGV handler went through the runtime's own munmap
    interposer, was recorded as the program's munmap with a call stack, and libunwind
    faulted unwinding the signal frame. The runtime maps its chunks with raw calls now."""
    src, exe = tmp_path / "ft.c", tmp_path / "ft"
    src.write_text(FIRST_TOUCH_STACKS)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    for _ in range(4):
        proc, _run = locus.record([str(exe)], ("--lens", "numa", "--call-stack"), check=False)
        assert proc.returncode == 0 and proc.stdout.strip() == b"8192", (
            proc.returncode,
            proc.stderr[-300:],
        )


DAEMON = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
  if (daemon(0, 0) != 0) return 1;
  char cwd[256];
  FILE *f = fopen(argv[1], "w");
  fprintf(f, "%s %d %d\n", getcwd(cwd, sizeof cwd), getsid(0) == getpid(), isatty(1));
  fclose(f);
  return 0;
}
"""


def test_daemon_is_a_complete_run(locus, tmp_path):
    """glibc's daemon() ends the parent with an internal _exit that no interposer sees: its
    records were left unfinished and the run read "incomplete" (memcached -d). locus's
    daemon() does glibc's steps (fork, the parent's _exit, setsid, chdir, /dev/null)."""
    src, exe = tmp_path / "dm.c", tmp_path / "dm"
    src.write_text(DAEMON)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    out = tmp_path / "out"
    proc, run = locus.record([str(exe), str(out)], ("--lens", "locks"))
    assert b"incomplete" not in proc.stderr, proc.stderr
    rep = locus.report(run)
    assert rep["run"]["complete"] is True and rep["run"]["exit_status"] == 0, rep["run"]
    # The child went on as glibc's would: in /, leading its session, without the terminal.
    assert out.read_text() == "/ 1 0\n"


DAEMON_STAYS = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
  if (daemon(1, 0) != 0) return 1;
  FILE *f = fopen(argv[1], "w");
  fprintf(f, "%d\n", getpid());
  fclose(f);
  sleep(3);
  return 0;
}
"""


def test_a_daemon_does_not_hold_the_recorders_stderr(locus, tmp_path):
    """The runtime keeps a copy of the program's stderr for its warnings: a daemon that
    pointed 2 at /dev/null kept the recorder's stderr pipe open through that copy, and
    `locus record -- prog -d 2>&1 | cat` waited for the daemon to end. The copy now follows
    what the program puts at 2."""
    src, exe = tmp_path / "ds.c", tmp_path / "ds"
    src.write_text(DAEMON_STAYS)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    pidfile = tmp_path / "pid"
    r, w = os.pipe()
    try:
        p = locus.popen("record", "-o", str(tmp_path / "run"), "--lens", "locks", "--",
                        str(exe), str(pidfile), stdout=w, stderr=w)  # fmt: skip
        os.close(w)
        assert p.wait(timeout=60) == 0
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        pipe = f"pipe:[{os.fstat(r).st_ino}]"
        held = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == pipe:
                    held.append(fd)
            except OSError:
                pass
        assert not held, f"the daemon holds the recorder's pipe at fd {held}"
    finally:
        os.close(r)


EXEC_AGAIN = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
  volatile double x = 0;
  for (long i = 0; i < 100000000; i++) x += i;
  if (argc > 1 && strcmp(argv[1], "again") == 0) execl(argv[0], argv[0], (char *)0);
  printf("%.0f\n", x);
  return 0;
}
"""


def test_an_exec_chain_splits_the_service_time(locus, tmp_path):
    """A task that exec'd is the main thread of two process images (one pid, one tid), and
    the scheduler's cumulative service time spans both: each image got the whole task's
    time, so the run's on-CPU time and the dependency model counted it twice."""
    src, exe = tmp_path / "ex.c", tmp_path / "ex"
    src.write_text(EXEC_AGAIN)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    _proc, run = locus.record([str(exe), "again"], ("--lens", "locks"))
    threads = locus.report(run)["lenses"]["locks"]["threads"]
    assert len(threads) == 2 and threads[0]["tid"] == threads[1]["tid"], threads
    for t in threads:  # busy the whole time: on-CPU close to its lifetime, never above
        life = t["end_s"] - t["start_s"]
        assert 0.5 * life < t["service_s"] <= 1.1 * life + 0.02, t


SANDBOXED = r"""
#define _GNU_SOURCE
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>

/* Two threads false-share a line before a filter (before_filter) and another one after it
 * (after_filter). "allow", "prctl": an allow-list that kills the process at any other system
 * call; "deny": a deny-list (ptrace and mount killed, all else allowed). Pages mapped before
 * the filter are first touched after it. */
struct line {
  _Alignas(64) volatile long a;
  volatile long b;
};
struct line before_filter, after_filter;
static volatile int stop, filtered;

static void *work(void *p) {
  while (!stop) {
    struct line *l = filtered ? &after_filter : &before_filter;
    if (p)
      l->b++;
    else
      l->a++;
  }
  return NULL;
}

static void nap(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

#define ALLOW(n) \
  BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (n), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

int main(int argc, char **argv) {
  int use_prctl = strcmp(argv[1], "prctl") == 0, deny = strcmp(argv[1], "deny") == 0;
  int errno_ = strcmp(argv[1], "errno") == 0;
  char *mem = mmap(NULL, 64 << 12, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  pthread_t t[2];
  pthread_create(&t[0], NULL, work, NULL);
  pthread_create(&t[1], NULL, work, (void *)1);
  printf("filter\n"); /* stdout's buffer, before the filter */
  fflush(stdout);
  nap(400);
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      ALLOW(SYS_read), ALLOW(SYS_write), ALLOW(SYS_exit), ALLOW(SYS_exit_group),
      ALLOW(SYS_futex), ALLOW(SYS_rt_sigreturn), ALLOW(SYS_rt_sigprocmask),
      ALLOW(SYS_nanosleep), ALLOW(SYS_clock_nanosleep), ALLOW(SYS_madvise), ALLOW(SYS_munmap),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
  };
  struct sock_filter d[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 1, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mount, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  /* openat with O_CREAT refused (EACCES), everything else allowed: an argument test. */
  struct sock_filter e[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_CREAT, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EACCES),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {sizeof f / sizeof f[0], f};
  if (deny) prog = (struct sock_fprog){sizeof d / sizeof d[0], d};
  if (errno_) prog = (struct sock_fprog){sizeof e / sizeof e[0], e};
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  long rc = use_prctl ? prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)
                      : syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC,
                                &prog);
  if (rc != 0) return 2;
  filtered = 1;
  nap(400); /* the threads go on: a sample now would make system calls */
  for (int i = 0; i < 64; i++) mem[i << 12] = 1;
  stop = 1;
  pthread_join(t[0], NULL);
  pthread_join(t[1], NULL);
  printf("done %d\n", after_filter.a > 0 && after_filter.b > 0);
  return 0;
}
"""


@pytest.mark.parametrize(
    "lens,how", [("comm", "allow"), ("comm", "prctl"), ("numa", "allow"), ("locks", "allow")]
)
def test_a_seccomp_filter_does_not_kill_the_program(locus, tmp_path, lens, how):
    """A program that installs an allow-list seccomp filter (kill at any other system call)
    while its threads run: the runtime's samplers (timers, perf events, watchpoints, the
    first-touch page protections) must be stopped and its records finished before the filter
    goes on, in every thread (SECCOMP_FILTER_FLAG_TSYNC applies it to all of them at once, a
    sample preempted halfway included), and no system call made after it, exit included.
    Before: killed by SIGSYS (rc 159) with comm and numa. What came before the filter is
    reported; the run says where each process's recording stopped."""
    src, exe = tmp_path / "sbx.c", tmp_path / "sbx"
    src.write_text(SANDBOXED)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    for _ in range(2):  # the race with a sample in flight in another thread, twice
        proc, run = locus.record([str(exe), how], ("--lens", lens), check=False)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
        assert proc.stdout == b"filter\ndone 1\n"
        assert b"incomplete" not in proc.stderr and b"installed a seccomp filter" in proc.stderr
    rep = locus.report(run)
    (box,) = rep["run"]["sandboxed"]
    assert box["pid"] == rep["run"]["pids"][0] and 0.3 < box["at_s"] < rep["run"]["duration_s"]
    assert rep["run"]["complete"] is True and rep["run"]["exit_status"] == 0
    if lens == "comm":  # recorded up to the filter: the two threads' false sharing there
        names = {o["name"]: o for o in rep["lenses"]["comm"]["objects"]}
        assert names["before_filter"]["false"] > 0 and "after_filter" not in names, names


@pytest.mark.parametrize("how", ["deny", "errno"])
def test_a_seccomp_filter_that_allows_the_runtime_keeps_the_recording(locus, tmp_path, how):
    """A deny-list filter (ptrace and mount killed, everything else allowed), or one that
    refuses openat(O_CREAT) with EACCES (an argument test, followed both ways): the runtime
    runs the filter over every system call it makes itself, finds nothing it cannot survive,
    and records on (QEMU's -sandbox). The false sharing after the filter is found too."""
    src, exe = tmp_path / "sbx.c", tmp_path / "sbx"
    src.write_text(SANDBOXED)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    proc, run = locus.record([str(exe), how], ("--lens", "comm"))
    assert proc.stdout == b"filter\ndone 1\n" and b"seccomp" not in proc.stderr, proc.stderr
    rep = locus.report(run)
    assert rep["run"]["sandboxed"] == [] and rep["run"]["complete"] is True
    names = {o["name"]: o for o in rep["lenses"]["comm"]["objects"]}
    assert names["before_filter"]["false"] > 0 and names["after_filter"]["false"] > 0, names


SYSV_SIGNAL = r"""
/* Built with -std=c99: glibc's headers make signal() __sysv_signal. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void on_segv(int s) {
  (void)s;
  static const char m[] = "the program's handler\n";
  write(2, m, sizeof m - 1);
  _exit(3);
}
static void *work(void *arg) {
  size_t n = (size_t)32 << 20;
  char *a = malloc(n);
  memset(a, 1, n);
  volatile unsigned long s = 0;
  for (long i = 0; i < 300000000L; i++) s += a[(i * 4096) % n];
  return arg;
}
int main(void) {
  signal(SIGSEGV, on_segv);
  signal(SIGTRAP, SIG_DFL);
  pthread_t t;
  pthread_create(&t, NULL, work, NULL);
  pthread_join(t, NULL);
  puts("done");
  return 0;
}
"""


@pytest.mark.parametrize("lens", ["comm", "numa"])
def test_signal_under_strict_c_keeps_the_runtime_s_handlers(locus, tmp_path, lens):
    """A program built with -std=c99 (or -ansi) calls __sysv_signal for signal(): the
    runtime interposed signal() and sigaction() only, so the program's SIGSEGV handler
    replaced the numa lens' first-touch handler (zstd: "Caught SIGSEGV signal, printing
    stack", exit 139; here the program's handler, exit 3) and its SIGTRAP reset to the
    default replaced the comm sampler's (killed by the next sample, exit 133)."""
    src, exe = tmp_path / "sysv.c", tmp_path / "sysv"
    src.write_text(SYSV_SIGNAL)
    subprocess.run(
        ["gcc", "-O1", "-std=c99", "-D_POSIX_C_SOURCE=200809L", "-pthread", "-o", str(exe),
         str(src)],
        check=True,
    )  # fmt: skip
    proc, run = locus.record([str(exe)], ("--lens", lens), check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert proc.stdout == b"done\n"
    data = locus.report(run)["lenses"][lens]
    if lens == "comm":
        assert data["samples"] > 100, data["samples"]
    else:  # the worker's 32 MiB, first-touched page by page
        assert data["totals"]["first_touch"] + data["totals"]["unpinned_first_touch"] > 4000


SAVE_RESTORE = """
import os, signal
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGALRM, signal.SIGPIPE):
    old = signal.getsignal(s)
    assert old in (signal.SIG_DFL, signal.SIG_IGN), (s, old)
    signal.signal(s, lambda *a: None)
    signal.signal(s, old)
print("restored", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
"""

DEFAULT_SEEN = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
static volatile sig_atomic_t got;
static void on_usr1(int s) { got = s; }
int main(void) {
  struct sigaction old, mine;
  if (sigaction(SIGTERM, NULL, &old) || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO))
    return puts("SIGTERM does not read SIG_DFL"), 1;
  if (signal(SIGHUP, SIG_DFL) != SIG_DFL) return puts("signal() did not return SIG_DFL"), 1;
  memset(&mine, 0, sizeof mine);
  mine.sa_handler = on_usr1;
  if (sigaction(SIGUSR1, &mine, &old) || old.sa_handler != SIG_DFL) return puts("USR1 old"), 1;
  raise(SIGUSR1);
  if (got != SIGUSR1) return puts("the program's own handler did not run"), 1;
  puts("ok");
  fflush(stdout);
  signal(SIGTERM, SIG_DFL); /* the default action, still ended with whole records */
  raise(SIGTERM);
  return 2;
}
"""


def test_the_runtime_s_fatal_signal_handlers_read_as_the_default(locus, tmp_path):
    """The runtime finishes a process's records in a handler of its own for the signals whose
    default action ends the process. The program saw that handler: Python's signal module
    took it for a handler not installed from Python (None), and restoring it (`signal.signal(
    s, signal.getsignal(s))`, which every Python program that handles SIGTERM for a while
    does) raised TypeError: a `locus record` recorded by locus failed so. Now sigaction()
    and signal() read SIG_DFL there, asking for SIG_DFL keeps the finishing handler, and a
    handler of the program's own replaces it."""
    proc, run = locus.record([sys.executable, "-c", SAVE_RESTORE], ("--lens", "locks"), check=False)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert proc.stdout == b"restored\n"
    rep = locus.report(run)["run"]
    assert rep["complete"] is True and rep["signal"] == "SIGTERM", rep

    src, exe = tmp_path / "dfl.c", tmp_path / "dfl"
    src.write_text(DEFAULT_SEEN)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    proc, run = locus.record([str(exe)], ("--lens", "comm"), check=False)
    assert proc.stdout == b"ok\n", proc.stdout
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    rep = locus.report(run)["run"]
    assert rep["complete"] is True and rep["signal"] == "SIGTERM", rep

    # locus recorded by locus: the inner launcher saves and restores SIGTERM, SIGHUP, SIGQUIT
    inner = locus.new_dir("inner")
    argv = [*locus.argv, "record", "-o", str(inner), "--", "true"]
    proc, run = locus.record(argv, ("--lens", "locks"), check=False)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0 and "Traceback" not in err, err


EXIT_TOGETHER = r"""
#include <pthread.h>
#include <stdlib.h>
static pthread_barrier_t b;
static pthread_t joined;
static volatile int go;
static volatile long spin[64];
static void *w(void *a) {
  long i = (long)a;
  for (long k = 0; k < 2000000; k++) spin[i * 8]++;
  pthread_barrier_wait(&b);
  exit(0);
}
static void *late(void *a) {
  (void)a;
  while (!go) ;
  exit(3);
}
static void join_late(void) { go = 1; pthread_join(joined, NULL); }
int main(int argc, char **argv) {
  (void)argv;
  if (argc > 1) { /* an exit handler joining a thread that calls exit() itself */
    pthread_create(&joined, NULL, late, NULL);
    atexit(join_late);
    exit(0);
  }
  pthread_barrier_init(&b, NULL, 5);
  pthread_t t[4];
  for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, w, (void *)(i + 1));
  pthread_barrier_wait(&b);
  exit(0);
}
"""


def test_exit_from_several_threads_at_once(locus, tmp_path):
    """Five threads calling exit() at once: glibc runs the exit handlers (the runtime's
    destructor, which finishes the records, among them) in the first; the others, finding
    none left, ended the process at once, the records half-written: 20 runs in 20 read
    "incomplete". The later callers wait for the records now; and where the first one's exit
    handler joins a thread that calls exit() (each waits for the other), the wait gives up
    after half a second and the program ends as without locus (exit 3)."""
    src, exe = tmp_path / "ex.c", tmp_path / "ex"
    src.write_text(EXIT_TOGETHER)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    for _ in range(3):
        proc, run = locus.record([str(exe)], ("--lens", "comm"))
        assert b"incomplete" not in proc.stderr, proc.stderr
        assert json.loads((run / "meta.json").read_text())["complete"] is True
    t0 = time.monotonic()
    proc, run = locus.record([str(exe), "join"], ("--lens", "comm"), check=False)
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 10
    assert locus.report(run)["run"]["complete"] is True


def test_a_small_process_reserves_little_disk(locus):
    """Each process reserved 64 KiB of thread slots (1024) whatever its threads: a run of
    `stress-ng --fork` (2832 processes of one thread) held 181 MB of empty slots, a third of
    its run directory. The first reservation is 64 slots now, doubled as threads come."""
    proc, run = locus.record(["sh", "-c", "true; true"], ("--lens", "comm"))
    (entry,) = (run / "procs").iterdir()
    slots = entry / "threads.bin"
    assert slots.stat().st_blocks * 512 <= 8192, slots.stat()
    assert slots.stat().st_size == 64 * 64
    # The vDSO's image, the same in every process: one copy per run, hard-linked (6.5 KiB
    # a process before).
    proc, run = locus.record(["sh", "-c", "/bin/true; /bin/true"], ("--lens", "comm"))
    copies = [e / "vdso.so" for e in (run / "procs").iterdir()]
    assert len(copies) == 3, copies
    assert len({c.stat().st_ino for c in copies} | {(run / "vdso.so").stat().st_ino}) == 1


def _maps_rows(text: str) -> list[tuple[int, int, str, int, str]]:
    rows = []
    for line in text.splitlines():
        f = line.split(None, 5)
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        rows.append((lo, hi, f[1], int(f[2], 16), f[5] if len(f) > 5 else ""))
    return rows


def test_the_maps_copies_join_the_runtime_s_split_mappings(locus):
    """The runtime maps some pages one apart (the decoder's tables, its own read-only pages:
    the kernel's fault-around cannot then map their neighbours): 210 lines of each maps
    copy were those pages, 21-52 KiB twice per process. The copies join adjacent mappings of
    one file at consecutive offsets with the same permissions, as the kernel would list
    them; everything else is as /proc/self/maps says, and the report names the program."""
    proc, run = locus.record(
        [locus.workload("comm_falseshare"), "2", "-", "0.5", "--free"], ("--lens", "comm")
    )
    (entry,) = (run / "procs").iterdir()
    rows = _maps_rows((entry / "maps.exit").read_text())
    for a, b in zip(rows, rows[1:]):
        joinable = (
            a[4].startswith("/") and a[4] == b[4] and a[2] == b[2] and a[1] == b[0]
            and b[3] == a[3] + (a[1] - a[0])
        )  # fmt: skip
        assert not joinable, (a, b)
    zydis = [r for r in rows if "libZydis" in r[4]]
    assert 0 < len(zydis) <= 8, zydis
    assert len(rows) < 120, len(rows)
    names = {o["name"] for o in locus.report(run)["lenses"]["comm"]["objects"]}
    assert "data" in names, names


def test_a_runtime_warning_is_said_once_per_run(locus):
    """Every process's runtime said its warnings itself: a script of five processes under
    a low `ulimit -n` printed the same "the runtime's file descriptors ... are all in use"
    five times (a build, thousands). The first process to say a message marks it in the
    run directory; the others stay quiet."""
    script = "ulimit -n 32; for i in 1 2 3 4; do /bin/true; done; echo done"
    proc, run = locus.record(["sh", "-c", script], ("--lens", "comm"))
    err = proc.stderr.decode(errors="replace")
    assert proc.stdout == b"done\n"
    assert err.count("are all in use") == 1, err
    assert len(list((run / "procs").iterdir())) >= 5


def test_the_tsc_rate_is_measured_once_per_run(locus):
    """Each process measured the TSC's rate with a 100 us nap at its start (~0.24 ms of a
    short process's start-up, more on a loaded machine). The first process of the run on a
    machine leaves it in RUN/tsc.BOOTID (ticks per ms); the others read it. It must be the
    rate the processes' own calibration pairs (proc.bin: ticks and CLOCK_MONOTONIC at start
    and at the end) give."""
    from locus.rundir import RunDir

    with open("/proc/cpuinfo") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    if not {"constant_tsc", "nonstop_tsc"} <= set(flags):
        pytest.skip("no invariant TSC here: the runtime's clock is CLOCK_MONOTONIC, no rate")
    _proc, run = locus.record(
        ["sh", "-c", "sleep 0.15; sh -c 'sleep 0.15'"], options=("--lens", "comm")
    )
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    files = list(run.glob("tsc.*"))
    assert [f.name for f in files] == [f"tsc.{boot}"], files
    text = files[0].read_text()
    assert text.endswith("\n") and text[:-1].isdigit(), text
    per_ms = int(text)
    rd = RunDir.open(str(run))
    assert len(rd.procs) >= 3, [p.pid for p in rd.procs]  # sh, sh, sleep (and exec'd images)
    for p in rd.procs:
        h = p.hdr
        if h["ns1"] - h["ns0"] < 100_000_000:
            continue  # too short for its pairs to give the rate to 0.5 %
        own = (int(h["tsc1"]) - int(h["tsc0"])) / ((int(h["ns1"]) - int(h["ns0"])) / 1e6)
        assert abs(own / per_ms - 1) < 0.005, (p.pid, own, per_ms)
