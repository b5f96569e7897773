"""The control FIFO of a running monitor: scripts and programs (the runtime's
`locus_label()`) write one command per line; a thread of the monitor's process carries
them out. Commands: `record FILE`, `label TEXT`, `pause`, `resume`, `interval N ms`.

The FIFO lives in a directory only its user can enter ($XDG_RUNTIME_DIR/locus, else
/tmp/locus-UID, mode 0700) and is itself mode 0600: nobody else can drive the monitor.
"""

from __future__ import annotations

import atexit
import os
import stat
import sys
import threading

from locus.errors import LocusError
from locus.monitor import recordfile
from locus.monitor.engine import _block_signals, parse_interval

MAX_LINE = 65536
COMMANDS = "record FILE, label TEXT, pause, resume, interval N ms"


def private_dir() -> str:
    """The user's directory for FIFOs, created 0700 and checked to be the user's own."""
    uid = os.getuid()
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = None
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                base = os.path.join(xdg, "locus")
        except OSError:
            pass
    d = base or f"/tmp/locus-{uid}"
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise LocusError(f"cannot create {d} for the control FIFO: {e.strerror}") from None
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise LocusError(
            f"{d} is not a directory of yours (someone else created it?): refusing to put "
            "the control FIFO there"
        )
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)
    return d


def parse_command(line: str) -> tuple[str, object]:
    """One FIFO line -> (command, argument); ("", None) for a blank line; ValueError
    with the reason for a line that is not a command."""
    text = line.strip()
    if not text:
        return "", None
    word, _, rest = text.partition(" ")
    rest = rest.strip()
    if word == "label":
        if not rest:
            raise ValueError("label needs a TEXT")
        return "label", rest
    if word == "record":
        if not rest:
            raise ValueError("record needs a FILE")
        return "record", rest
    if word in ("pause", "resume"):
        if rest:
            raise ValueError(f"{word} takes no argument")
        return word, None
    if word == "interval":
        if not rest:
            raise ValueError("interval needs N ms")
        return "interval", parse_interval(rest)
    raise ValueError(f"unknown command '{word[:40]}' (commands: {COMMANDS})")


class ControlFifo:
    """Create the FIFO (path printed by the command, not here), read it in a thread, and
    remove it at close()."""

    def __init__(self, monitor, path: str | None = None):
        self.monitor = monitor
        self.path = path or os.path.join(private_dir(), f"monitor-{os.getpid()}.fifo")
        self.handled = 0
        self._stopping = False
        try:
            if os.path.lexists(self.path):
                st = os.lstat(self.path)
                if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.getuid():
                    raise LocusError(f"{self.path} exists and is not a FIFO of yours")
                os.unlink(self.path)  # left by a process that was killed
            os.mkfifo(self.path, 0o600)
            os.chmod(self.path, 0o600)
            # Read end, then a write end of our own: the reader never sees end-of-file
            # between two writers, and close() can wake the thread through it.
            self._rfd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._wfd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise LocusError(f"control FIFO {self.path}: {e.strerror}") from None
        st = os.fstat(self._rfd)
        if not stat.S_ISFIFO(st.st_mode):
            raise LocusError(f"{self.path} is not a FIFO")
        os.set_blocking(self._rfd, True)
        self._thread = threading.Thread(target=self._run, name="locus-fifo", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # removed even if the command forgets

    def _run(self) -> None:
        _block_signals()
        buf = b""
        while not self._stopping:
            try:
                data = os.read(self._rfd, 4096)
            except OSError:
                break
            if not data:
                continue
            buf += data
            *lines, buf = buf.split(b"\n")
            if len(buf) > MAX_LINE:
                warn(f"control FIFO: a line longer than {MAX_LINE} bytes was dropped")
                buf = b""
            for raw in lines:
                if self._stopping:
                    break
                self.handle(raw.decode("utf-8", errors="replace").rstrip("\r"))

    def handle(self, line: str) -> None:
        """Carry out one line; a bad line is a warning on stderr, never an exception."""
        try:
            cmd, arg = parse_command(line)
        except ValueError as e:
            warn(f"control FIFO: {e}")
            return
        if not cmd:
            return
        m = self.monitor
        try:
            if cmd == "label":
                m.label(arg)
            elif cmd == "pause":
                m.pause()
            elif cmd == "resume":
                m.resume()
            elif cmd == "interval":
                m.set_interval(arg)
            elif cmd == "record":
                path = os.path.abspath(arg)
                recordfile.check_target(path)
                m.record_to(path)
        except LocusError as e:
            warn(f"control FIFO: {cmd}: {e}")
            return
        except OSError as e:
            warn(f"control FIFO: {cmd} {arg}: {e.strerror}")
            return
        self.handled += 1

    def close(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self.close)
        try:
            os.write(self._wfd, b"\n")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for fd in (self._rfd, self._wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def warn(text: str) -> None:
    print(f"locus: warning: {text}", file=sys.stderr)
