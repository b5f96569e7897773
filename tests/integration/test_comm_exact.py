"""The `exact` backend of the comm lens against the comm workloads' ground truth.

Each workload (workloads/comm_*.c) is built with `locus cc` (locus.cc.main), run under the
runtime with LD_PRELOAD / LOCUS_DIR / LOCUS_LENSES=comm / LOCUS_COMM_BACKEND=exact and a
fixed number of rounds, and the comm.events.bin records are read with numpy in the C
layout (runtime/include/locus_format.h, struct locus_comm_event). The workloads take turns,
so under the exact cache model every transfer follows from the construction: the counts
must match the truth JSON exactly, and the matrices must have the constructed shape.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from locus import cc
from locus.rundir import COMM_EVENT_DTYPE, COMM_THREAD_DTYPE

REPO = Path(__file__).resolve().parents[2]
LIBLOCUS = REPO / "build" / "liblocus.so"
WORKLOADS = REPO / "workloads"
TIMEOUT_S = 120

CE_TRUE, CE_EXACT = 1, 4
# The record layouts are the readers' own (runtime/include/locus_format.h).
EVENT, THREAD = COMM_EVENT_DTYPE, COMM_THREAD_DTYPE


@pytest.fixture(scope="module", params=["cc", "cc-early", "cc-calls", "clang-lto"])
def exact_bins(request, tmp_path_factory) -> Path:
    """The workloads built by `locus cc` with gcc (the hit test inlined into its assembly by
    locus/gas.py; the hooks put after the vectoriser by the gcc plugin when it is built),
    the same without the plugin (LOCUS_CC_LATE_TSAN=0: the hooks before the vectoriser), with
    gcc and LOCUS_CC_INLINE=0 (a call into liblocus.so per access), and with clang and
    LOCUS_CC_LTO=1 (the hit test inlined at link time)."""
    if not LIBLOCUS.exists():
        pytest.skip("build/liblocus.so is not built: run `make build`")
    env = {"CC": "gcc", "LOCUS_CC_LTO": "0", "LOCUS_CC_INLINE": "1", "LOCUS_CC_LATE_TSAN": "1"}
    if request.param == "cc-calls":
        env["LOCUS_CC_INLINE"] = "0"
    if request.param == "cc-early":
        env["LOCUS_CC_LATE_TSAN"] = "0"
    if request.param == "clang-lto":
        if shutil.which("clang") is None:
            pytest.skip("clang is not installed (apt-get install clang; `make deps`)")
        env = {"CC": "clang", "LOCUS_CC_LTO": "1"}
    out = tmp_path_factory.mktemp(f"exact-{request.param}")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for name in ("comm_writevol", "comm_falseshare", "comm_readwrite", "comm_p2p"):
            argv = ["-O2", "-g", "-std=c11", "-D_GNU_SOURCE", "-pthread", "-Wall"]
            argv += ["-o", str(out / name), str(WORKLOADS / f"{name}.c")]
            assert cc.main(argv) == 0, name
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    nm = subprocess.run(["nm", "-u", str(out / "comm_writevol")], capture_output=True, text=True)
    if request.param == "clang-lto":
        # Inlined: the program calls no hook of liblocus.so.
        assert "__tsan_" not in nm.stdout and "locus_x_slow" in nm.stdout
    else:
        # gcc: the hooks stay (a miss calls them); inlined, the hit test reads locus_xt.
        assert "__tsan_write8" in nm.stdout
        assert ("locus_xt" in nm.stdout) == (request.param != "cc-calls"), nm.stdout
    return out


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path):
        self.proc = proc
        self.dir = run_dir
        self.truth = next(
            json.loads(line)
            for line in reversed(proc.stderr.splitlines())
            if line.startswith("{") and '"workload"' in line
        )
        files = glob.glob(str(run_dir / "procs" / "*" / "comm.events.bin"))
        ev = np.concatenate([np.fromfile(f, EVENT) for f in files]) if files else EVENT
        self.events = ev[ev["kind"] == 1] if files else np.zeros(0, EVENT)
        files = glob.glob(str(run_dir / "procs" / "*" / "comm.threads.bin"))
        th = np.concatenate([np.fromfile(f, THREAD) for f in files])
        self.threads = th[th["kind"] == 1]
        lo, hi = self.truth["data"]
        self.inside = (self.events["line"] >= lo) & (self.events["line"] < hi)

    def matrix(self, events=None) -> Counter:
        """(src tid, dst tid, true?) -> transfers."""
        ev = self.events[self.inside] if events is None else events
        m: Counter = Counter()
        for e in ev:
            m[(int(e["src_tid"]), int(e["dst_tid"]), bool(e["flags"] & CE_TRUE))] += int(
                e["volume"]
            )
        return m

    def expected(self) -> Counter:
        m: Counter = Counter()
        for p in self.truth["expected"]["pairs"]:
            for kind, n in (("true", p["true"]), ("false", p["false"])):
                if n:
                    m[(p["src_tid"], p["dst_tid"], kind == "true")] += n
        return m


def code_lines(run_dir: Path, exe: Path, ips) -> set[str]:
    """file:line of the instruction addresses `ips` of the PIE `exe` (its load address read
    from the run's maps)."""
    maps = next((run_dir / "procs").glob("*/maps")).read_text().splitlines()
    base = min(int(m.split("-")[0], 16) for m in maps if m.endswith(str(exe)))
    addrs = [f"{ip - base:#x}" for ip in sorted(set(ips))]
    out = subprocess.run(["addr2line", "-e", str(exe), *addrs], capture_output=True, text=True)
    return {os.path.basename(x.split(" ")[0]) for x in out.stdout.splitlines()}


def run_exact(bins: Path, tmp_path: Path, name: str, *args: str, **extra: str) -> Run:
    run_dir = tmp_path / f"run-{name}-{'-'.join(args)}"
    run_dir.mkdir()
    env = dict(
        os.environ,
        LD_PRELOAD=str(LIBLOCUS),
        LOCUS_DIR=str(run_dir),
        LOCUS_LENSES="comm",
        LOCUS_COMM_BACKEND="exact",
        **extra,
    )
    proc = subprocess.run(
        [str(bins / name), *args, "--truth"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    run = Run(proc, run_dir)
    assert len(run.events), "no comm events written"
    assert np.all(run.events["flags"] & CE_EXACT)
    # Every worker thread wrote its counters; it saw accesses and lost nothing.
    tids = set(run.truth["tids"])
    rows = {int(r["tid"]): r for r in run.threads}
    assert tids <= set(rows), (tids, set(rows))
    for t in tids:
        assert rows[t]["backend"] == 3 and rows[t]["samples"] > 0 and rows[t]["dropped"] == 0
    return run


def test_p2p_block_diagonal(exact_bins, tmp_path):
    run = run_exact(exact_bins, tmp_path, "comm_p2p", "4", "3000", "2")
    tids = run.truth["tids"]
    pairs = {(tids[0], tids[1]), (tids[1], tids[0]), (tids[2], tids[3]), (tids[3], tids[2])}
    # No transfer at all outside the pairs, on the data lines or anywhere else.
    for src, dst, _ in run.matrix(run.events):
        assert (src, dst) in pairs, (src, dst)
    assert run.matrix() == run.expected()
    assert run.truth["expected"]["transfers"] == 4 * 2 * 3000 - 4


def test_transfers_carry_the_cpus_of_bound_threads(exact_bins, tmp_path):
    """With threads bound (compact: the n-th thread on CPU n mod CPUs), every transfer names
    the reader's CPU and the writer's, so the core matrix is complete."""
    ncpus = len(os.sched_getaffinity(0))
    if ncpus < 2:
        pytest.skip("needs 2 CPUs")
    run = run_exact(exact_bins, tmp_path, "comm_p2p", "2", "2000", LOCUS_BIND="compact")
    ev = run.events[run.inside]
    assert len(ev) and (ev["dst_cpu"] >= 0).all() and (ev["src_cpu"] >= 0).all()
    cpu_of: dict[int, set] = {}
    for e in ev:
        cpu_of.setdefault(int(e["dst_tid"]), set()).add(int(e["dst_cpu"]))
    assert all(len(c) == 1 for c in cpu_of.values()), cpu_of
    for e in ev:  # the writer's CPU is the one it reads on (bound)
        assert {int(e["src_cpu"])} == cpu_of[int(e["src_tid"])]
    a, b = run.truth["tids"]
    assert cpu_of[a] != cpu_of[b]  # consecutive threads, consecutive CPUs


@pytest.mark.parametrize("fraction", ["0.25", "0.75"])
def test_falseshare_fraction(exact_bins, tmp_path, fraction):
    run = run_exact(exact_bins, tmp_path, "comm_falseshare", "2", "4000", fraction, "8")
    m = run.matrix()
    assert m == run.expected()
    false = sum(v for (_, _, is_true), v in m.items() if not is_true)
    total = sum(m.values())
    assert abs(false / total - float(fraction)) < 0.03, (false, total)
    # The false-sharing transfers are on the false line, the true ones on the true line.
    lines = run.truth["lines"]
    ev = run.events[run.inside]
    is_true = (ev["flags"] & CE_TRUE) != 0
    assert set(ev["line"][is_true].tolist()) == {lines["true"]}
    assert set(ev["line"][~is_true].tolist()) == {lines["false"]}


def test_free_running_false_sharing_has_no_true_transfer(exact_bins, tmp_path):
    """Threads hammering their own counters of one line, with no turns (--free, false
    fraction 1): every transfer is false sharing. The model's {writer, bytes} pair was two
    stores; a thread that lost the line between them left its own bytes under the new
    writer, and its next access read as true sharing with itself (1-9 % of transfers).
    For ~1 s, not a number of bursts: on a busy machine one thread could finish 300,000
    bursts before the other ran (28 transfers in all, seen once)."""
    run = run_exact(exact_bins, tmp_path, "comm_falseshare", "2", "-", "1", "16", "--free")
    m = run.matrix()
    true = sum(v for (_, _, is_true), v in m.items() if is_true)
    total = sum(m.values())
    assert total > 1000 and true <= 0.001 * total, (true, total)


def test_readwrite_volume_grows_with_read_fraction(exact_bins, tmp_path):
    volumes = []
    for fraction in ("0.2", "0.8"):
        run = run_exact(exact_bins, tmp_path, "comm_readwrite", "2", "3000", fraction, "2")
        m = run.matrix()
        assert m == run.expected()
        writer = run.truth["tids"][0]
        assert all(src == writer and is_true for src, _, is_true in m)
        volumes.append(sum(m.values()))
    assert volumes == [2 * 600 * 2, 2 * 2400 * 2]


def test_writevol_volume_grows_with_share_fraction(exact_bins, tmp_path):
    volumes = []
    for fraction in ("0.1", "0.5", "0.9"):
        run = run_exact(exact_bins, tmp_path, "comm_writevol", "3", "2000", fraction, "2")
        m = run.matrix()
        assert m == run.expected()
        assert all(is_true for _, _, is_true in m)
        volumes.append(sum(m.values()))
    assert volumes[0] < volumes[1] < volumes[2]
    assert volumes[2] == 2 * (3 * 1800 - 1)
    # Both ends of every transfer are the one store line of write_lines (an inlined hook
    # names the instruction it serves, not its caller).
    exe = exact_bins / "comm_writevol"
    ev = run.events[run.inside]
    # Exact pcs are return addresses (or, inlined, the address after the hook's lea).
    lines = code_lines(run.dir, exe, [int(a) - 1 for a in [*ev["src_ip"], *ev["dst_ip"]]])
    src = (WORKLOADS / "comm_writevol.c").read_text().splitlines()
    store = next(i + 1 for i, t in enumerate(src) if "l[k].w[w] = v;" in t)
    assert lines == {f"comm_writevol.c:{store}"}, lines


def test_p2p_timed_default_with_lone_thread(exact_bins, tmp_path):
    """Default rounds (~1 s, each pair stops on its own) and an odd thread out."""
    run = run_exact(exact_bins, tmp_path, "comm_p2p", "5")
    tids = run.truth["tids"]
    pairs = {(tids[0], tids[1]), (tids[1], tids[0]), (tids[2], tids[3]), (tids[3], tids[2])}
    assert {(s, d) for s, d, _ in run.matrix(run.events)} <= pairs
    assert run.matrix() == run.expected()
    assert all(r > 0 for r in run.truth["pair_rounds"])


def test_report_states_how_the_hooks_are_called(exact_bins, tmp_path):
    """`locus record` tells an inlined (clang LTO) build from one calling liblocus.so per
    access, and the report says which; its volume line says every transfer was counted (its
    events are aggregates: "from 2 detections" read as two sampled detections)."""
    want = "calls" if "cc-calls" in exact_bins.name else "inlined"
    run_dir = tmp_path / "run"
    cmd = [str(REPO / "locus"), "record", "-o", str(run_dir), "--lens", "comm"]
    cmd += ["--backend", "exact", "--", str(exact_bins / "comm_p2p"), "2", "200"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run_dir / "meta.json").read_text())["comm"]["exact_hooks"] == want
    rep = subprocess.run(
        [str(REPO / "locus"), "report", str(run_dir), "--lens", "comm", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    comm = json.loads(rep.stdout)["lenses"]["comm"]
    assert comm["exact_hooks"] == want
    assert any(
        ("inlined" if want == "inlined" else "one call per access") in n for n in comm["notes"]
    )
    # Its events are aggregates, not sampled detections: the text says every transfer counts.
    text = subprocess.run(
        [str(REPO / "locus"), "report", str(run_dir), "--lens", "comm"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    ).stdout
    assert "every transfer counted;" in text and "detections:" not in text, text[:600]


# Two threads taking turns (a mutex and a condition variable, not instrumented): each turn
# runs step(me, i) of the program below it, and main() prints its truth after run_turns().
TURNS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int turn;
static long rounds;
static int tids[2];
static void step(int me, long i);

static void *worker(void *arg) {
  int me = (int)(long)arg;
  tids[me] = (int)syscall(SYS_gettid);
  for (long i = 0; i < rounds; i++) {
    pthread_mutex_lock(&m);
    while (turn != me) pthread_cond_wait(&c, &m);
    step(me, i);
    turn = !me;
    pthread_cond_broadcast(&c);
    pthread_mutex_unlock(&m);
  }
  return NULL;
}

static void run_turns(long n) {
  rounds = n;
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
}
"""

UNALIGNED = (
    TURNS
    + r"""
/* x spans the first two lines (bytes 60-67), y is unaligned inside the second (68-75).
 * Thread 0 writes x, thread 1 writes y, in turns: only the second line moves, by false
 * sharing (x's bytes 64-67 against y's 68-75); the first stays thread 0's, so its store
 * to x hits there and must still see that the second line is gone. */
struct __attribute__((packed)) rec { char pad[60]; long x, y; };
static _Alignas(64) struct { struct rec r; char tail[52]; } d; /* two lines of its own */

static void step(int me, long i) {
  if (me == 0)
    d.r.x = i;
  else
    d.r.y = i;
}

int main(int argc, char **argv) {
  run_turns(argc > 1 ? atol(argv[1]) : 1000);
  /* Thread 0 writes first: each later turn moves the second line from the other thread. */
  fprintf(stderr,
          "{\"workload\":\"unaligned\",\"tids\":[%d,%d],\"data\":[%lu,%lu],\"expected\":"
          "{\"pairs\":[{\"src_tid\":%d,\"dst_tid\":%d,\"true\":0,\"false\":%ld},"
          "{\"src_tid\":%d,\"dst_tid\":%d,\"true\":0,\"false\":%ld}]}}\n",
          tids[0], tids[1], (unsigned long)&d, (unsigned long)&d + 128, tids[0], tids[1],
          rounds, tids[1], tids[0], rounds - 1);
  return 0;
}
"""
)


def build_and_run(
    tmp_path, monkeypatch, source: str, name: str, cc_env: dict, *args: str, flags=()
):
    """`source` built by `locus cc` with `cc_env` (and `flags`), run under the exact backend:
    (the program's undefined symbols, the Run)."""
    if not LIBLOCUS.exists():
        pytest.skip("build/liblocus.so is not built: run `make build`")
    if shutil.which(cc_env["CC"]) is None:
        pytest.skip(f"{cc_env['CC']} is not installed")
    monkeypatch.delenv("LOCUS_CC_LTO", raising=False)
    for k, v in cc_env.items():
        monkeypatch.setenv(k, v)
    src, exe = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    assert cc.main(["-O2", "-g", "-pthread", *flags, "-o", str(exe), str(src)]) == 0
    nm = subprocess.run(["nm", "-u", str(exe)], capture_output=True, text=True).stdout
    return nm, run_exact(tmp_path, tmp_path, name, *args)


@pytest.mark.parametrize("build", ["clang", "clang-calls", "gcc", "gcc-early"])
def test_unaligned_accesses_across_lines(tmp_path, monkeypatch, build):
    """Packed fields: clang calls __tsan_unaligned_write8 for them, which gas.py inlines (a
    store across two lines must fail the test even when the first line is a hit, and call:
    the second line moved; one inside a line takes the hit test); so does gcc with the
    plugin (runtime/cc/late_tsan.cc turns tsan's range of 8 bytes into it); gcc without
    (LOCUS_CC_LATE_TSAN=0) calls __tsan_write_range. Inlined or called, every transfer is
    counted (1 per turn, false sharing)."""
    env = {"CC": build.split("-")[0], "LOCUS_CC_INLINE": "0" if build.endswith("-calls") else "1"}
    env["LOCUS_CC_LATE_TSAN"] = "0" if build == "gcc-early" else "1"
    nm, run = build_and_run(tmp_path, monkeypatch, UNALIGNED, "unaligned", env, "500")
    hook = "__tsan_unaligned_write8"
    if build == "gcc-early" or (build == "gcc" and cc.late_tsan_plugin(["gcc"]) is None):
        hook = "__tsan_write_range"
    assert hook in nm and ("locus_xt" in nm) == (not build.endswith("-calls")), nm
    assert run.matrix() == run.expected()


VECTORS = (
    TURNS
    + r"""
/* Both threads write every word of 4 lines in their turn, in a loop that gcc vectorises
 * (16-byte stores) when the hooks come after its vectoriser, and thread 1 then copies them
 * plus one to lines of its own (16-byte loads; a plain copy becomes a memcpy): each turn's
 * first store to each line moves it from the other thread, lines x (2 rounds - 1)
 * transfers, all true sharing (the copy's loads hit: thread 1 has just written the lines). */
static _Alignas(64) long v[4 * 8];
static _Alignas(64) long mine[4 * 8];
static long sum;

__attribute__((noinline)) static void fill(long x) {
  for (int i = 0; i < 4 * 8; i++) v[i] = x;
}

__attribute__((noinline)) static void copy(void) {
  for (int i = 0; i < 4 * 8; i++) mine[i] = v[i] + 1;
}

static void step(int me, long i) {
  fill(i);
  if (me == 1) {
    copy();
    sum += mine[i % 32];
  }
}

int main(int argc, char **argv) {
  run_turns(argc > 1 ? atol(argv[1]) : 1000);
  printf("%ld\n", sum);
  fprintf(stderr,
          "{\"workload\":\"vectors\",\"tids\":[%d,%d],\"data\":[%lu,%lu],\"expected\":"
          "{\"pairs\":[{\"src_tid\":%d,\"dst_tid\":%d,\"true\":%ld,\"false\":0},"
          "{\"src_tid\":%d,\"dst_tid\":%d,\"true\":%ld,\"false\":0}]}}\n",
          tids[0], tids[1], (unsigned long)v, (unsigned long)v + sizeof v, tids[0], tids[1],
          4 * rounds, tids[1], tids[0], 4 * (rounds - 1));
  return 0;
}
"""
)


@pytest.mark.parametrize("build", ["gcc", "gcc-early", "gcc-calls"])
def test_vectorised_loops_are_counted(tmp_path, monkeypatch, build):
    """gcc with the plugin (runtime/cc/late_tsan.cc) instruments after its vectoriser: the
    loops of VECTORS keep their 16-byte loads and stores, each with a __tsan_read16 /
    __tsan_write16 (the hit test inlined by gas.py, or called), and the exact backend counts
    the same transfers as with the hooks before the vectoriser (gcc-early: scalar loops)."""
    plugin = (REPO / "build" / cc.PLUGIN).exists()
    if build != "gcc-early" and not plugin:
        pytest.fail("build/locus_late_tsan.so is not built (gcc-12-plugin-dev; `make build`)")
    env = {"CC": "gcc", "LOCUS_CC_INLINE": "0" if build == "gcc-calls" else "1"}
    env["LOCUS_CC_LATE_TSAN"] = "0" if build == "gcc-early" else "1"
    nm, run = build_and_run(tmp_path, monkeypatch, VECTORS, "vectors", env, "400")
    vector = {"__tsan_write16", "__tsan_read16"}
    assert (vector <= set(nm.split())) == (build != "gcc-early"), nm
    assert run.matrix() == run.expected()


COPIES = (
    TURNS
    + r"""
/* Thread 0 fills `box` (memcpy, or memset every other round), thread 1 copies it out
 * (memmove), in turns: every round moves box's lines from thread 0 to thread 1 (true
 * sharing), and nothing goes back (thread 0 holds the lines it writes again). */
static _Alignas(64) char box[4096];
static _Alignas(64) char src[4096], dst[4096]; /* read at the end: the copies are kept */
static size_t n;

static void step(int me, long i) {
  if (me == 1)
    memmove(dst, box, n);
  else if (i % 2)
    memset(box, (int)i, n);
  else
    memcpy(box, src, n);
}

int main(int argc, char **argv) {
  n = argc > 2 ? (size_t)atol(argv[2]) : 256; /* a run-time size: a real call */
  for (size_t i = 0; i < sizeof src; i++) src[i] = (char)(i + (size_t)argc);
  run_turns(argc > 1 ? atol(argv[1]) : 100);
  long sum = 0;
  for (size_t i = 0; i < n; i++) sum += dst[i];
  printf("%ld\n", sum);
  fprintf(stderr,
          "{\"workload\":\"copies\",\"tids\":[%d,%d],\"data\":[%lu,%lu],\"expected\":"
          "{\"pairs\":[{\"src_tid\":%d,\"dst_tid\":%d,\"true\":%ld,\"false\":0}]}}\n",
          tids[0], tids[1], (unsigned long)box, (unsigned long)box + sizeof box, tids[0],
          tids[1], rounds * (long)((n + 63) / 64));
  return 0;
}
"""
)


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_memcpy_memmove_memset_are_counted(tmp_path, monkeypatch, compiler):
    """Neither compiler instruments calls to memcpy, memmove and memset (libtsan intercepts
    them): `locus cc` links them to liblocus.so's wrappers, which count their ranges, so a
    buffer handed over by memcpy/memset and read by memmove moves every line of it."""
    nm, run = build_and_run(tmp_path, monkeypatch, COPIES, "copies", {"CC": compiler}, "300", "256")
    assert "__wrap_memcpy" in nm and "__wrap_memset" in nm, nm  # memmove may be a memcpy
    assert run.matrix() == run.expected()
    # Run without locus, it copies as before.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
    exe = tmp_path / "copies"
    assert subprocess.run([str(exe), "10", "100"], env=env, timeout=60).returncode == 0


def test_fortified_copies_are_counted_and_still_checked(tmp_path, monkeypatch):
    """With _FORTIFY_SOURCE, gcc calls __memcpy_chk and __memset_chk where it knows the
    destination's size: liblocus.so's wrappers count their ranges as memcpy's, and an overflow
    still aborts the program ("buffer overflow detected"), as glibc's checked copies do. The
    wrappers check the size themselves: liblocus.so does not bind glibc's __*_chk, which are
    IFUNCs whose resolvers, run at load, fault 64 KiB of libc's code into every recorded
    program."""
    nm, run = build_and_run(
        tmp_path,
        monkeypatch,
        COPIES,
        "copies",
        {"CC": "gcc"},
        "300",
        "256",
        flags=("-D_FORTIFY_SOURCE=2",),
    )
    assert "__wrap___memcpy_chk" in nm and "__wrap___memset_chk" in nm, nm
    assert run.matrix() == run.expected()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
    over = subprocess.run(
        [str(tmp_path / "copies"), "1", "5000"], env=env, capture_output=True, text=True, timeout=60
    )
    assert over.returncode == -6 and "buffer overflow detected" in over.stderr, over
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(LIBLOCUS)], capture_output=True, text=True
    ).stdout
    assert not re.search(r"__\w+_chk\b", undefined), undefined


@pytest.mark.skipif(not shutil.which("cmake"), reason="cmake not installed")
def test_cmake_builds_with_locus_cc_as_one_word(locus, tmp_path):
    """CMake's ASM language takes CC as one program and dropped `cc` from CC="locus cc"
    (it ran `locus` on the assembly). `locus-cc` / `locus-c++` are the wrappers as one word,
    and a project of C, C++ and assembly builds instrumented."""
    bindir = Path(locus.argv[0]).parent
    if not (bindir / "locus-cc").exists():
        pytest.skip("locus is not run from an installed environment (no locus-cc beside it)")
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(t C CXX ASM)\n"
        "add_executable(t t.c s.S k.cpp)\n"
    )
    (tmp_path / "t.c").write_text(
        "#include <stdio.h>\nint sq(int);\nint k(int);\n"
        'int main(void) { printf("%d\\n", sq(3) + k(1)); return 0; }\n'
    )
    (tmp_path / "s.S").write_text(
        ".globl sq\nsq: mov %edi, %eax\n imul %edi, %eax\n ret\n"
        '.section .note.GNU-stack,"",@progbits\n'
    )
    (tmp_path / "k.cpp").write_text(
        'static int g;\nextern "C" int k(int x) { return g += x + 1; }\n'
    )
    env = dict(os.environ, CC=str(bindir / "locus-cc"), CXX=str(bindir / "locus-c++"))
    b = tmp_path / "b"
    subprocess.run(
        ["cmake", "-S", str(tmp_path), "-B", str(b)], env=env, check=True, capture_output=True
    )
    subprocess.run(["cmake", "--build", str(b)], env=env, check=True, capture_output=True)
    assert subprocess.run([str(b / "t")], capture_output=True, check=True).stdout == b"11\n"
    _proc, run = locus.record([str(b / "t")], ("--lens", "comm"))
    c = locus.report(run, "--lens", "comm")["lenses"]["comm"]
    assert c["backend"] == "exact" and c["samples"] >= 2, (c["backend"], c["samples"])  # k's g
