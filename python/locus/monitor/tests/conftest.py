"""Captured /proc and /sys files (data/, made by data/capture.py) staged as a sensor root:
`stage` copies snapshot a, `advance` overwrites the same files in place with snapshot b, so
a sensor that keeps its files open reads the second snapshot exactly as it would read the
live kernel's next values."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"


class Captured:
    def __init__(self, root: Path, name: str):
        self.root = root
        self.name = name

    def advance(self, snapshot: str = "b") -> None:
        src = DATA / self.name / snapshot
        for f in src.rglob("*"):
            if f.is_file():
                dest = self.root / f.relative_to(src)
                with open(dest, "r+b") as out:  # same inode: open descriptors see it
                    out.truncate(0)
                    out.write(f.read_bytes())


@pytest.fixture
def captured(tmp_path):
    def make(name: str) -> Captured:
        root = tmp_path / name
        shutil.copytree(DATA / name / "a", root)
        return Captured(root, name)

    return make
