"""Real programs from Debian, recorded as users record them (workplace recipes/workloads.md)."""

from __future__ import annotations

import os
import pwd
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not installed (apt-get install {program}; `make deps`)")
    return path


def make_input(path: Path, size: int = 20 * 1024 * 1024) -> None:
    """~20 MB that compresses like real files: text from /usr/share/doc mixed with noise,
    deterministic so that failures reproduce."""
    rng = random.Random(1234)
    texts = []
    for p in sorted(Path("/usr/share/common-licenses").glob("*"))[:20]:
        if p.is_file():
            texts.append(p.read_bytes())
    text = b"".join(texts) or b"locus integration test input\n" * 1000
    with open(path, "wb") as f:
        written = 0
        while written < size:
            chunk = text[rng.randrange(len(text)) :][: 1 << 16] + rng.randbytes(4096)
            f.write(chunk)
            written += len(chunk)


def test_pigz_output_identical_and_cond_waits_seen(locus):
    pigz = need("pigz")
    src = locus.tmp / "input.bin"
    make_input(src)
    plain = subprocess.run([pigz, "-p", "2", "-c", str(src)], capture_output=True, timeout=120)
    assert plain.returncode == 0
    proc, run = locus.record([pigz, "-p", "2", "-c", str(src)])
    assert proc.stdout == plain.stdout, "pigz output differs under locus"
    rep = locus.report(run)
    locks = rep["lenses"]["locks"]
    assert locks["summary"]["acquisitions"] > 0
    cond = [r for r in locks["locks"] if "cond" in r["kind"] and r["acquisitions"] > 0]
    assert cond, sorted({r["kind"] for r in locks["locks"]})


@pytest.mark.parametrize("lenses", ["numa", "comm,numa"])
def test_zstd_with_its_own_segv_handler(locus, lenses):
    """zstd installs a SIGSEGV handler that prints a stack, through __sysv_signal (its CLI is
    built as strict C): it replaced the numa lens' first-touch handler, and the first touch
    of its buffers ran it ("Caught SIGSEGV signal, printing stack", exit 139)."""
    zstd = need("zstd")
    src = locus.tmp / "input.bin"
    make_input(src)
    argv = [zstd, "-T2", "-3", "-q", "-c", str(src)]
    plain = subprocess.run(argv, capture_output=True, timeout=120)
    assert plain.returncode == 0
    proc, run = locus.record(argv, ("--lens", lenses), check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-600:])
    assert proc.stdout == plain.stdout, "zstd output differs under locus"
    numa = locus.report(run)["lenses"]["numa"]["totals"]
    assert numa["first_touch"] + numa["unpinned_first_touch"] > 0, numa


def test_sysbench_mutex_counts(locus):
    sysbench = need("sysbench")
    # Long enough (~0.3 s) that the threads overlap even on a loaded 2-CPU machine: a 40 ms
    # run once finished with no contended acquisition at all.
    threads, locks_per_thread = 4, 1000000
    cmd = [
        sysbench,
        "mutex",
        f"--threads={threads}",
        "--mutex-num=4",
        f"--mutex-locks={locks_per_thread}",
        "--mutex-loops=50",
        "run",
    ]
    proc, run = locus.record(cmd)
    assert b"General statistics" in proc.stdout
    rep = locus.report(run)
    rows = sorted(rep["lenses"]["locks"]["locks"], key=lambda r: -r["acquisitions"])
    # sysbench's 4 mutexes (one malloc'ed array) take every lock of the test; sysbench's own
    # bookkeeping locks (init, statistics, the event queue) take a few hundred at most.
    top = rows[:4]
    assert sum(r["acquisitions"] for r in top) == threads * locks_per_thread, top
    assert all(r["kind"] == "mutex" for r in top), top
    assert len(rows) <= 4 or rows[4]["acquisitions"] < 10000, rows[:6]
    assert sum(r["contended"] for r in top) > 0


@pytest.mark.parametrize("lens", ["comm", "numa"])
def test_stress_ng_sigsegv_with_the_tsc_disabled(locus, lens):
    """stress-ng's sigsegv stressor turns rdtsc into a fault for itself (prctl PR_SET_TSC,
    PR_TSC_SIGSEGV) and catches SIGSEGV with siglongjmp: the sampler's clock must stop
    reading the TSC (the stressor was killed by a SIGSEGV in the sampler's handler), and
    stress-ng's own checks pass."""
    stress = need("stress-ng")
    cmd = [stress, "--sigsegv", "2", "--timeout", "2s", "--metrics-brief"]
    proc, run = locus.record(cmd, options=("--lens", lens), check=False, timeout=120)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err[-2000:]
    assert "fail" not in err.lower(), err[-2000:]
    c = locus.report(run, "--lens", lens)["lenses"][lens]
    # Sampled all along, the TSC forbidden or not.
    samples = c["samples"] if lens == "comm" else c["counters"]["samples"]
    assert c["backend"] == "soft" and samples > 100, samples


@pytest.mark.parametrize("lens", ["comm", "numa", "locks"])
def test_stress_ng_seccomp_workers_are_not_killed(locus, lens):
    """stress-ng's seccomp workers install allow-list filters (seccomp(2) through libc's
    syscall()) and expect to exit cleanly: the runtime's getpid() in the _exit interposer
    killed each with SIGSYS and the stressor failed. The runtime now finishes a process's
    records before its filter goes on and makes no system call after it."""
    stress = need("stress-ng")
    cmd = [stress, "--seccomp", "2", "--timeout", "2s", "--metrics-brief"]
    proc, run = locus.record(cmd, options=("--lens", lens), check=False, timeout=120)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err[-2000:]
    assert "fail" not in err.lower() and "incomplete" not in err, err[-2000:]
    assert "successful run completed" in err, err[-2000:]
    r = locus.report(run)["run"]
    assert r["complete"] is True
    assert len(r["sandboxed"]) >= 10, len(r["sandboxed"])


def test_stress_ng_cacheline_false_sharing_between_processes(locus):
    """stress-ng --cacheline: forked workers each write their own bytes of one cache line of
    a MAP_SHARED mapping (false sharing between processes). The report finds it, between
    the workers' threads, mostly false, on one line; most of it by the watchpoints armed
    on the other process's publications (its samples seldom meet on the line)."""
    stress = need("stress-ng")
    cmd = [stress, "--cacheline", "2", "--timeout", "2s", "--metrics-brief"]
    proc, run = locus.record(cmd, options=("--lens", "comm"), check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    c = locus.report(run, "--lens", "comm")["lenses"]["comm"]
    t = c["totals"]
    assert t["detections_between_processes"] >= 20, t
    assert t["traps_between_processes"] >= 10, t
    assert t["false"] >= 0.8 * t["all"], t
    m = c["matrices"]["thread"]["all"]
    workers = [i for i, row in enumerate(m) if any(row)]
    assert len(workers) >= 2 and c["threads"][0]["index"] not in workers, (workers, c["threads"])
    assert c["lines"][0]["verdict"] == "false" and c["lines"][0]["all"] >= 0.8 * t["all"]
    assert c["objects"][0]["kind"] != "unknown" and c["advice"], (c["objects"][:2], c["advice"])


NODE_WORKERS = r"""
const { Worker, isMainThread, workerData } = require('worker_threads');
if (isMainThread) {
  const sab = new SharedArrayBuffer(64);
  for (let i = 0; i < 2; i++) new Worker(__filename, { workerData: { sab, i } });
} else {
  const a = new Int32Array(workerData.sab);
  for (let k = 0; k < 2e7; k++) Atomics.add(a, workerData.i, 1);
}
"""


def test_node_workers_false_sharing_named_in_v8s_builtins(locus, tmp_path):
    """Two node workers each add to their own 4 bytes of one SharedArrayBuffer line. The
    adds run in V8's builtin Atomics.add, which V8 maps again near each worker's heap (a
    copy of node's code, mapped when the worker starts and unmapped when it ends, so in
    neither maps copy): the report names it from the runtime's mmap records, and the buffer
    by its allocation site in node."""
    node = need("node")
    script = tmp_path / "workers.js"
    script.write_text(NODE_WORKERS)
    proc, run = locus.record([node, str(script)], options=("--lens", "comm"), timeout=120)
    c = locus.report(run, "--lens", "comm")["lenses"]["comm"]
    t = c["totals"]
    assert t["all"] > 0 and t["false"] >= 0.9 * t["all"], t
    top = c["sites"][0]
    assert "AtomicsAdd" in top["function"] and top["all"] >= 0.5 * t["all"], c["sites"][:3]
    assert c["objects"][0]["kind"] == "heap" and "ArrayBuffer" in c["objects"][0]["name"], c[
        "objects"
    ][:2]


def test_gcc_temporaries_leave_no_records_and_the_object_file_is_the_same(locus):
    """gcc's cc1 allocates and frees temporaries constantly. Under the comm lens a block
    no sample fell in the life of has its records dropped at its free (comm/allocs.c): the
    run's heap.bin holds fewer blocks than it dropped (6.3 -> 1.9 MB of records on this
    compile), the count is in proc.bin's heap_dropped, and gcc's output is unchanged."""
    import numpy as np

    from locus.rundir import FREE_DTYPE, HEAP_DTYPE, RunDir, read_records

    gcc = need("gcc")
    src = Path(__file__).resolve().parents[2] / "workloads" / "comm_writevol.c"
    plain_o, traced_o = locus.tmp / "plain.o", locus.tmp / "traced.o"
    cmd = [gcc, "-O2", "-c", "-I", str(src.parent), str(src), "-o"]
    assert subprocess.run([*cmd, str(plain_o)], capture_output=True, timeout=120).returncode == 0
    _proc, run = locus.record([*cmd, str(traced_o)], ("--lens", "comm"))
    assert traced_o.read_bytes() == plain_o.read_bytes(), "gcc's object file differs"
    rd = RunDir.open(str(run))
    kept = frees = dropped = 0
    for p in rd.procs:
        kept += int((read_records(p.file("heap.bin"), HEAP_DTYPE)["site"] != 0).sum())
        frees += int((read_records(p.file("frees.bin"), FREE_DTYPE)["addr"] != 0).sum())
        dropped += int(p.hdr["heap_dropped"])
    assert dropped > kept > 0, (dropped, kept)
    # The report counts what the files and proc.bin hold, under its JSON names.
    c = locus.report(run)["lenses"]["comm"]
    assert c["heap_blocks"] == {"blocks": kept, "frees": frees, "short_lived": dropped}
    assert c["samples"] > 0 and np.isfinite(c["totals"]["all"])


def test_postgresql_under_pgbench(locus):
    """PostgreSQL: a postmaster forking a backend per connection, every process on one
    shared-memory segment, signals for everything (SIGUSR1 latches, SIGINT to stop). Recorded
    with the comm lens under pgbench: the server answers, stops when told, the run is whole,
    and what passes between the backends is named in the segment."""
    postgres, pgbench = need("postgres"), need("pgbench")
    initdb = str(Path(os.path.realpath(postgres)).parent / "initdb")
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user to run the server as (it refuses root)")
    if not os.path.exists(initdb) or os.geteuid() != 0:
        pytest.skip("initdb not beside postgres, or not root (runuser)")
    # (pytest's own directories are root's alone: the server's user could not reach them)
    home = Path(tempfile.mkdtemp(prefix="locus-pg-"))
    os.chmod(home, 0o755)
    os.chown(home, user.pw_uid, user.pw_gid)
    as_pg = ["runuser", "-u", "postgres", "--"]
    data, port = str(home / "data"), str(5400 + os.getpid() % 500)
    made = subprocess.run([*as_pg, initdb, "-D", data, "-A", "trust"], capture_output=True)
    assert made.returncode == 0, made.stderr.decode(errors="replace")[-800:]
    run = home / "run"
    server = subprocess.Popen(
        [*as_pg, *locus.argv, "record", "-o", str(run), "--lens", "comm", "--", postgres,
         "-D", data, "-k", str(home), "-p", port, "-c", "listen_addresses="],
        env=locus.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        sock = home / f".s.PGSQL.{port}"
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert server.poll() is None, server.stderr.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        bench = [*as_pg, pgbench, "-h", str(home), "-p", port]
        subprocess.run([*bench, "-i", "-s", "1", "postgres"], check=True, capture_output=True)
        out = subprocess.run(
            [*bench, "-c", "4", "-j", "2", "-T", "8", "postgres"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        assert "number of failed transactions: 0" in out.stdout, out.stdout
        subprocess.run([*as_pg, str(Path(initdb).parent / "pg_ctl"), "-D", data, "stop",
                        "-m", "fast"], check=True, capture_output=True)  # fmt: skip
        err = server.communicate(timeout=60)[1].decode(errors="replace")
    finally:
        if server.poll() is None:  # (a failure above: no server left running)
            subprocess.run([*as_pg, str(Path(initdb).parent / "pg_ctl"), "-D", data, "stop",
                            "-m", "immediate"], capture_output=True)  # fmt: skip
            server.kill()
            server.wait()
    assert server.returncode == 0, err[-1500:]
    assert "incomplete" not in err and "Traceback" not in err, err[-1500:]
    rep = locus.report(run)
    assert rep["run"]["complete"] is True and len(rep["run"]["pids"]) >= 6, rep["run"]
    comm = rep["lenses"]["comm"]
    assert comm["samples"] > 100, comm["samples"]
    # 4-8 detections in 4 s here, every one a watchpoint trap between two backends: 8 s, as
    # 4 s gave none twice on a host loaded by other work (load average 9-15 on its 2 CPUs)
    assert comm["totals"]["detections_between_processes"] > 0, comm["totals"]
    names = [o["name"] for o in comm["objects"]]
    assert names and names[0].startswith("shared memory from PGSharedMemoryCreate"), names
    for o in comm["objects"]:
        assert o["kind"] != "unknown", o
    shutil.rmtree(home, ignore_errors=True)
