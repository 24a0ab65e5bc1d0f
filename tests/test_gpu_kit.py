"""The offline GPU kit (issue 23): its time budget, its summary's ratios, and a clear stop without a wheelhouse.
The kit itself runs in CI as benchmarks/gpu_kit_dry_run.sh (wheelhouse, offline install, "no CUDA GPU")."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_RUN = ROOT / "benchmarks" / "gpu_first_run.sh"


def _summary_module():
    spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "benchmarks" / "gpu_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_single_gpu_steps_fit_in_eight_minutes() -> None:
    text = FIRST_RUN.read_text()
    multi = text[text.index('if [ "$GPUS" -ge 2 ]'):]
    # what runs on one GPU: up to the GPU check, then from "torch sees" on (the no-GPU branch is the dry run's)
    single = text[:text.index("GPUS=$(")] + text[text.index('say "torch sees'):text.index('if [ "$GPUS" -ge 2 ]')]
    timeouts = [int(n) for n in re.findall(r"^\s*step \w+ (\d+) ", single, flags=re.M)]
    assert len(timeouts) >= 14 and sum(timeouts) < 480, timeouts
    budget = int(re.search(r"BUDGET_S=\$\{BUDGET_S:-(\d+)\}", text).group(1))
    assert budget < 480  # and every step, the multi-GPU ones too, is clamped to what is left of it
    assert re.findall(r"^\s*step \w+ (\d+) ", multi, flags=re.M)


def test_the_wheelhouse_is_ignored_by_git() -> None:
    assert "benchmarks/wheelhouse/" in (ROOT / ".gitignore").read_text().split()


def test_the_summary_sets_each_figure_beside_its_plain_reference() -> None:
    summary = _summary_module()
    outputs = {
        "bench_quick": {"results": [
            {"kind": "matmul", "device": "cuda:0", "dtype": "bf16", "tflops_best": 600.0},
            {"kind": "matmul", "device": "cuda:0", "dtype": "bf16", "tflops_best": 650.0, "backend": "other"},
            {"kind": "bandwidth", "device": "cuda:0", "op": "copy", "gbps_best": 4000.0}]},
        "bench_transfer": {"results": [{"kind": "transfer", "op": "h2d", "memory": "pinned", "gbps_best": 50.0}]},
        "ref_matmul": {"matmul": {"bf16": {"tflops": 700.0}, "fp8": {"error": "no fp8 here"}}},
        "ref_memory": {"copy_gbps": 4000.0, "h2d_gbps": 55.0, "d2h_gbps": 54.0},
        "fit_device_0": {"device": {"capacity_bytes": 140 * 2**30, "source": "free now (NVML)"}},
        "ref_free": {"torch_free_bytes": 140 * 2**30, "nvml_free_bytes": 141 * 2**30},
        "fit_trace": {"trace": {"vs_formula": {"peak": {"traced_bytes": 90 * 2**30, "formula_bytes": 99 * 2**30}}}},
        "ref_step": {"max_memory_allocated_bytes": 100 * 2**30},
        "sampler": {"seconds": 10, "ours": {"samples": 40, "utilization_pct": 99.0},
                    "plain": {"samples": 40, "utilization_pct": 100.0}},
    }
    rows = {r["what"]: r for r in summary.comparisons(outputs)}
    assert rows["matmul bf16"]["ours"] == 650.0 and rows["matmul bf16"]["ratio"] == pytest.approx(650 / 700, abs=1e-3)
    assert rows["matmul fp8"]["ratio"] is None and rows["matmul fp8"]["note"] == "no fp8 here"
    assert rows["HBM device copy"]["ratio"] == 1.0
    assert rows["H2D pinned"]["ratio"] == pytest.approx(50 / 55, abs=1e-3)
    assert rows["fit --trace peak vs real bf16 step (max_memory_allocated)"]["ratio"] == 0.9
    assert rows["fit formula peak vs real bf16 step (max_memory_allocated)"]["ratio"] == 0.99
    assert rows["live sampler under load: mean utilization_pct"]["ratio"] == 0.99
    assert "matmul tf32" not in rows  # nothing on either side: no row


def test_the_summary_files_and_their_count(tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text("install\t3\t60\tok\nenv\t2\t15\tFAILED (rc 1)\n")
    (work / "env.out").write_text(json.dumps({"gpus": []}))
    done = subprocess.run([os.environ.get("PYTHON", "python"), str(ROOT / "benchmarks" / "gpu_summary.py"), str(work),
                           str(out), "470"], capture_output=True, text=True, check=True)
    report = json.loads((out / "summary.json").read_text())
    assert report["passed"] is False and report["seconds_total"] == 5 and report["timeouts_total_s"] == 75
    assert sorted(p.name for p in out.iterdir()) == ["outputs.json", "summary.json", "summary.txt"]
    assert "FAILED (rc 1)" in done.stdout


def test_without_a_wheelhouse_the_first_run_says_how_to_build_one(tmp_path) -> None:
    env = {**os.environ, "WHEELHOUSE": str(tmp_path / "none"), "OUT": str(tmp_path / "out"),
           "PYTHON": os.environ.get("PYTHON", "python3")}
    done = subprocess.run(["bash", str(FIRST_RUN), "--dry-run"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    log = (tmp_path / "out" / "steps.log").read_text()
    assert "gpu_wheels.sh" in log and "did not install" in done.stderr
    assert len(list((tmp_path / "out").iterdir())) <= 8


def test_text_steps_keep_their_last_lines(tmp_path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text("pytest_gpu\t30\t60\tok\n")
    (work / "pytest_gpu.out").write_text("....\n\n12 passed, 3 skipped in 20.1s\n")
    subprocess.run([os.environ.get("PYTHON", "python"), str(ROOT / "benchmarks" / "gpu_summary.py"), str(work),
                    str(out), "470"], capture_output=True, text=True, check=True)
    report = json.loads((out / "summary.json").read_text())
    assert report["text_tails"]["pytest_gpu"][-1] == "12 passed, 3 skipped in 20.1s"
    assert "12 passed, 3 skipped" in (out / "summary.txt").read_text()
