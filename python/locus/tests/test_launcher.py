"""Launcher pieces that need no runtime: command resolution, ELF check, run directories."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import struct
import sys
import time

import pytest

from locus import launcher
from locus.errors import LocusError


def test_resolve_command_uses_path():
    assert launcher.resolve_command("sh") == os.path.abspath(shutil.which("sh"))


def test_resolve_command_codes(tmp_path):
    with pytest.raises(LocusError) as e:
        launcher.resolve_command("locus-no-such-command-xyz")
    assert e.value.code == 127
    with pytest.raises(LocusError) as e:
        launcher.resolve_command(str(tmp_path / "absent"))
    assert e.value.code == 127
    with pytest.raises(LocusError) as e:
        launcher.resolve_command(str(tmp_path))
    assert e.value.code == 126


def fake_elf(path, phdr_types, is64=True):
    """A minimal ELF header plus program headers of the given types."""
    if is64:
        ehdr = bytearray(64)
        ehdr[:6] = b"\x7fELF\x02\x01"
        struct.pack_into("<QHH", ehdr, 32, 64, 0, 0)  # e_phoff
        struct.pack_into("<HH", ehdr, 54, 56, len(phdr_types))
        ph = b"".join(struct.pack("<I", t) + bytes(52) for t in phdr_types)
    else:
        ehdr = bytearray(52)
        ehdr[:6] = b"\x7fELF\x01\x01"
        struct.pack_into("<I", ehdr, 28, 52)
        struct.pack_into("<HH", ehdr, 42, 32, len(phdr_types))
        ph = b"".join(struct.pack("<I", t) + bytes(28) for t in phdr_types)
    path.write_bytes(bytes(ehdr) + ph)
    return str(path)


def test_elf_static_detection(tmp_path):
    assert launcher.elf_is_static(fake_elf(tmp_path / "a", [6, 3, 1, 2])) is False
    assert launcher.elf_is_static(fake_elf(tmp_path / "b", [1, 1, 4])) is True
    assert launcher.elf_is_static(fake_elf(tmp_path / "c", [1, 2])) is True  # static-pie
    assert launcher.elf_is_static(fake_elf(tmp_path / "d", [3], is64=False)) is False
    assert launcher.elf_is_static(fake_elf(tmp_path / "e", [1], is64=False)) is True


def test_elf_real_binaries(tmp_path):
    assert launcher.elf_is_static(os.path.realpath(sys.executable)) is False
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\n")
    assert launcher.elf_is_static(str(script)) is False


def test_create_run_dir_default_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = datetime.datetime(2024, 5, 6, 7, 8, 9).timetuple()
    a = launcher.create_run_dir(None, ["/usr/bin/app", "x"], now)
    b = launcher.create_run_dir(None, ["/usr/bin/app", "x"], now)
    assert os.path.basename(a) == "locus-app-20240506-070809"
    assert os.path.basename(b) == "locus-app-20240506-070809-2"
    assert os.path.isdir(os.path.join(a, "procs"))


def test_create_run_dir_policy(tmp_path):
    now = time.localtime()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert launcher.create_run_dir(str(empty), ["x"], now) == str(empty)
    old = tmp_path / "old"
    old.mkdir()
    (old / "meta.json").write_text(json.dumps({"format_version": 1, "locus_version": "0"}))
    (old / "junk").write_text("")
    launcher.create_run_dir(str(old), ["x"], now)
    assert sorted(os.listdir(old)) == ["procs"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "meta.json").write_text("{}")
    with pytest.raises(LocusError) as e:
        launcher.create_run_dir(str(foreign), ["x"], now)
    assert e.value.code == 2
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(LocusError):
        launcher.create_run_dir(str(f), ["x"], now)


def test_exit_status_convention():
    assert launcher.exit_status(0) == (0, None)
    assert launcher.exit_status(3) == (3, None)
    assert launcher.exit_status(-9) == (137, "SIGKILL")
    assert launcher.exit_status(-15) == (143, "SIGTERM")


def test_selected_env():
    env = {"PATH": "/bin", "HOME": "/root", "LD_PRELOAD": "a", "OMP_NUM_THREADS": "4",
           "GOMP_SPINCOUNT": "1", "KMP_AFFINITY": "x", "LOCUS_DIR": "d"}  # fmt: skip
    assert sorted(launcher.selected_env(env)) == [
        "GOMP_SPINCOUNT", "KMP_AFFINITY", "LD_PRELOAD", "LOCUS_DIR", "OMP_NUM_THREADS"
    ]  # fmt: skip


def test_find_runtime_env(tmp_path, monkeypatch):
    so = tmp_path / "liblocus.so"
    so.write_bytes(b"")
    monkeypatch.setenv("LOCUS_RUNTIME", str(so))
    assert launcher.find_runtime() == str(so)
    monkeypatch.setenv("LOCUS_RUNTIME", str(tmp_path / "nope.so"))
    with pytest.raises(LocusError, match="make build"):
        launcher.find_runtime()


def test_host_info_shape():
    h = launcher.host_info()
    assert set(h) == {"hostname", "cpus", "online_cpus", "numa_nodes", "cpu_node",
                      "cache_line", "kernel", "machine"}  # fmt: skip
    assert h["numa_nodes"] >= 1 and h["online_cpus"] >= 1
    # Every CPU has its node; the nodes with CPUs are among the machine's nodes.
    assert len(h["cpu_node"]) >= h["online_cpus"]
    assert all(0 <= n for n in h["cpu_node"]) and len(set(h["cpu_node"])) <= h["numa_nodes"]


def test_count_threads_reads_proc_bin(tmp_path):
    entry = tmp_path / "123"
    entry.mkdir()
    hdr = bytearray(256)
    struct.pack_into("<Q", hdr, 104, 5)
    (entry / "proc.bin").write_bytes(bytes(hdr))
    assert launcher.count_threads(str(entry)) == 5
    struct.pack_into("<Q", hdr, 104, 0)
    (entry / "proc.bin").write_bytes(bytes(hdr))
    slots = bytearray(64 * 3)
    struct.pack_into("<II", slots, 0, 10, 1)
    struct.pack_into("<II", slots, 64, 11, 2)
    (entry / "threads.bin").write_bytes(bytes(slots))
    assert launcher.count_threads(str(entry)) == 2
    # A slot pthread_create reserved for a thread that never ran (the create failed) has a
    # serial but no tid; proc.bin counted it ("4 threads" for 3).
    struct.pack_into("<II", slots, 128, 0, 3)
    struct.pack_into("<Q", hdr, 104, 3)
    (entry / "threads.bin").write_bytes(bytes(slots))
    (entry / "proc.bin").write_bytes(bytes(hdr))
    assert launcher.count_threads(str(entry)) == 2


def test_run_dir_that_cannot_be_replaced_is_one_error(tmp_path, monkeypatch):
    """Another user's earlier run at -o (make demo's fixed /tmp path): PermissionError from
    rmtree came out as a traceback."""
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"format_version": 1, "locus_version": "x"}))

    def refuse(path, *a, **k):
        raise PermissionError(13, "Permission denied", "meta.json")

    monkeypatch.setattr(shutil, "rmtree", refuse)
    with pytest.raises(LocusError, match="cannot replace the earlier run there: Permission denied"):
        launcher.create_run_dir(str(run), ["true"], time.localtime())


def test_default_run_dir_in_a_read_only_directory_is_one_error(tmp_path, monkeypatch):
    """`locus record -- prog` in a directory it cannot write: a PermissionError traceback."""
    import os as _os

    def refuse(path, *a, **k):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(_os, "mkdir", refuse)
    with pytest.raises(LocusError, match="cannot create the run directory .*Permission denied"):
        launcher.create_run_dir(None, ["true"], time.localtime())


@pytest.mark.parametrize("tz", ["UTC", "Asia/Kolkata", "America/St_Johns", "Europe/Paris"])
def test_start_time_is_datetimes_isoformat(monkeypatch, tz):
    """meta.json's start_time, written without importing datetime, reads as datetime wrote it
    (offsets of half hours, west of UTC)."""
    from locus.launcher import local_iso

    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        for when in (0, 1_700_000_000, 1_720_000_000):
            want = datetime.datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")
            assert local_iso(time.localtime(when)) == want
    finally:
        monkeypatch.undo()
        time.tzset()
