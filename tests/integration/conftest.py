"""End-to-end tests: record real programs with `locus record`, assert on `locus report --format
json` against each program's own ground truth (workloads/README.md).

Everything runs through the `locus` command exactly as a user runs it. When a piece is not
built (the runtime, the venv, the analysis), the tests that need it are skipped with a reason
that says what to build; `make test` builds everything, so in CI nothing is skipped.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBLOCUS = REPO / "build" / "liblocus.so"
WORKLOADS = REPO / "workloads"
VENV_LOCUS = REPO / ".venv" / "bin" / "locus"

# Every recording gets this long; a hung target must fail one test, not the suite.
TIMEOUT_S = 120


def run_group(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own: on a timeout the whole group is killed, the
    recorded program too, not only `locus` (an orphan left spinning once slowed every test
    and benchmark after it)."""
    check = kw.pop("check", False)
    if kw.pop("capture_output", False):
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    data = kw.pop("input", None)
    if data is not None:
        kw["stdin"] = subprocess.PIPE
    with subprocess.Popen(argv, start_new_session=True, **kw) as p:
        try:
            out, err = p.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
    proc = subprocess.CompletedProcess(argv, p.returncode, out, err)
    if check:
        proc.check_returncode()
    return proc


def locus_argv() -> list[str]:
    """The command under test: $LOCUS_CMD (e.g. an installed `locus`), else the venv's
    console script, else the sources."""
    if os.environ.get("LOCUS_CMD"):
        return shlex.split(os.environ["LOCUS_CMD"])
    if VENV_LOCUS.exists():
        return [str(VENV_LOCUS)]
    return [sys.executable, "-m", "locus"]


def locus_env() -> dict[str, str]:
    env = dict(os.environ)
    if not VENV_LOCUS.exists() and not os.environ.get("LOCUS_CMD"):
        py = str(REPO / "python")
        env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
    assert "Traceback" not in err, err


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The last `locus...` line of stderr (a refusal is one such line), no traceback."""
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("locus")]
    assert lines, err
    return lines[-1]


def parse_truth(stderr: str | bytes) -> dict:
    """The workload's ground truth: the last stderr line that is a JSON object with a
    'workload' key (locus's own lines on stderr are ignored)."""
    text = stderr if isinstance(stderr, str) else stderr.decode(errors="replace")
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"workload"' in line:
            return json.loads(line)
    raise AssertionError(f"no ground-truth line on stderr:\n{text}")


def is_lock_named(row_name: str, name: str) -> bool:
    """The analysis may decorate a symbol (`queue_lock (sharequeue)`, `queue_lock+8`): a row
    stands for `name` when its name is `name` followed by nothing or a non-identifier char."""
    if not row_name.startswith(name):
        return False
    rest = row_name[len(name) :]
    return rest == "" or not (rest[0].isalnum() or rest[0] == "_")


def lock_rows(report: dict, name: str) -> list[dict]:
    """All rows of lenses.locks.locks that stand for the lock called `name`."""
    rows = report["lenses"]["locks"]["locks"]
    return [r for r in rows if is_lock_named(str(r.get("name") or ""), name)]


def lock_acquisitions(report: dict, name: str) -> int:
    return sum(int(r["acquisitions"]) for r in lock_rows(report, name))


def unprivileged() -> list[str]:
    """The prefix that runs a command as a user without privileges: none when the tests
    already run as one, else setpriv to user nobody (skips when that cannot be done, or when
    nobody cannot read the checkout)."""
    import pwd

    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody to run as")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is not installed")
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    if subprocess.run([*argv, "test", "-r", locus_argv()[0]]).returncode != 0:
        pytest.skip("the checkout is not readable by user nobody")
    return argv


class Locus:
    """Runs the `locus` command and the workloads; carries the helpers for the tests (with
    pytest's importlib import mode, test modules cannot import conftest)."""

    truth = staticmethod(parse_truth)
    lock_rows = staticmethod(lock_rows)
    lock_acquisitions = staticmethod(lock_acquisitions)
    no_traceback = staticmethod(no_traceback)
    one_error_line = staticmethod(one_error_line)
    unprivileged = staticmethod(unprivileged)

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.argv = locus_argv()
        self.env = locus_env()
        self._runs = 0

    def workload(self, name: str) -> str:
        return str(WORKLOADS / "build" / name)

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("env", self.env)
        kw.setdefault("cwd", str(self.tmp))
        return run_group([*self.argv, *args], kw.pop("timeout", TIMEOUT_S), **kw)

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        kw.setdefault("env", self.env)
        kw.setdefault("cwd", str(self.tmp))
        return subprocess.Popen([*self.argv, *args], **kw)

    def new_dir(self, stem: str = "run") -> Path:
        self._runs += 1
        return self.tmp / f"{stem}{self._runs}"

    def record(
        self, cmd: list[str], options: tuple[str, ...] = (), check: bool = True, **kw
    ) -> tuple[subprocess.CompletedProcess, Path]:
        out = self.new_dir()
        proc = self.run("record", "-o", str(out), *options, "--", *cmd, **kw)
        if check:
            assert proc.returncode == 0, (proc.returncode, proc.stderr)
        return proc, out

    def report_raw(self, run: Path, *extra: str) -> subprocess.CompletedProcess:
        """`locus report RUN --format json EXTRA`, whatever its exit status."""
        proc = self.run("report", str(run), "--format", "json", *extra)
        err = proc.stderr.decode(errors="replace")
        if proc.returncode != 0 and "not available in this build" in err:
            pytest.skip("`locus report` is not implemented yet (python/locus/report.py)")
        return proc

    def report(self, run: Path, *extra: str) -> dict:
        proc = self.report_raw(run, *extra)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        no_traceback(proc)
        return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def built_workloads() -> Path:
    """Builds workloads/ once per session (a no-op when up to date)."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and a C compiler are needed to build workloads/")
    proc = subprocess.run(
        ["make", "-s", "-C", str(WORKLOADS)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return WORKLOADS / "build"


@pytest.fixture
def locus(tmp_path: Path, built_workloads: Path) -> Locus:
    if not LIBLOCUS.exists():
        pytest.skip(f"{LIBLOCUS.relative_to(REPO)} is not built: run `make build`")
    probe = subprocess.run(
        [*locus_argv(), "--version"], capture_output=True, env=locus_env(), timeout=60
    )
    if probe.returncode != 0:
        pytest.skip("the locus command does not start: run `make deps` (creates .venv)")
    return Locus(tmp_path)


def wait_for_line(stream, needle: bytes, timeout: float) -> bytes:
    """Reads `stream` (a pipe) line by line until a line contains `needle`."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    seen = b""
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = stream.readline()
        if not line:
            break
        seen += line
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} not seen within {timeout}s; got {seen!r}")


Locus.wait_for_line = staticmethod(wait_for_line)
