#!/usr/bin/env python3
"""Capture the files the monitor's sensors read, twice, with some work in between, into
DIR/a/ and DIR/b/ (same relative paths as under /). The sensor tests read these captures
through the sensors' `root` and assert the exact numbers they hold, so a new capture means
new expected numbers: the captures here were made once, on the development machine (host/)
and in the 2-node NUMA guest (numavm/: `scripts/numavm --memory-nodes 1 -- python3
capture.py numavm`).

Between the snapshots: 64 MiB allocated and touched (nr_free_pages falls: a negative rate),
a few processes started (context switches, forks).
Usage: capture.py DIR
"""

import glob
import os
import subprocess
import sys
import time

PATTERNS = (
    "/proc/vmstat",
    "/proc/stat",
    "/proc/pressure/*",
    "/sys/devices/system/node/node*/numastat",
    "/sys/devices/system/node/node*/meminfo",
    "/sys/devices/system/cpu/online",
)


def snapshot(out: str) -> None:
    for pat in PATTERNS:
        for path in sorted(glob.glob(pat)):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue  # e.g. PSI disabled: the file exists but cannot be read
            dest = os.path.join(out, path.lstrip("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)


def main() -> None:
    out = sys.argv[1]
    snapshot(os.path.join(out, "a"))
    block = bytearray(64 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    for _ in range(5):
        subprocess.run(["true"])
    time.sleep(0.2)
    snapshot(os.path.join(out, "b"))
    del block


if __name__ == "__main__":
    main()
