"""`locus monitor record -o FILE [-- CMD ARGS]`: record the sensors to a file until
interrupted, or for the lifetime of CMD (then exit with CMD's status, 128+N for signal N).
CMD gets the control FIFO's path in LOCUS_MONITOR_FIFO.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from locus.errors import LocusError
from locus.monitor import recordfile
from locus.monitor.engine import Monitor, interval_ms
from locus.monitor.fifo import ControlFifo
from locus.monitor.stat import count_events, wait_for_signal


def cmd_record(ns) -> int:
    from locus import launcher

    cmd = list(ns.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
        if not cmd:
            raise LocusError("no command after -- (or leave out -- to record until Ctrl-C)", 2)
    if cmd and cmd[0].startswith("-") and cmd[0] != "-":
        raise LocusError(f"unrecognized arguments: {cmd[0]} (options go before --)", 2)
    exe = launcher.resolve_command(cmd[0]) if cmd else None
    recordfile.check_target(ns.output)
    mon = Monitor(ns.interval, ns.events)
    try:
        mon.record_to(ns.output)
    except OSError as e:
        mon.stop()
        raise LocusError(f"{ns.output}: {e.strerror}", 2) from None
    fifo = ControlFifo(mon)
    status = 0
    try:
        print(f"locus: control FIFO: {fifo.path}", file=sys.stderr)
        for line in mon.absent_lines():
            print(line, file=sys.stderr)
        print(
            f"locus: monitor: {count_events(mon)} every {interval_ms(mon.interval_s)} ms "
            f"to {ns.output}" + ("" if cmd else "; Ctrl-C stops"),
            file=sys.stderr,
        )
        mon.start()
        if cmd:
            status = run_command(exe, cmd, fifo.path)
        else:
            wait_for_signal(threading.Event())
    finally:
        mon.stop(final_sample=True)
        fifo.close()
    print(f"locus: monitor: {mon.samples} samples written to {ns.output}", file=sys.stderr)
    return status


def run_command(exe: str, cmd: list[str], fifo_path: str) -> int:
    """Run CMD with LOCUS_MONITOR_FIFO set, forwarding the signals locus gets; its status."""
    from locus import launcher

    env = dict(os.environ)
    env["LOCUS_MONITOR_FIFO"] = fifo_path
    try:
        child = subprocess.Popen([exe, *cmd[1:]], env=env)
    except OSError as e:
        raise LocusError(f"{cmd[0]}: {e.strerror}", 126) from None
    forwarder = launcher.SignalForwarder(child)
    try:
        forwarder.block()
        child.wait()
    finally:
        if child.returncode is None:
            child.kill()
            child.wait()
        forwarder.restore()
    return launcher.exit_status(child.returncode)[0]
