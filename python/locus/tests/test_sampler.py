"""The service-time sampler: parsers, and a short real sampling of a busy child."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time

from locus import sampler


def test_parsers():
    assert sampler.parse_schedstat(b"117819808 0 2\n") == 117819808
    line = b"42 (a b) c) R 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0\n"
    assert sampler.parse_stat_service(line, 100) == 3_000_000_000
    assert sampler.parse_running(b"0.16 0.18 0.16 3/83 4991\n") == 3


def test_proc_flags(tmp_path):
    p = tmp_path / "proc.bin"
    hdr = bytearray(256)
    struct.pack_into("<I", hdr, sampler.PROC_FLAGS_OFFSET, 5)
    p.write_bytes(bytes(hdr))
    assert sampler.proc_flags(str(p)) == 5
    p.write_bytes(b"short")
    assert sampler.proc_flags(str(p)) is None
    assert sampler.proc_flags(str(tmp_path / "absent")) is None


def read_samples(path):
    data = path.read_bytes()
    assert len(data) % sampler.SAMPLE.size == 0
    return [sampler.SAMPLE.unpack_from(data, o) for o in range(0, len(data), 32)]


def test_samples_a_busy_child_and_its_descendants(tmp_path):
    (tmp_path / "procs").mkdir()
    # A child that spins, and a grandchild that spins too.
    spin = "import time\nt=time.time()\nwhile time.time()-t<0.6: pass\n"
    child = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess,sys; g=subprocess.Popen([sys.executable,'-c',{spin!r}]); "
         f"exec({spin!r}); g.wait()"]
    )  # fmt: skip
    s = sampler.Sampler(str(tmp_path), child.pid, interval_ms=5)
    s.start()
    child.wait()
    s.stop()
    stats = s.stats()
    assert stats["error"] is None and stats["ticks"] > 10
    rows = read_samples(tmp_path / "sched.bin")
    system = [r for r in rows if r[3] == 0]
    tasks = [r for r in rows if r[3] != 0]
    assert len(system) == stats["ticks"]
    assert {r[2] for r in tasks} >= {child.pid}
    assert len({r[2] for r in tasks}) >= 2, "grandchild not found"
    mine = [r[1] for r in tasks if r[3] == child.pid]
    assert mine == sorted(mine) and mine[-1] > 100_000_000  # > 0.1 s of CPU
    ts = [r[0] for r in system]
    assert ts == sorted(ts)
    assert 0 <= stats["cpu_s"] < 1.0


def test_backoff_limits_reads_per_tick(tmp_path):
    s = sampler.Sampler(str(tmp_path), os.getpid(), interval_ms=10, max_reads_per_tick=1)
    s._tasks = {1: (os.getpid(), None), 2: (os.getpid(), None), 3: (os.getpid(), None)}
    reads = []
    s._read_task = lambda pid, tid, fd: reads.append(tid) or 1
    with open(tmp_path / "sched.bin", "wb") as out:
        buf = bytearray()
        for _ in range(3):
            s.sample_once(out, buf)
    assert sorted(reads) == [1, 2, 3] and s.max_stride == 3
    assert s.stats()["backed_off"] is True


def test_stop_is_prompt(tmp_path):
    s = sampler.Sampler(str(tmp_path), os.getpid(), interval_ms=1000)
    s.start()
    time.sleep(0.05)
    t = time.monotonic()
    s.stop()
    assert time.monotonic() - t < 0.5


def test_stop_ends_the_wait_under_way(tmp_path):
    """stop() wakes the sampler in the middle of its wait (the launcher waited for it, up
    to a whole 10 ms interval, at the end of every run): an hour-long nap ends."""
    s = sampler.Sampler(str(tmp_path), os.getpid(), interval_ms=1000)
    t = threading.Thread(target=s._nap, args=(3600.0,), daemon=True)
    t.start()
    s._wake()  # what stop() does before it joins the sampler
    t.join(timeout=120)
    assert not t.is_alive()
    s.stop()


def test_schedstat_switches():
    assert sampler.parse_schedstat_switches(b"117819808 0 2\n") == 2
    assert sampler.parse_schedstat_switches(b"117819808\n") == 0
