"""Our STREAM-like copy and triad against a small C/OpenMP STREAM-style program, side by side.

Compiles benchmarks/stream_reference.c (gcc -O3 -fopenmp -march=native) into a temporary
directory, runs it on arrays of the same size as ours (>= 4x the last-level cache), and prints the
best GB/s of each with STREAM byte counting, interleaving the two so a busy machine hurts both
alike. Goal: our triad >= 0.90 of the C reference.

    python benchmarks/triad_vs_stream.py [--rounds 3] [--ntimes 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tutor.bench.bandwidth import memory_bandwidth, stream_array_elements  # noqa: E402
from tutor.bench.environment import cpu_llc_bytes, load_machine  # noqa: E402
from tutor.bench.timing import usable_cpu_count  # noqa: E402

GOAL = 0.90


def compile_reference(workdir: Path) -> Path:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise SystemExit("no C compiler (gcc) found")
    source = Path(__file__).with_name("stream_reference.c")
    binary = workdir / "stream_reference"
    subprocess.run([compiler, "-O3", "-fopenmp", "-march=native", str(source), "-o", str(binary)], check=True)
    return binary


def run_reference(binary: Path, elements: int, ntimes: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(usable_cpu_count())}
    out = subprocess.run([str(binary), str(elements), str(ntimes)], check=True, capture_output=True, text=True, env=env)
    figures = {}
    for line in out.stdout.splitlines():
        key, value = line.split()
        figures[key] = float(value)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ntimes", type=int, default=10)
    args = parser.parse_args()
    machine = load_machine()
    llc, source = cpu_llc_bytes(machine)
    import psutil

    elements, note = stream_array_elements(llc, int(psutil.virtual_memory().available))
    print(f"arrays: {elements:,} doubles = {elements * 8 / 2**20:.0f} MiB each ({source}: {llc / 2**20:.0f} MiB)"
          + (f"; {note}" if note else ""))
    best = {"ours copy": 0.0, "ours triad": 0.0, "C copy": 0.0, "C triad": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        binary = compile_reference(Path(tmp))
        for round_number in range(args.rounds):
            reference = run_reference(binary, elements, args.ntimes)
            ours = {r.op: r for r in memory_bandwidth("cpu", budget_s=60.0, machine=machine, ops=("copy", "triad"),
                                                      array_elements=elements)}
            best["C copy"] = max(best["C copy"], reference["copy_gbps"])
            best["C triad"] = max(best["C triad"], reference["triad_gbps"])
            best["ours copy"] = max(best["ours copy"], ours["copy"].gbps_best)
            best["ours triad"] = max(best["ours triad"], ours["triad"].gbps_best)
            print(f"round {round_number + 1}: C copy {reference['copy_gbps']:.2f}, triad {reference['triad_gbps']:.2f} | "
                  f"ours copy {ours['copy'].gbps_best:.2f}, triad {ours['triad'].gbps_best:.2f} GB/s "
                  f"({int(reference['threads'])} OpenMP threads)")
    print()
    print(f"{'kernel':8} {'ours GB/s':>10} {'C GB/s':>10} {'ratio':>7}")
    for kernel in ("copy", "triad"):
        ratio = best[f"ours {kernel}"] / best[f"C {kernel}"]
        print(f"{kernel:8} {best[f'ours {kernel}']:10.2f} {best[f'C {kernel}']:10.2f} {ratio:7.3f}")
    ratio = best["ours triad"] / best["C triad"]
    print(f"\ntriad ours / C reference = {ratio:.3f} (goal >= {GOAL}) -> {'MET' if ratio >= GOAL else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
