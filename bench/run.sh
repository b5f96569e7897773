#!/bin/sh
# Runs every benchmark; results go to bench/results/ (committed) and a line per benchmark is
# appended to bench/results/history.md. Extra arguments go to overhead.py (e.g. -n 5).
set -e
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
py="$repo/.venv/bin/python"
[ -x "$py" ] || py=python3
"$py" "$here/overhead.py" "$@"
"$py" "$here/analysis_speed.py"
"$py" "$here/accuracy.py"
"$py" "$here/spawn.py"
"$py" "$here/alloc.py"
"$py" "$here/threads.py"
"$py" "$here/signal_floor.py"
