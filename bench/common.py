"""Shared by the bench scripts: paths, the locus command, results files."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
CACHE = BENCH / ".cache"  # inputs and scratch runs, never committed
RESULTS = BENCH / "results"


def locus_argv() -> list[str]:
    """$LOCUS_CMD (e.g. an installed `locus`), else the venv's console script, else sources."""
    if os.environ.get("LOCUS_CMD"):
        return shlex.split(os.environ["LOCUS_CMD"])
    venv = REPO / ".venv" / "bin" / "locus"
    if venv.exists():
        return [str(venv)]
    return [sys.executable, "-m", "locus"]


def locus_env() -> dict[str, str]:
    env = dict(os.environ)
    py = str(REPO / "python")
    env["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH") else "") + py
    return env


def git_rev() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stamp() -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
        "host": os.uname().nodename,
        "cpus": os.cpu_count(),
        # Other work on the host moves every ratio (free-running threads overlap less, the
        # exact oracle's transfers drop): the 1, 5 and 15 min load averages, at the start and
        # (write_result) at the end, so that a result can be read against its conditions.
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }


def write_result(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    data = {**data, "load_end": [round(x, 2) for x in os.getloadavg()]}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def append_history(line: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "history.md"
    if not path.exists():
        path.write_text(
            "# Benchmark history\n\nOne line per `bench/` run: date, git revision, results.\n\n"
        )
    with open(path, "a") as f:
        f.write(line.rstrip() + "\n")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*(str(x) for x in r)) for r in rows]
    return "\n".join(lines)


def overhead(progs: dict, n: int, timed, label: str, least: dict | None = None, floor=None) -> dict:
    """Wall time and peak RSS of each program (name -> argv; skipped when not installed)
    plain and under locus, `n` interleaved runs each (at least least[name] for a program
    whose run time is bimodal: a median of 5 then reads one mode or the other), medians and
    ratios. `timed(argv, under)` returns (wall s, maxrss kB) of one run, under locus when
    `under` is true, or (wall s, maxrss kB, the program's own time s or None): then
    `program_ratio` is the ratio of the times the program printed, its slowdown without
    locus's fixed start and stop. `floor(argv)`, when given, returns the peak RSS (kB) of one
    run with an empty library preloaded, interleaved with the others: `floor_maxrss_ratio`,
    what any preloaded tool costs before it does anything."""
    out = {}
    for name, argv in progs.items():
        if not shutil.which(argv[0]):
            continue
        plain, tool, empty = [], [], []
        rounds = max(n, (least or {}).get(name, 0))
        for _ in range(rounds):
            plain.append(timed(argv, False))
            tool.append(timed(argv, True))
            if floor is not None:
                empty.append(floor(argv))
        pw, tw = median([x[0] for x in plain]), median([x[0] for x in tool])
        pr, tr = median([x[1] for x in plain]), median([x[1] for x in tool])
        out[name] = {
            "plain_wall_s": pw,
            f"{label}_wall_s": tw,
            "wall_ratio": tw / pw,
            "plain_maxrss_kb": pr,
            f"{label}_maxrss_kb": tr,
            "maxrss_ratio": tr / pr,
            # What locus adds is mostly a fixed amount (its code, the decoder, tables, record
            # pages): the ratio of a small program reads it as a large share.
            "maxrss_added_kb": tr - pr,
            "rounds": rounds,
            # The plain runs' own spread: a ratio of medians means little where the program
            # alone varies by half (threads sharing CPUs, a bimodal benchmark).
            "plain_wall_range": [min(x[0] for x in plain), max(x[0] for x in plain)],
        }
        if empty:
            out[name].update(
                floor_maxrss_kb=median(empty),
                floor_maxrss_ratio=median(empty) / pr,
                floor_maxrss_added_kb=median(empty) - pr,
            )
        own = ""
        pp = [x[2] for x in plain if len(x) > 2 and x[2]]
        tp = [x[2] for x in tool if len(x) > 2 and x[2]]
        if len(pp) == len(plain) and len(tp) == len(tool):
            out[name].update(
                plain_program_s=median(pp),
                **{f"{label}_program_s": median(tp)},
                program_ratio=median(tp) / median(pp),
            )
            own = f" (program's own time x{median(tp) / median(pp):.3f})"
        fl = f", empty preload x{median(empty) / pr:.3f}" if empty else ""
        print(
            f"  {name}: time x{tw / pw:.3f}{own} rss x{tr / pr:.3f} ({tr - pr:+.0f} KiB{fl})",
            flush=True,
        )
    return out


def wall_under(argv: list[str], lens: str | None, run: Path) -> float:
    """Wall seconds of argv, plain (lens None) or under `locus record --lens lens -o run`
    (run replaced)."""
    shutil.rmtree(run, ignore_errors=True)
    cmd = argv if lens is None else [*locus_argv(), "record", "-o", str(run), "--lens", lens, "--"]
    cmd = cmd if lens is None else [*cmd, *argv]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, env=locus_env())
    return time.monotonic() - t0
