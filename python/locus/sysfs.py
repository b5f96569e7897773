"""Small readers of the kernel's text interfaces shared by the launcher, the analyses and
the monitor."""

from __future__ import annotations

import glob
import os

NODE_DIR = "/sys/devices/system/node"
EVENT_SOURCES = "/sys/bus/event_source/devices"


def address_sampling_pmu() -> bool:
    """Whether the machine shows a PMU the comm lens's hw backend can sample addresses with:
    PEBS's mem-loads event (Intel; `cpu`, or `cpu_core` on hybrid parts) or IBS op (AMD).
    Without one the backend is unavailable, whatever else doctor's probe would find."""
    return any(
        os.path.exists(os.path.join(EVENT_SOURCES, d, "events", "mem-loads"))
        for d in ("cpu", "cpu_core")
    ) or os.path.isdir(os.path.join(EVENT_SOURCES, "ibs_op"))


def parse_cpulist(text: str) -> list[int]:
    """A sysfs CPU list, "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]; ValueError if malformed."""
    out: list[int] = []
    for part in text.strip().split(","):
        if part:
            a, _, b = part.partition("-")
            out += range(int(a), int(b or a) + 1)
    return out


def node_cpus(root: str = NODE_DIR) -> dict[int, list[int]]:
    """The CPUs of each NUMA node (node*/cpulist); a node whose list cannot be read has []."""
    out: dict[int, list[int]] = {}
    for path in glob.glob(os.path.join(root, "node[0-9]*")):
        try:
            nid = int(os.path.basename(path)[4:])
        except ValueError:
            continue
        try:
            with open(os.path.join(path, "cpulist")) as f:
                out[nid] = parse_cpulist(f.read())
        except (OSError, ValueError):
            out[nid] = []
    return out


def cpu_node_map(root: str = NODE_DIR) -> list[int]:
    """NUMA node of each CPU id 0..max; CPUs in no node are 0, [] without node information."""
    nodes = node_cpus(root)
    out = [0] * (max((c for cpus in nodes.values() for c in cpus), default=-1) + 1)
    for nid, cpus in nodes.items():
        for c in cpus:
            out[c] = nid
    return out
