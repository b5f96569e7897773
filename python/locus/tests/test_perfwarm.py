"""The launcher's perf warm-up (perfwarm.py): when it starts, and that it leaves nothing open."""

import os

import pytest

from locus import perfwarm


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["record", "--lens", "comm", "--", "prog"], True),
        (["record", "--lens=locks,numa", "--", "prog"], True),
        (["record", "--lens", "locks", "--lens", "comm", "--", "prog"], True),
        (["record", "--lens", "comm", "--backend", "soft", "--", "prog"], True),
        (["record", "--lens", "comm", "--backend=exact", "--", "prog"], False),
        (["record", "--", "prog", "--lens", "comm"], False),  # the program's own words
        (["record", "--", "prog"], False),  # default lens: locks
        (["record", "--lens", "locks", "--", "prog"], False),
        (["report", "--lens", "comm", "run"], False),
        ([], False),
    ],
)
def test_wanted(args, want):
    assert perfwarm.wanted(args) is want


def perf_fds() -> set[str]:
    """This process's perf event descriptors (other tests' files come and go meanwhile)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[perf_event]":
                out.add(fd)
        except OSError:
            pass  # the listing's own descriptor, closed since
    return out


def test_start_then_stop_leaves_no_descriptor():
    perfwarm.stop()  # (none should be under way)
    before = perf_fds()
    perfwarm.start()
    perfwarm.start()  # a second start while under way does nothing
    perfwarm._thread.join()
    opened = perfwarm._fd
    if opened >= 0:  # where perf_event_open is allowed (root, or paranoid <= 2)
        assert perf_fds() == before | {str(opened)}
    perfwarm.stop()
    assert perfwarm._fd == -1 and perfwarm._thread is None
    assert perf_fds() == before


def test_a_failed_record_leaves_no_descriptor(tmp_path):
    """`locus record --lens comm` that fails before the program starts (here: no such
    program) starts the warm-up in cli.main and must close it."""
    from locus import cli

    perfwarm.stop()
    before = perf_fds()
    rc = cli.main(["record", "-o", str(tmp_path / "r"), "--lens", "comm", "--", "/nonexistent"])
    assert rc != 0
    assert perfwarm._thread is None and perf_fds() == before
