"""The monitor's file format (docs/monitor.md): JSON lines, a header first, then samples,
labels, interval changes and pause/resume marks, each stamped with Unix time `t`.

Written by the engine as it samples (so it can be followed while it grows and a killed
monitor leaves a readable file); read back here by tests, reports and the web UI's loader.
"""

from __future__ import annotations

import json
import os

from locus.errors import LocusError

FORMAT = "locus-monitor"
VERSION = 1


def is_recording(path: str) -> bool:
    """True for a file that starts like a monitor recording."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head.startswith(b'{"format": "locus-monitor"')


def check_target(path: str) -> None:
    """Refuse to overwrite anything but an empty file or an earlier recording: a typo in
    -o must never destroy a user's file."""
    if os.path.isdir(path):
        raise LocusError(f"{path}: is a directory", 2)
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise LocusError(f"{path}: no such directory {d}", 2)
    if os.path.lexists(path) and os.path.getsize(path) > 0 and not is_recording(path):
        raise LocusError(
            f"{path}: exists and is not a locus monitor recording; choose another file", 2
        )


def read_records(path: str):
    """The records of a recording in order, header included; a last line cut short by a
    killed writer is skipped, a bad line anywhere else is an error."""
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if bad:
                raise LocusError(f"{path}:{bad}: not a JSON record")
            try:
                yield json.loads(line)
            except ValueError:
                bad = n


def load(path: str) -> tuple[dict, list[dict]]:
    """(header, every later record) of a recording; LocusError if it is not one."""
    it = read_records(path)
    try:
        header = next(it)
    except StopIteration:
        raise LocusError(f"{path}: empty, not a locus monitor recording") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise LocusError(f"{path}: not a locus monitor recording")
    if header.get("version") != VERSION:
        raise LocusError(f"{path}: monitor format version {header.get('version')} is not supported")
    return header, list(it)


def kind(record: dict) -> str:
    """sample | label | interval | paused | header."""
    if "v" in record:
        return "sample"
    if "label" in record:
        return "label"
    if "interval_ms" in record and "t" in record and "format" not in record:
        return "interval"
    if "paused" in record:
        return "paused"
    return "header" if "format" in record else "unknown"
