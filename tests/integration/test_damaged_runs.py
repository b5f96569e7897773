"""Runs that are not what was recorded: cut or missing files (refused, one line), an event
file that lost records (said), a program rebuilt since the run (said), and a daemon that
outlived the program (a complete run once it has ended, not "killed")."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

PROC_FLAGS_OFFSET = 76  # struct locus_proc: flags (docs/format.md)
PROC_END_OFFSET = 64  # end_ns
PROC_EXITED = 1


def proc_flags(entry: Path) -> int:
    return struct.unpack_from("<I", (entry / "proc.bin").read_bytes(), PROC_FLAGS_OFFSET)[0]


@pytest.fixture(scope="module")
def _recorded(tmp_path_factory) -> dict:
    return {"dir": tmp_path_factory.mktemp("damaged")}


@pytest.fixture
def comm_run(locus, _recorded) -> Path:
    """A copy, for the test to damage, of a comm run of comm_falseshare (recorded once):
    two threads, ~1 s, hundreds of detections."""
    src = _recorded["dir"] / "run"
    if not src.exists():
        proc = locus.run(
            "record", "--lens", "comm", "-o", str(src), "--",
            locus.workload("comm_falseshare"), "2", "-", "0.9", "--free",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    dst = locus.new_dir("copy")
    shutil.copytree(src, dst)
    return dst


def proc_dir(run: Path) -> Path:
    (p,) = (run / "procs").iterdir()
    return p


def refused(proc: subprocess.CompletedProcess, run: Path, what: str) -> str:
    """The command failed with one error line naming the run as damaged, and `what`."""
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert proc.stdout == b"", proc.stdout[:300]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"locus: error: {run} is damaged: "), err
    assert what in lines[0] and lines[0].endswith("record it again"), err
    return lines[0]


def test_an_intact_run_reads_without_a_word(locus, comm_run):
    """The reference for the tests below: the copy itself is fine."""
    proc = locus.run("report", str(comm_run), "--format", "json")
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "damaged" not in err and "incomplete" not in err, err
    rep = json.loads(proc.stdout)
    assert rep["run"]["complete"] is True
    c = rep["lenses"]["comm"]
    assert c["totals"]["detections"] > 100 and c["counters"]["detections"] > 100
    assert not any("incomplete" in n for n in c["notes"]), c["notes"]


@pytest.mark.parametrize(
    "name,size,record",
    [("comm.events.bin", 1000, 128), ("comm.threads.bin", 100, 128), ("threads.bin", 33, 64)],
)
def test_a_cut_record_file_is_refused(locus, comm_run, _recorded, name, size, record):
    """A file cut inside a record read as a run with fewer records, exit 0: "volume 16 ms
    from 15 detections" of 820, "0 samples", "0 threads in 1 process". The runtime extends
    its files in whole chunks (a killed process leaves whole records): a partial one is
    damage, refused by every command that reads the run."""
    pdir = proc_dir(comm_run)
    os.truncate(pdir / name, size)
    want = f"procs/{pdir.name}/{name} is {size} bytes, not a whole number of {record}-byte records"
    refused(locus.run("report", str(comm_run), "--lens", "comm"), comm_run, want)
    refused(locus.run("report", str(comm_run), "--format", "json"), comm_run, want)
    intact = _recorded["dir"] / "run"
    refused(locus.run("compare", str(intact), str(comm_run)), comm_run, want)


def test_an_emptied_counter_file_is_refused(locus, comm_run):
    """comm.threads.bin cut to 0 bytes read as "0 samples" beside the samples' events:
    every sampling thread writes its counters from its first sample on."""
    pdir = proc_dir(comm_run)
    os.truncate(pdir / "comm.threads.bin", 0)
    refused(
        locus.run("report", str(comm_run)),
        comm_run,
        f"procs/{pdir.name}/comm.threads.bin is empty though process {pdir.name} took samples",
    )


def test_missing_files_are_refused(locus, comm_run):
    """procs/ deleted read as "0 threads in 0 processes, complete" where meta.json said 1
    process of 3 threads; a process without its proc.bin was left out silently."""
    pdir = proc_dir(comm_run)
    meta = json.loads((comm_run / "meta.json").read_text())
    assert meta["processes"] == 1 and meta["complete"] is True
    (pdir / "threads.bin").unlink()
    refused(
        locus.run("report", str(comm_run)), comm_run, f"procs/{pdir.name}/threads.bin is missing"
    )
    (pdir / "proc.bin").unlink()
    refused(locus.run("report", str(comm_run)), comm_run, f"procs/{pdir.name} has no proc.bin")
    shutil.rmtree(comm_run / "procs")
    refused(
        locus.run("report", str(comm_run)),
        comm_run,
        "procs/ is missing (meta.json lists 1 process)",
    )


def test_a_killed_process_is_still_read(locus, comm_run):
    """Not damage: a process killed before it finished its records (no EXITED flag, no end)
    is read as it is, the run incomplete; killed before it created threads.bin too."""
    pdir = proc_dir(comm_run)
    with open(pdir / "proc.bin", "r+b") as f:
        f.seek(PROC_END_OFFSET)
        f.write(struct.pack("<Q", 0))
        f.seek(PROC_FLAGS_OFFSET)
        f.write(struct.pack("<I", 0))
    meta = json.loads((comm_run / "meta.json").read_text())
    meta["complete"] = False
    (comm_run / "meta.json").write_text(json.dumps(meta))
    rep = locus.report(comm_run)
    assert rep["run"]["complete"] is False and rep["lenses"]["comm"]["totals"]["detections"] > 100
    (pdir / "threads.bin").unlink()
    assert locus.report(comm_run)["run"]["complete"] is False


def test_an_event_file_cut_at_a_record_boundary_is_said(locus, comm_run):
    """Cut at a whole record, comm.events.bin cannot be told from a whole one by its size:
    the threads' counters (comm.threads.bin `detections`) say how many were written."""
    pdir = proc_dir(comm_run)
    os.truncate(pdir / "comm.events.bin", 15 * 128)
    proc = locus.run("report", str(comm_run), "--format", "json")
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    c = json.loads(proc.stdout)["lenses"]["comm"]
    counted = c["counters"]["detections"]
    assert c["totals"]["detections"] == 15 and counted > 100
    said = f"procs/{pdir.name}/comm.events.bin holds 15 of the {counted} detections"
    assert f"locus: warning: {said}" in err, err
    assert any(said in n and "event file is incomplete" in n for n in c["notes"]), c["notes"]


LOCKED = r"""
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
pthread_mutex_t NAME = PTHREAD_MUTEX_INITIALIZER;
static long n;
static void *w(void *a) {
  for (int i = 0; i < 20000; i++) {
    pthread_mutex_lock(&NAME);
    n++;
    pthread_mutex_unlock(&NAME);
  }
  return a;
}
int main(void) {
  pid_t child = fork(); /* two processes of one program: one word of it */
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, w, 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
  if (child > 0) waitpid(child, NULL, 0);
  printf("%ld\n", n);
  return 0;
}
"""


def build(src: Path, exe: Path, name: str) -> None:
    subprocess.run(
        ["gcc", "-g", "-O1", "-pthread", f"-DNAME={name}", "-o", str(exe), str(src)], check=True
    )


def test_a_rebuilt_program_is_said(locus, tmp_path):
    """Rebuilt after the run, the program was symbolized as it is now: its lock read
    `ring_lock`, the new build's name, with no word. The file the maps name is another (or
    modified since the process started): said once (two processes map it), on stderr and in
    the report."""
    src, exe = tmp_path / "prog.c", tmp_path / "prog"
    src.write_text(LOCKED)
    build(src, exe, "pair_lock")
    _proc, run = locus.record(["./prog"], ("--lens", "locks"))
    proc = locus.run("report", str(run), "--format", "json")
    assert proc.returncode == 0 and b"`./prog` changed" not in proc.stderr, proc.stderr
    rep = json.loads(proc.stdout)
    assert locus.lock_acquisitions(rep, "pair_lock") == 80000 and len(rep["run"]["pids"]) == 2
    assert not any("prog" in n for n in rep["run"].get("notes", []))

    build(src, exe, "ring_lock")
    said = (
        "`./prog` changed since the run (rebuilt?): names of its code and data may be wrong; "
        "record again"
    )
    proc = locus.run("report", str(run), "--format", "json")
    err = proc.stderr.decode()
    assert proc.returncode == 0 and err.count(said) == 1, err
    assert f"locus: warning: {said}" in err
    rep = json.loads(proc.stdout)
    assert said in rep["run"]["notes"] and said in rep["lenses"]["locks"]["notes"]
    text = locus.run("report", str(run))
    assert text.stdout.decode().count(f"note: {said[:40]}") == 1

    # Copied over in place (the same inode), after the run started: said too.
    build(src, exe, "pair_lock")
    _proc, run = locus.record(["./prog"], ("--lens", "locks"))
    later = time.time() + 5
    os.utime(exe, (later, later))
    err = locus.run("report", str(run)).stderr.decode()
    assert err.count(said) == 1, err


DAEMON = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
  if (daemon(1, 0) != 0) return 1;
  /* The daemon goes on until told (a file appears), 30 s at most. */
  for (int i = 0; i < 30000 && access(argv[1], F_OK) != 0; i++) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  return 0;
}
"""


def test_a_daemon_that_outlived_the_program(locus, tmp_path):
    """`daemon(1, 0)`, the daemon running on: the launcher said "a process ended without
    finishing its records (killed ...)", and the report, read after the daemon had ended
    and finished its records, still said INCOMPLETE (meta.json's `complete` is what the
    launcher saw)."""
    src, exe, go = tmp_path / "dm.c", tmp_path / "dm", tmp_path / "go"
    src.write_text(DAEMON)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(src)], check=True)
    run, log = locus.new_dir(), tmp_path / "stderr"
    try:
        # Its stderr to a file: the runtime keeps a copy of the stderr the program started
        # with (for its warnings), which the daemon holds open until it ends.
        with open(log, "wb") as f:
            proc = locus.run(
                "record", "--lens", "comm", "-o", str(run), "--", str(exe), str(go),
                capture_output=False, stdout=subprocess.DEVNULL, stderr=f,
            )  # fmt: skip
        err = log.read_text()
        assert proc.returncode == 0, err
        assert "ended without finishing" not in err, err
        assert "was still running when the program exited (daemon?)" in err, err
        entries = sorted((run / "procs").iterdir())
        assert len(entries) == 2, entries

        running = locus.report(run)
        assert running["run"]["complete"] is False
        assert any("still running (a daemon?)" in n for n in running["run"]["notes"])
    finally:
        go.touch()
    deadline = time.monotonic() + 60
    while not all(proc_flags(e) & PROC_EXITED for e in entries):
        assert time.monotonic() < deadline, "the daemon did not end"
        time.sleep(0.05)
    rep = locus.report(run)
    assert rep["run"]["complete"] is True, rep["run"]
    (note,) = rep["run"]["notes"]
    assert "outlived the program (a daemon?)" in note and "so they are whole" in note, note
    assert not any("incomplete run" in n for n in rep["lenses"]["comm"]["notes"])


STATIC_SLEEP = """
#include <unistd.h>
int main(void) { usleep(600000); return 0; }
"""


@pytest.mark.parametrize("image", ["dynamic", "static"])
def test_a_shell_s_background_job(locus, tmp_path, image):
    """`sh -c 'prog & echo started'`: the shell exits at once; its child exec's prog as the
    launcher finishes. The launcher listed the run before the child's new image had its
    entry and warned that the child "exec'd a program the runtime did not record (it
    dropped LD_PRELOAD ...)", when the runtime was starting in it; the report then named the
    child twice ("processes 12836, 12836 outlived the program"), once for the shell image
    that exec'd. Now a recorded image is waited for or said to be still running, a static
    one (not recorded) is still named so, and the report names each process once."""
    if image == "static":
        src, prog = tmp_path / "st.c", tmp_path / "stsleep"
        src.write_text(STATIC_SLEEP)
        built = subprocess.run(["gcc", "-static", "-o", str(prog), str(src)], capture_output=True)
        if built.returncode != 0:
            pytest.skip("no static libc to link with")
        job = str(prog)
    else:
        job = "sleep 0.6"
    run, log = locus.new_dir(), tmp_path / "stderr"
    with open(log, "wb") as f:  # (the job keeps the stderr it inherited open)
        proc = locus.run(
            "record", "--lens", "comm", "-o", str(run), "--", "sh", "-c", f"{job} & echo started",
            capture_output=False, stdout=subprocess.DEVNULL, stderr=f,
        )  # fmt: skip
    err = log.read_text()
    assert proc.returncode == 0, err
    shell = json.loads((run / "meta.json").read_text())
    entries = sorted((run / "procs").iterdir())
    pids = sorted({int(e.name.split(".")[0]) for e in entries})
    assert len(pids) == 2, entries  # the shell, its child
    child = max(pids)
    if image == "static":
        assert f"process {child} exec'd a program the runtime did not record" in err, err
        assert "still running" not in err, err
    else:
        assert "did not record" not in err, err
        assert f"a process (pid {child}) was still running when the program exited" in err, err
        assert shell["complete"] is False, shell
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{child}"):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    time.sleep(0.1)
    rep = locus.report(run)
    assert rep["run"]["complete"] is True, rep["run"]
    notes = rep["run"].get("notes", [])
    if image == "static":
        assert not notes, notes  # its recorded image ended at the exec, with the shell
    else:
        (note,) = notes
        assert note.startswith(f"process {child} outlived the program (a daemon?)"), note
