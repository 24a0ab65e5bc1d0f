"""How long the test suite takes, as the README runs it: wall clock, the CPU time of pytest and all its
workers (user + sys), and the load average before and after, since on a shared machine the wall clock
says as much about the others as about the suite.

    python benchmarks/suite_time.py              # pytest -n 2 --dist loadfile (the whole suite)
    python benchmarks/suite_time.py --not-slow   # pytest -n 2 -m 'not slow' (the README's quick subset)

The README's figure for the quick subset ("under 3 min on 2 cores") is this script's wall line.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_argv(not_slow: bool) -> list[str]:
    """The README's command lines, unchanged."""
    if not_slow:
        return [sys.executable, "-m", "pytest", "-n", "2", "-m", "not slow", "-q"]
    return [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-q"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--not-slow", action="store_true", help="the quick subset (-m 'not slow')")
    args = parser.parse_args()
    argv = pytest_argv(args.not_slow)
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    closing = next((line for line in reversed(done.stdout.splitlines()) if line.strip()), "(no output)")
    print(f"command: {' '.join(argv[2:])}")
    print(f"pytest: {closing}")
    print(f"wall {wall / 60:.1f} min ({wall:.0f} s); CPU {children.ru_utime:.0f} s user + {children.ru_stime:.0f} s sys "
          f"on {os.cpu_count()} cores; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
