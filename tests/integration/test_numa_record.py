"""`locus record --lens numa` on this one-node machine: emulated nodes (--fake-numa) against
the workloads' truth, real Debian programs recorded without harm (their output unchanged),
and the refusals a user meets. Real NUMA nodes are tested in tests/vm/."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest


def need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not installed (apt-get install {program}; `make deps`)")
    return path


def two_cpus() -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("--fake-numa 2 needs 2 CPUs")


def thp_enabled() -> bool:
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False
    return "[never]" not in mode


def test_transparent_huge_pages_first_touched_whole(locus):
    """An array with MADV_HUGEPAGE, initialised serially: each 2 MiB-aligned block inside it
    is first-touched once, as one huge page (not 512 pages), and the kernel still backs it
    with a huge page under the lens, as it does without."""
    two_cpus()
    if not thp_enabled():
        pytest.skip("transparent huge pages are off on this machine")
    cmd = [locus.workload("numa_firsttouch"), "2", "32", "--init", "serial", "--thp", "--truth"]
    proc, run = locus.record(cmd, ("--lens", "numa", "--fake-numa", "2"))
    truth = locus.truth(proc.stderr)
    assert truth["thp"] is True and truth["huge_pages"] >= 10
    # The kernel gave huge pages: protection and first-touch handling did not prevent them.
    assert truth["anon_huge_kb"] >= 2048 * truth["huge_pages"] // 2, truth["anon_huge_kb"]
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    assert numa["totals"]["huge_pages"] == truth["huge_pages"]
    a = max(numa["allocations"], key=lambda x: x["size"])
    assert a["huge_pages_per_node"] == {"0": truth["huge_pages"]}, a["huge_pages_per_node"]
    top = max(a["first_touch_threads"], key=lambda t: t["pages"])
    assert top["tid"] == truth["chunks"][0]["init_tid"] and top["site"].startswith("init_chunk")
    # A huge page counts once: far fewer first touches than the array's base pages.
    pages = truth["pages"]
    assert numa["totals"]["first_touch"] < pages - 500 * truth["huge_pages"]


def test_fake_numa_serial_first_touch(locus):
    """Emulated 2 nodes: worker k is pinned to CPU k, i.e. emulated node k; the serial
    initialisation by worker 0 puts every page on node 0, so worker 1's accesses are
    remote and the advice names the first-touch site."""
    two_cpus()
    cmd = [locus.workload("numa_firsttouch"), "2", "64", "--init", "serial", "--iters", "1000"]
    proc, run = locus.record([*cmd, "--truth"], ("--lens", "numa", "--fake-numa", "2"))
    truth = locus.truth(proc.stderr)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["numa"]["emulated"] is True and meta["numa"]["fake"] == 2
    assert meta["numa"]["cpu_node"][:2] == [0, 1]
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    assert numa["emulated"] is True
    assert [n["id"] for n in numa["nodes"]] == [0, 1]
    lo, hi = truth["chunks"][0]["lo"], truth["chunks"][-1]["hi"]
    alloc = next(
        a
        for a in numa["allocations"]
        if int(str(a["address"]), 0) <= lo and hi <= int(str(a["address"]), 0) + a["size"] + 4096
    )
    assert alloc["pages_per_node"].get("0", alloc["pages_per_node"].get(0)) >= truth["pages"] - 1
    init_tid = truth["chunks"][0]["init_tid"]
    top = max(alloc["first_touch_threads"], key=lambda t: t["pages"])
    assert top["tid"] == init_tid and top["pages"] >= truth["pages"] - 1
    m = numa["access_matrix"]
    row1 = m["values"][m["rows"].index(1)]
    assert row1[m["columns"].index(0)] > 0 and row1[m["columns"].index(1)] == 0
    assert any(a["kind"] == "serial_first_touch" for a in numa["advice"]), (
        numa["advice"],
        alloc["accesses"],
        alloc["accesses_from_nodes"],
    )
    text = locus.run("report", str(run), "--lens", "numa").stdout.decode()
    assert "EMULATED" in text.splitlines()[0] or "EMULATED" in text[:2000]


def test_fake_numa_pinning_log(locus):
    two_cpus()
    cmd = [locus.workload("numa_pinning"), "0.2", "--truth"]
    proc, run = locus.record(cmd, ("--lens", "numa", "--fake-numa", "2"))
    truth = locus.truth(proc.stderr)
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    roles = {t["role"]: t["tid"] for t in truth["thread_list"]}
    threads = {t["tid"]: t for t in numa["threads"]}
    assert threads[roles["unpinned"]]["pinned"] is False
    assert threads[roles["pinned"]]["pinned"] is True
    rep = [e for e in numa["pinning_log"] if e["tid"] == roles["repinned"]]
    assert [e["what"] for e in rep].count("sched_setaffinity") == 2
    log = numa["pinning_log"]
    assert any(e["what"] == "set_mempolicy" and e["tid"] == roles["pinned"] for e in log), log


def digest(cmd: list[str], **kw) -> str:
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=300, **kw).stdout
    return hashlib.sha256(out).hexdigest()


def test_real_programs_under_numa(locus, tmp_path):
    """pigz and xz (threads, big malloc'd buffers, read() into fresh memory) give
    byte-identical output under the lens; stress-ng --vm and sysbench memory run clean."""
    data = tmp_path / "input.bin"
    libs = sorted(
        (p for p in os.scandir("/usr/lib/x86_64-linux-gnu") if p.is_file()), key=lambda p: p.name
    )
    with open(data, "wb") as f:
        size = 0
        for p in libs:
            if size > 8 << 20:
                break
            b = open(p.path, "rb").read()
            f.write(b)
            size += len(b)
    for cmd in (
        [need("pigz"), "-p", "2", "-c", str(data)],
        [need("xz"), "-T2", "-3", "-c", str(data)],
    ):
        plain = digest(cmd)
        out = tmp_path / f"rec-{os.path.basename(cmd[0])}"
        traced = digest(
            [*locus.argv, "record", "-o", str(out), "--lens", "numa", "--", *cmd], env=locus.env
        )
        assert traced == plain, cmd
        numa = locus.report(out, "--lens", "numa")["lenses"]["numa"]
        assert numa["totals"]["first_touch"] + numa["totals"]["unpinned_first_touch"] > 0
        assert numa["samples"] > 0
    for cmd in (
        [need("stress-ng"), "--vm", "2", "--vm-bytes", "16M", "--timeout", "1s", "-q"],
        [need("sysbench"), "memory", "--threads=2", "--memory-total-size=512M", "run"],
    ):
        proc, run = locus.record(cmd, ("--lens", "numa"))
        numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
        vals = numa["access_matrix"]["values"]
        assert len(vals) == 2 and all(v >= 0 for r in vals for v in r)  # unpinned + node 0


def test_numpy_blas_threads_under_numa(locus):
    """numpy's matmul: two OpenBLAS threads zero one 18 MB matrix (madvise'd for huge pages)
    at once. It livelocked under the lens (a growing block marked pages open that its
    thread never opened, then every fault on them was taken for a race), and locus's own
    fatal-signal handler looped on its re-raise. It must finish with the right result, and
    both threads' first touches are recorded."""
    import sys

    code = (
        "import numpy as np; a = np.random.default_rng(1).random((1500, 1500));"
        "print(round(float((a @ a).sum())))"
    )
    env = {**locus.env, "OPENBLAS_NUM_THREADS": "2"}
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=120)
    # The race hit 2 runs in 5 before the fix: three runs, each would time out.
    for _ in range(3):
        proc, run = locus.record(
            [sys.executable, "-c", code], ("--lens", "numa"), env=env, timeout=60
        )
        assert proc.stdout == plain.stdout and plain.stdout.strip()
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    assert numa["totals"]["first_touch"] + numa["totals"]["unpinned_first_touch"] > 0


def test_crashing_program_dies_and_its_run_is_whole(locus):
    """A program that crashes (SIGSEGV on a NULL read) under the numa lens dies of it, as
    without locus: the lens's SIGSEGV handler passes the fault on to the runtime's
    fatal-signal handler, which finishes the records and re-raises. Before, that re-raise
    came back to the lens's handler forever and the program hung. The run is complete (its
    records are whole up to the crash) and names the signal."""
    import sys

    code = "import ctypes; print('crashing', flush=True); ctypes.string_at(0)"
    proc, run = locus.record(
        [sys.executable, "-c", code], ("--lens", "numa"), check=False, timeout=60
    )
    assert proc.returncode == 128 + 11 and b"crashing" in proc.stdout
    rep = locus.report(run, "--lens", "numa")
    assert rep["run"]["complete"] is True and rep["run"]["signal"] == "SIGSEGV"
    text = locus.run("report", str(run), "--lens", "numa").stdout.decode()
    assert "killed by SIGSEGV" in " ".join(text.split())


# An allocator of its own, in a shared library the program links (as redis links
# libjemalloc): blocks of 64 KiB and more start a page, after a PROT_NONE reserved page, so
# nothing readable sits in front of them (glibc keeps a size word there).
OWN_MALLOC = r"""
#include <string.h>
#include <sys/mman.h>
#define PAGE 4096UL
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)
static char *bump(size_t n, int large) {
  size_t len = (n + 16 + PAGE - 1) & ~(PAGE - 1);
  if (!large) {
    char *m = mmap(0, len, PROT_READ | PROT_WRITE, ANON, -1, 0);
    if (m == MAP_FAILED) return 0;
    *(size_t *)m = n;
    return m + 16;
  }
  /* Reserve a guard page and the block, then commit the block: the block starts a page. */
  char *r = mmap(0, len + PAGE, PROT_NONE, ANON | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return 0;
  char *m = mmap(r + PAGE, len, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, -1, 0);
  return m == MAP_FAILED ? 0 : m;
}
void *malloc(size_t n) { return bump(n, n >= 65536); }
void free(void *p) { (void)p; }
void *calloc(size_t k, size_t n) { return malloc(k * n); } /* fresh mmap: zeroed */
void *realloc(void *p, size_t n) {
  void *q = malloc(n);
  if (p && q) memcpy(q, p, n < 16 ? n : 16); /* enough for the libc callers here */
  return q;
}
"""
OWN_MALLOC_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
int main(void) {
  for (int r = 0; r < 4; r++) {
    char *big = malloc(1 << 20);
    for (int i = 0; i < (1 << 20); i += 4096) big[i] = (char)i;
    free(big);
  }
  puts("done");
  return 0;
}
"""


def test_numa_with_another_allocator(locus, tmp_path):
    """A program whose malloc is not glibc's (redis and jemalloc) ran under the numa lens:
    the lens read the glibc size word in front of each large block, which this allocator
    does not have: SIGSEGV on the guard page (redis --io-threads died at start). Now its
    blocks are tracked through the allocator's mmap calls."""
    (tmp_path / "own.c").write_text(OWN_MALLOC)
    (tmp_path / "main.c").write_text(OWN_MALLOC_MAIN)
    lib, exe = tmp_path / "libown.so", tmp_path / "main"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "own.c")],
                   check=True)  # fmt: skip
    subprocess.run(
        ["cc", "-O1", "-o", str(exe), str(tmp_path / "main.c"), f"-L{tmp_path}", "-lown",
         f"-Wl,-rpath,{tmp_path}"],
        check=True,
    )  # fmt: skip
    proc, run = locus.record([str(exe)], ("--lens", "numa"), check=False, timeout=60)
    assert proc.returncode == 0 and proc.stdout == b"done\n", proc.stderr[-2000:]
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    assert numa["totals"]["first_touch"] >= 4 * 256


def test_numa_exact_backend_counts(locus, tmp_path):
    """`locus cc` build of numa_firsttouch: every access counted; on one node all pinned
    accesses are local and the compute loop's count is exactly its element accesses."""
    exe = tmp_path / "numa_firsttouch"
    src = os.path.join(os.path.dirname(locus.workload("x")), "..", "numa_firsttouch.c")
    cc = locus.run(
        "cc", "-O2", "-g", "-std=c11", "-D_GNU_SOURCE", "-pthread", "-o", str(exe), src, "-ldl"
    )
    assert cc.returncode == 0, cc.stderr
    proc, run = locus.record(
        [str(exe), "2", "2", "--init", "parallel", "--iters", "3", "--truth"],
        ("--lens", "numa", "--backend", "exact"),
    )
    truth = locus.truth(proc.stderr)
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    assert numa["backend"] == "exact" and numa["unit"] == "accesses"
    site = next(s for s in numa["sites"] if s["function"] == truth["compute_site"])
    want = sum(w["reads"] + w["writes"] for w in truth["workers"])
    assert site["accesses"] == want, (site, want)
    assert site["remote"] == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--fake-numa", "2"), "applies to the numa lens"),
        (("--lens", "numa", "--fake-numa", "0"), "fake-numa"),
        (("--lens", "numa", "--fake-numa", "4096"), "CPUs"),
    ],
)
def test_bad_numa_options(locus, args, needle):
    proc = locus.run("record", *args, "--", "true")
    assert proc.returncode == 2
    assert needle in locus.one_error_line(proc) or needle in proc.stderr.decode()


def test_report_numa_on_a_run_without_it(locus):
    proc, run = locus.record(["true"])
    r = locus.run("report", str(run), "--lens", "numa")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr.decode()
    assert "numa" in r.stderr.decode()


def test_no_first_touch_still_counts_placement(locus):
    """--no-first-touch: nothing is protected (no touch records), the census still gives
    each allocation's placement at free or exit."""
    cmd = [locus.workload("numa_firsttouch"), "2", "8", "--init", "serial", "--truth"]
    proc, run = locus.record(cmd, ("--lens", "numa", "--no-first-touch"))
    truth = locus.truth(proc.stderr)
    assert json.loads((run / "meta.json").read_text())["numa"]["first_touch"] is False
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    assert numa["totals"]["first_touch"] == 0 and numa["totals"]["unpinned_first_touch"] == 0
    lo = truth["chunks"][0]["lo"]
    alloc = next(a for a in numa["allocations"] if int(str(a["address"]), 0) <= lo)
    assert alloc["placement"] == "final"
    assert sum(alloc["pages_per_node"].values()) == truth["pages"]


def test_fake_numa_topology_file(locus, tmp_path):
    """--fake-numa FILE: the file's nodes (one of them memory-only) and distances are the
    run's topology; a bad file is one error line and exit 2."""
    two_cpus()
    topo = tmp_path / "topo.json"
    topo.write_text(
        json.dumps(
            {
                "nodes": [
                    {"id": 0, "cpus": [0], "distances": [10, 20, 30]},
                    {
                        "id": 1,
                        "cpus": list(range(1, os.cpu_count() or 2)),
                        "distances": [20, 10, 14],
                    },
                    {"id": 2, "cpus": [], "distances": [30, 14, 10]},
                ]
            }
        )
    )
    proc, run = locus.record(
        [locus.workload("numa_firsttouch"), "2", "8"], ("--lens", "numa", "--fake-numa", str(topo))
    )
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    assert numa["emulated"] is True and numa["fake"] == 3 and numa["fake_file"] == str(topo)
    assert [n["memory_only"] for n in numa["nodes"]] == [False, False, True]
    assert numa["nodes"][1]["distances"] == [20, 10, 14]
    assert numa["access_matrix"]["rows"] == ["unpinned", 0, 1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes": [{"id": 0, "cpus": [0]}]}))
    p = locus.run("record", "--lens", "numa", "--fake-numa", str(bad), "--", "true")
    assert p.returncode == 2 and "belong to no node" in locus.one_error_line(p)


XMALLOC = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) void *xmalloc(size_t n) {
  void *p = malloc(n); /* line 6 */
  if (!p) abort();
  return p;
}
struct stats { long a, b; };
static struct stats *S;
static void *w(void *arg) {
  for (long i = 0; i < 300000000; i++) {
    if (arg) S->b++; else S->a++;
    __asm__ volatile("" ::: "memory");
  }
  return 0;
}
int main(void) {
  S = xmalloc(sizeof *S); /* line 20 */
  pthread_t a, b;
  pthread_create(&a, 0, w, (void *)0);
  pthread_create(&b, 0, w, (void *)1);
  pthread_join(a, 0);
  pthread_join(b, 0);
  printf("%ld\n", S->a + S->b);
}
"""


def test_allocations_named_past_a_wrapper(locus, tmp_path):
    """A program that allocates through its own xmalloc: with --call-stack, the allocation
    site is the line that called xmalloc, `via` names the wrapper; without, it is xmalloc
    (and the comm lens says to record call stacks)."""
    (tmp_path / "xm.c").write_text(XMALLOC)
    exe = tmp_path / "xm"
    subprocess.run(
        ["cc", "-O1", "-g", "-o", str(exe), str(tmp_path / "xm.c"), "-lpthread"], check=True
    )
    for stacks in (True, False):
        opts = ("--lens", "numa,comm") + (("--call-stack",) if stacks else ())
        _proc, run = locus.record([str(exe)], options=opts)
        rep = locus.report(run)
        sites = {(s["function"], s["line"]): s for s in rep["lenses"]["numa"]["alloc_sites"]}
        if stacks:
            assert sites[("main", 20)]["via"] == ["xmalloc"], sites
        else:
            assert ("xmalloc", 6) in sites and sites[("xmalloc", 6)]["via"] == [], sites
            notes = rep["lenses"]["comm"]["notes"]
            objects = rep["lenses"]["comm"]["objects"]
            if objects:  # a wrapper-named object needs a detection
                assert any("allocation wrapper (xmalloc)" in n for n in notes), notes


MEMSET_INIT = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) static void init(char *p, size_t n) {
  memset(p, 1, n); /* MEMSET */
}
int main(void) {
  size_t n = 32u << 20;
  char *p = malloc(n);
  init(p, n);
  long s = 0;
  for (size_t i = 0; i < n; i += 4096) s += p[i];
  printf("%ld\n", s > 0);
  return 0;
}
"""


def test_first_touches_in_memset_name_the_programs_call(locus, tmp_path):
    """A buffer first-touched by memset: the touching instruction is the C library's, and
    the site said only `__memset_avx2_unaligned_erms memset-vec-unaligned-erms.S:...`. The
    site now carries the program's call that led there (the fault handler's stack scan):
    `init` at the memset's line, for all of its first touches."""
    (tmp_path / "ms.c").write_text(MEMSET_INIT)
    exe = tmp_path / "ms"
    subprocess.run(["gcc", "-O1", "-g", "-o", str(exe), str(tmp_path / "ms.c")], check=True)
    line = next(n for n, s in enumerate(MEMSET_INIT.splitlines(), 1) if "/* MEMSET */" in s)
    _proc, run = locus.record([str(exe)], ("--lens", "numa"))
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    lib = [s for s in numa["sites"] if "memset" in s["function"]]
    assert lib and lib[0]["first_touch"] + lib[0]["unpinned_first_touch"] >= 8000, numa["sites"]
    (k,) = lib[0]["touch_callers"]
    assert (k["function"], k["line"], k["share"]) == ("init", line, 1.0), lib[0]
    assert all(not s["touch_callers"] for s in numa["sites"] if s["file"].endswith("ms.c"))


VDSO_LOOP = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
  struct timespec t;
  long s = 0;
  for (long i = 0; i < 4000000; i++) {
    clock_gettime(CLOCK_MONOTONIC, &t); /* CALL */
    s += t.tv_nsec;
  }
  printf("%d\n", s != 0);
  return 0;
}
"""


def test_samples_in_the_vdso_are_named(locus, tmp_path):
    """A program that reads the clock in a loop spends its time in the vDSO, which is no
    file: its samples were bare addresses (0x7f6e93479b57). The runtime keeps a copy of the
    vDSO's image (vdso.so in the process's directory), and the report names its functions,
    with the program's call into it."""
    (tmp_path / "vd.c").write_text(VDSO_LOOP)
    exe = tmp_path / "vd"
    subprocess.run(["gcc", "-O1", "-g", "-o", str(exe), str(tmp_path / "vd.c")], check=True)
    line = next(n for n, s in enumerate(VDSO_LOOP.splitlines(), 1) if "/* CALL */" in s)
    _proc, run = locus.record([str(exe)], ("--lens", "numa"))
    assert list(run.glob("procs/*/vdso.so")), list(run.glob("procs/*/*"))
    numa = locus.report(run, "--lens", "numa")["lenses"]["numa"]
    vdso = [s for s in numa["sites"] if "clock_gettime" in s["function"]]
    assert vdso and vdso[0]["accesses"] >= 10, numa["sites"][:4]
    assert [(k["function"], k["line"]) for k in vdso[0]["callers"]] == [("main", line)], vdso[0]
