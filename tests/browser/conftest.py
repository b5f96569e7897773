"""Browser tier: the web UI in Debian's headless Chromium, driven by Playwright (Python).

Playwright's own browser download does not work here (and is never needed): the tests launch
/usr/bin/chromium (`make deps` installs the Debian package). A missing Chromium or Playwright
is a failure with the fix, not a skip: CI must not pass without running these tests.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("LOCUS_CHROMIUM", "/usr/bin/chromium")
VENV_LOCUS = REPO / ".venv" / "bin" / "locus"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_TIMEOUT_S = 30


def locus_argv() -> list[str]:
    if os.environ.get("LOCUS_CMD"):
        return shlex.split(os.environ["LOCUS_CMD"])
    if VENV_LOCUS.exists():
        return [str(VENV_LOCUS)]
    return [sys.executable, "-m", "locus"]


def locus_env() -> dict[str, str]:
    env = dict(os.environ)
    py = str(REPO / "python")
    env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Server:
    """A `locus monitor live` (or any command printing the same two lines) in a subprocess."""

    URL_RE = re.compile(r"locus: monitor live at (\S+)")
    FIFO_RE = re.compile(r"locus: control FIFO: (\S+)")

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=locus_env(),
            cwd=REPO,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait(self.URL_RE)
        self.fifo = self._wait(self.FIFO_RE)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def _wait(self, pattern: re.Pattern) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = pattern.search(line)
                if m:
                    return m.group(1)
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader take the last lines
                break
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(
            f"{shlex.join(self.argv)} did not print {pattern.pattern!r} "
            f"(exit {self.proc.poll()}); stderr:\n" + "\n".join(self.lines)
        )

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def control(self, line: str) -> None:
        """One command line into the control FIFO."""
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    "the server did not stop on a signal:\n" + self.stderr
                ) from None
        self._reader.join(timeout=5)
        return self.proc.returncode


@pytest.fixture(scope="session")
def locus_cmd() -> tuple[list[str], dict[str, str]]:
    """(argv of the locus command, its environment)."""
    return locus_argv(), locus_env()


@pytest.fixture
def start_live():
    """start_live(*options) -> Server running `locus monitor live --port 0 OPTIONS`; stopped
    (SIGINT, must exit 0 without a traceback) at the end of the test."""
    servers: list[Server] = []

    def start(*options: str) -> Server:
        cmd = [*locus_argv(), "monitor", "live"]
        if os.environ.get("LOCUS_LIVE_FAKE") == "1":  # the page against synthetic samples
            cmd = [sys.executable, str(Path(__file__).with_name("fake_engine.py"))]
        s = Server([*cmd, "--port", "0", *options])
        servers.append(s)
        return s

    yield start
    for s in servers:
        rc = s.stop()
        assert "Traceback" not in s.stderr, s.stderr
        assert rc == 0, f"exit {rc}:\n{s.stderr}"


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests drive Debian's Chromium. "
            "Fix: apt-get install chromium (`make deps` installs it)",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the Python package playwright is missing: `make deps` "
            "(or .venv/bin/pip install -e '.[dev]'); never `playwright install`",
            pytrace=False,
        )
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def open_page(browser):
    """open_page(url, ignore=(substrings,)) -> a Playwright page; a JavaScript error or an
    error on its console (but those containing an `ignore` text) fails the test."""
    pages = []
    errors: list[str] = []

    def open_(url: str, ignore: tuple[str, ...] = ()):
        page = browser.new_page()

        def console(m):
            if m.type == "error" and not any(s in m.text for s in ignore):
                errors.append(m.text)

        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", console)
        page.set_default_timeout(15_000)
        page.goto(url)
        pages.append(page)
        return page

    yield open_
    for p in pages:
        p.close()
    assert not errors, "errors in the page:\n" + "\n".join(errors)
