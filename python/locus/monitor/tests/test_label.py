"""The C API end to end: a program built against runtime/include/locus.h marks two phases
with locus_label() under `locus record --lens monitor`; the labels land in monitor.jsonl in
order, between samples. Without locus the weak symbol is absent; preloaded without a
monitor, the calls return -1 at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from locus.monitor import recordfile

PYDIR = Path(__file__).resolve().parents[3]
REPO = PYDIR.parent
RUNTIME = REPO / "build" / "liblocus.so"
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(
    not RUNTIME.exists() or CC is None, reason="needs build/liblocus.so and a C compiler"
)

PROGRAM = r"""
#include <stdio.h>
#include <unistd.h>
#include "locus.h"
#pragma weak locus_label

int main(void) {
  if (!locus_label) {
    puts("no locus");
    return 0;
  }
  int a = locus_label("phase 1");
  usleep(200000);
  int b = locus_label("phase 2: \"quoted\"");
  usleep(200000);
  printf("%d %d\n", a, b);
  return 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    d = tmp_path_factory.mktemp("label")
    src = d / "phases.c"
    src.write_text(PROGRAM)
    exe = d / "phases"
    subprocess.run(
        [CC, "-O1", "-I", str(REPO / "runtime" / "include"), "-o", str(exe), str(src)],
        check=True,
    )
    return exe


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(PYDIR) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("LOCUS_MONITOR_FIFO", None)
    return e


def test_labels_reach_the_recording(program, tmp_path):
    run = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "locus", "record", "--lens", "monitor", "--monitor-interval",
         "50ms", "-o", str(run), "--", str(program)],
        capture_output=True, text=True, env=env(), timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "0 0"
    _, recs = recordfile.load(str(run / "monitor.jsonl"))
    kinds = [recordfile.kind(r) for r in recs]
    labels = [r for r in recs if "label" in r]
    assert [r["label"] for r in labels] == ["phase 1", 'phase 2: "quoted"']
    assert labels[1]["t"] - labels[0]["t"] >= 0.19
    i, j = kinds.index("label"), len(kinds) - 1 - kinds[::-1].index("label")
    assert kinds[i + 1 : j].count("sample") >= 2  # samples between the two phases


def test_without_locus_and_without_a_monitor(program):
    p = subprocess.run([str(program)], capture_output=True, text=True, env=env(), timeout=30)
    assert p.stdout.strip() == "no locus"
    e = env()
    e["LD_PRELOAD"] = str(RUNTIME)
    p = subprocess.run([str(program)], capture_output=True, text=True, env=e, timeout=30)
    assert p.stdout.strip() == "-1 -1"
