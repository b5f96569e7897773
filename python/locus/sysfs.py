"""Small readers of the kernel's text interfaces shared by the launcher, the analyses and
the monitor."""

from __future__ import annotations


def parse_cpulist(text: str) -> list[int]:
    """A sysfs CPU list, "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]; ValueError if malformed."""
    out: list[int] = []
    for part in text.strip().split(","):
        if part:
            a, _, b = part.partition("-")
            out += range(int(a), int(b or a) + 1)
    return out
